//! The environment a process gets: defaults, then the user's identity, then the sandbox's
//! environment, then the process's own. Pure.

use std::collections::BTreeMap;

use crate::users::UserInfo;

/// `PATH` when neither the sandbox nor the process sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// `TERM` for processes on a pseudo-terminal, unless they set one.
pub const DEFAULT_TERM: &str = "xterm-256color";

/// Builds the full environment; later layers override earlier ones.
pub fn build_env(
    user: &UserInfo,
    sandbox_env: &BTreeMap<String, String>,
    process_env: &BTreeMap<String, String>,
    pty: bool,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), DEFAULT_PATH.to_owned());
    env.insert("HOME".to_owned(), user.home.clone());
    env.insert("USER".to_owned(), user.name.clone());
    env.insert("LOGNAME".to_owned(), user.name.clone());
    env.insert("SHELL".to_owned(), user.shell.clone());
    if pty {
        env.insert("TERM".to_owned(), DEFAULT_TERM.to_owned());
    }
    for (k, v) in sandbox_env.iter().chain(process_env) {
        env.insert(k.clone(), v.clone());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_override_in_order() {
        let user = UserInfo {
            name: "u".into(),
            uid: 1,
            gid: 1,
            groups: vec![1],
            home: "/home/u".into(),
            shell: "/bin/bash".into(),
        };
        let sandbox = BTreeMap::from([
            ("A".to_owned(), "s".to_owned()),
            ("PATH".to_owned(), "/x".to_owned()),
        ]);
        let process = BTreeMap::from([("A".to_owned(), "p".to_owned())]);
        let env = build_env(&user, &sandbox, &process, false);
        assert_eq!(env["A"], "p");
        assert_eq!(env["PATH"], "/x");
        assert_eq!(env["HOME"], "/home/u");
        assert_eq!(env["LOGNAME"], "u");
        assert!(!env.contains_key("TERM"));
        assert_eq!(
            build_env(&user, &sandbox, &process, true)["TERM"],
            DEFAULT_TERM
        );
    }
}

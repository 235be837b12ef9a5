//! What SPACE adds to an image's tree so it boots as a sandbox. The guest daemon comes from
//! the initramfs and the sandbox CA is installed at run time (`spaced`'s `trust`), so the
//! tree only needs:
//! - the mount points the initramfs and the daemon use (`/dev`, `/run`, `/proc`, `/sys`,
//!   `/tmp`), as real directories;
//! - a `root` account, and the sandbox user `user` (uid 1000, or the first free uid above)
//!   with a home directory, unless the image has one: the E2B SDKs and SPACE's own default
//!   run commands as `user`;
//! - the image's own `User`, resolved to an account name (a numeric uid without a passwd
//!   entry gets one);
//! - the image's `WorkingDir`, if the layers lack it.
//!
//! It runs in the unpacker (see [`super::jail`]), on the tree [`super::unpack`] built, and
//! reaches every file through the same beneath-the-root resolution.

use serde::{Deserialize, Serialize};

use crate::oci::unpack::{UnpackError, Unpacker};

/// Largest `/etc/passwd` or `/etc/group` read.
const MAX_DB: u64 = 1 << 20;
/// The sandbox user's name.
pub const SANDBOX_USER: &str = "user";

/// What the plumbing did and found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plumbed {
    /// The account commands run as by default: the image's `User` if it set one, else the
    /// sandbox user.
    pub default_user: String,
    /// Whether the sandbox user was added (false: the image had one).
    pub added_user: bool,
    /// The shell the sandbox user got (`/sbin/nologin` when the image has none: commands
    /// still run, as argv).
    pub shell: String,
}

fn plumbing_err(detail: impl Into<String>) -> UnpackError {
    UnpackError::BadEntry {
        layer: 0,
        path: "(plumbing)".into(),
        detail: detail.into(),
    }
}

/// One `/etc/passwd` line's fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Home directory.
    pub home: String,
}

/// Parses passwd text (malformed lines skipped).
pub fn parse_passwd(text: &str) -> Vec<Account> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 || f[0].is_empty() {
                return None;
            }
            Some(Account {
                name: f[0].to_owned(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: f[5].to_owned(),
            })
        })
        .collect()
}

/// Parses group text into (name, gid).
pub fn parse_group(text: &str) -> Vec<(String, u32)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 3 || f[0].is_empty() {
                return None;
            }
            Some((f[0].to_owned(), f[2].parse().ok()?))
        })
        .collect()
}

/// The lines to append so `passwd`/`group` have a root account and the sandbox user, and the
/// image's `User` resolved: (passwd additions, group additions, the sandbox user's account
/// if added, default user). Pure, for testing.
pub fn accounts_to_add(
    passwd: &str,
    group: &str,
    image_user: Option<&str>,
    shell: &str,
) -> Result<(String, String, Option<Account>, String), UnpackError> {
    let mut accounts = parse_passwd(passwd);
    let groups = parse_group(group);
    let mut add_passwd = String::new();
    let mut add_group = String::new();
    if !accounts.iter().any(|a| a.name == "root") {
        add_passwd.push_str(&format!("root:x:0:0:root:/root:{shell}\n"));
        accounts.push(Account {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
        });
        if !groups.iter().any(|(n, _)| n == "root") {
            add_group.push_str("root:x:0:\n");
        }
    }
    let mut added = None;
    if !accounts.iter().any(|a| a.name == SANDBOX_USER) {
        let uid_free = |u: u32| !accounts.iter().any(|a| a.uid == u);
        let gid_free = |g: u32| !groups.iter().any(|(_, x)| *x == g);
        let uid = (1000..60000)
            .find(|u| uid_free(*u))
            .ok_or_else(|| plumbing_err("no free uid for the sandbox user"))?;
        let gid = match groups.iter().find(|(n, _)| n == SANDBOX_USER) {
            Some((_, g)) => *g,
            None => {
                let g = if gid_free(uid) {
                    uid
                } else {
                    (1000..60000)
                        .find(|g| gid_free(*g))
                        .ok_or_else(|| plumbing_err("no free gid for the sandbox user"))?
                };
                add_group.push_str(&format!("{SANDBOX_USER}:x:{g}:\n"));
                g
            }
        };
        add_passwd.push_str(&format!(
            "{SANDBOX_USER}:x:{uid}:{gid}:SPACE sandbox user:/home/{SANDBOX_USER}:{shell}\n"
        ));
        let a = Account {
            name: SANDBOX_USER.into(),
            uid,
            gid,
            home: format!("/home/{SANDBOX_USER}"),
        };
        accounts.push(a.clone());
        added = Some(a);
    }
    let default_user = match image_user {
        None => SANDBOX_USER.to_owned(),
        Some(u) => {
            let name = u.split(':').next().unwrap_or(u);
            if let Ok(uid) = name.parse::<u32>() {
                match accounts.iter().find(|a| a.uid == uid) {
                    Some(a) => a.name.clone(),
                    None => {
                        let gid = u
                            .split(':')
                            .nth(1)
                            .and_then(|g| g.parse::<u32>().ok())
                            .unwrap_or(uid);
                        if uid > 65_535 || gid > 65_535 {
                            return Err(plumbing_err(format!(
                                "the image's User {u:?} is outside uids 0-65535"
                            )));
                        }
                        let n = format!("u{uid}");
                        add_passwd.push_str(&format!("{n}:x:{uid}:{gid}::/:/sbin/nologin\n"));
                        n
                    }
                }
            } else if accounts.iter().any(|a| a.name == name) {
                name.to_owned()
            } else {
                return Err(plumbing_err(format!(
                    "the image's User {name:?} has no /etc/passwd entry"
                )));
            }
        }
    };
    Ok((add_passwd, add_group, added, default_user))
}

/// Adds the plumbing to the tree.
pub fn apply(
    tree: &Unpacker,
    image_user: Option<&str>,
    workdir: Option<&str>,
) -> Result<Plumbed, UnpackError> {
    for (dir, mode) in [
        ("dev", 0o755),
        ("run", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("etc", 0o755),
        ("home", 0o755),
    ] {
        tree.ensure_real_dir(dir, mode)?;
    }
    // The image's `WorkingDir` is where processes start: made (root's, 0755) if the layers
    // did not, as container runtimes do.
    if let Some(dir) = workdir {
        tree.ensure_dir(dir)?;
    }
    let shell = ["bin/bash", "bin/sh", "usr/bin/bash", "usr/bin/sh"]
        .into_iter()
        .find(|s| tree.is_executable_file(s))
        .map(|s| format!("/{s}"))
        .unwrap_or_else(|| "/sbin/nologin".to_owned());
    let passwd = tree.read_text("etc/passwd", MAX_DB)?;
    let group = tree.read_text("etc/group", MAX_DB)?;
    let (add_passwd, add_group, added, default_user) =
        accounts_to_add(&passwd, &group, image_user, &shell)?;
    if !add_passwd.is_empty() {
        tree.write_text("etc/passwd", &joined(&passwd, &add_passwd), 0o644)?;
    }
    if !add_group.is_empty() {
        tree.write_text("etc/group", &joined(&group, &add_group), 0o644)?;
    }
    let accounts = parse_passwd(&joined(&passwd, &add_passwd));
    for a in &accounts {
        if a.name == default_user || a.name == SANDBOX_USER {
            if let Some(home) = a.home.strip_prefix('/').filter(|h| !h.is_empty()) {
                tree.ensure_home(home, a.uid, a.gid)?;
            }
        }
    }
    Ok(Plumbed {
        default_user,
        added_user: added.is_some(),
        shell,
    })
}

fn joined(existing: &str, added: &str) -> String {
    if existing.is_empty() || existing.ends_with('\n') {
        format!("{existing}{added}")
    } else {
        format!("{existing}\n{added}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_the_sandbox_user_and_root() {
        let (p, g, added, user) = accounts_to_add("", "", None, "/bin/sh").unwrap();
        assert_eq!(
            p,
            "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:SPACE sandbox user:/home/user:/bin/sh\n"
        );
        assert_eq!(g, "root:x:0:\nuser:x:1000:\n");
        assert_eq!(added.unwrap().uid, 1000);
        assert_eq!(user, "user");
    }

    #[test]
    fn keeps_what_the_image_has() {
        // node images have `node` at 1000: the sandbox user takes 1001.
        let passwd = "root:x:0:0:root:/root:/bin/bash\nnode:x:1000:1000::/home/node:/bin/bash\n";
        let group = "root:x:0:\nnode:x:1000:\n";
        let (p, g, added, user) =
            accounts_to_add(passwd, group, Some("node"), "/bin/bash").unwrap();
        assert_eq!(
            p,
            "user:x:1001:1001:SPACE sandbox user:/home/user:/bin/bash\n"
        );
        assert_eq!(g, "user:x:1001:\n");
        assert_eq!(added.unwrap().uid, 1001);
        assert_eq!(user, "node");
        // An image with `user` already: nothing added.
        let passwd = "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n";
        let (p, _, added, user) = accounts_to_add(passwd, "", None, "/bin/sh").unwrap();
        assert!(p.is_empty() && added.is_none());
        assert_eq!(user, "user");
    }

    #[test]
    fn resolves_numeric_users() {
        // distroless: nonroot is 65532.
        let passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
        let (_, _, _, user) = accounts_to_add(passwd, "", Some("65532"), "/sbin/nologin").unwrap();
        assert_eq!(user, "nonroot");
        let (p, _, _, user) =
            accounts_to_add(passwd, "", Some("4242:4243"), "/sbin/nologin").unwrap();
        assert_eq!(user, "u4242");
        assert!(p.contains("u4242:x:4242:4243::/:/sbin/nologin\n"));
        assert!(accounts_to_add(passwd, "", Some("ghost"), "/bin/sh").is_err());
        assert!(accounts_to_add(passwd, "", Some("100000"), "/bin/sh").is_err());
    }
}

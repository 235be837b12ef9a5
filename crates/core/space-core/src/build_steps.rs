//! The steps of a template build after its base (`FROM`): what a Dockerfile's `RUN`,
//! `COPY`, `ENV`, `WORKDIR` and `USER` say, and what E2B's template builder sends.
//!
//! Pure data and logic: validation, the build context each step runs in, and each step's
//! cache key. A node runs the steps in a builder sandbox; a step whose key names a template
//! the node already has is not run again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::template::validate_default_user;

/// Most steps one build may have.
pub const MAX_STEPS: usize = 256;
/// Longest command of a `RUN` (bytes, all arguments together).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Longest path (`COPY` destination, `WORKDIR`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most variables one `ENV` step sets, and most a build's environment may hold.
pub const MAX_ENV_VARS: usize = 256;
/// Longest environment value.
pub const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;
/// Largest archive of files a `COPY` may upload.
pub const MAX_BUILD_FILES_BYTES: u64 = 1 << 30;

/// One step of a build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BuildStep {
    /// Run a command in the builder sandbox; what it changes on disk is kept.
    Run(RunCommand),
    /// Copy uploaded files (a tar archive, by its SHA-256) into the image.
    Copy(CopyStep),
    /// Set environment variables for the following steps and the template's sandboxes.
    Env(BTreeMap<String, String>),
    /// The directory the following steps and the template's processes start in (made if
    /// missing).
    Workdir(String),
    /// The account the following steps run as, and the template's default user.
    User(String),
}

/// A `RUN`'s command: a shell line (`/bin/sh -c LINE`) or an argument vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum RunCommand {
    /// Run by `/bin/sh -c`.
    Shell(String),
    /// Run as is (no shell needed in the image).
    Exec(Vec<String>),
}

impl RunCommand {
    /// The argument vector to start.
    pub fn argv(&self) -> Vec<String> {
        match self {
            RunCommand::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
            RunCommand::Exec(argv) => argv.clone(),
        }
    }
}

/// A `COPY`: the files of an uploaded archive into `dest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CopyStep {
    /// SHA-256 (hex) of the tar archive uploaded with `PUT /v1/templates/files/{sha256}`.
    pub files: String,
    /// Absolute directory the archive's entries go under (relative: under the working
    /// directory).
    pub dest: String,
    /// The account that owns what is copied (default: root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chown: Option<String>,
}

/// Default bound on a start command's ready check (E2B's, too).
pub const DEFAULT_READY_TIMEOUT_SECS: u32 = 600;
/// Longest ready check a build may ask for.
pub const MAX_READY_TIMEOUT_SECS: u32 = 3600;

/// A template's start command: a process its sandboxes have running from their first
/// instant, started once when the template's memory image is made (so every sandbox
/// restored from it has it running and ready) and again whenever a sandbox of it boots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TemplateStart {
    /// What to start, as the template's default user, in its working directory, with its
    /// environment. It runs in the background; its exit with code 0 counts as ready.
    pub command: RunCommand,
    /// Run again (every second) until it exits with code 0: the start command is ready.
    /// Without one, the start command is ready as soon as it has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<RunCommand>,
    /// Longest the ready check may take (default [`DEFAULT_READY_TIMEOUT_SECS`], at most
    /// [`MAX_READY_TIMEOUT_SECS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_timeout_secs: Option<u32>,
}

impl TemplateStart {
    /// The checks a build applies to a start command.
    pub fn validate(&self) -> Result<(), String> {
        check_command("the start command", &self.command)?;
        if let Some(ready) = &self.ready {
            check_command("the ready command", ready)?;
        }
        match self.ready_timeout_secs {
            Some(t) if t == 0 || t > MAX_READY_TIMEOUT_SECS => Err(format!(
                "ready_timeout_secs is 1 to {MAX_READY_TIMEOUT_SECS}"
            )),
            _ => Ok(()),
        }
    }

    /// How long the ready check may take.
    pub fn ready_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(
            self.ready_timeout_secs
                .unwrap_or(DEFAULT_READY_TIMEOUT_SECS),
        ))
    }

    /// The digest of template `base` with this start command: the same disk, another
    /// template (its memory image has the command running).
    pub fn template_key(&self, base: &str) -> String {
        let mut h = Sha256::new();
        h.update(b"space-template-start-v1\0");
        h.update(base.as_bytes());
        h.update(b"\0");
        h.update(serde_json::to_vec(self).unwrap_or_default());
        hex::encode(h.finalize())
    }
}

/// Why a build's steps were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("step {index}: {reason}")]
pub struct StepError {
    /// Which step (from 1).
    pub index: usize,
    /// What is wrong.
    pub reason: String,
}

/// What a step runs with: the environment, directory and user the steps before it set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepContext {
    /// Environment (the base template's, then each `ENV`).
    pub env: BTreeMap<String, String>,
    /// Working directory (`None`: the user's home, as a sandbox's processes).
    pub workdir: Option<String>,
    /// The user steps run as.
    pub user: String,
}

impl StepContext {
    /// The context after `step` (only `ENV`, `WORKDIR` and `USER` change it).
    pub fn apply(&mut self, step: &BuildStep) {
        match step {
            BuildStep::Env(vars) => {
                for (k, v) in vars {
                    self.env.insert(k.clone(), v.clone());
                }
            }
            BuildStep::Workdir(dir) => self.workdir = Some(self.resolve(dir)),
            BuildStep::User(user) => self.user = user.clone(),
            BuildStep::Run(_) | BuildStep::Copy(_) => {}
        }
    }

    /// `path` made absolute against the working directory (`/` without one).
    pub fn resolve(&self, path: &str) -> String {
        if path.starts_with('/') {
            return normalize(path);
        }
        let base = self.workdir.as_deref().unwrap_or("/");
        normalize(&format!("{base}/{path}"))
    }
}

/// `path` without empty and `.` components, `..` taken back (never above `/`).
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Whether `name` is a valid environment variable name (`[A-Za-z_][A-Za-z0-9_]*`, at most
/// 256 bytes).
pub fn validate_env_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()))
}

/// Whether `s` is the hex SHA-256 of something.
pub fn validate_files_hash(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks every step (bounds, names, paths); the first problem is the error.
pub fn validate_steps(steps: &[BuildStep]) -> Result<(), StepError> {
    if steps.len() > MAX_STEPS {
        return Err(StepError {
            index: MAX_STEPS + 1,
            reason: format!("a build has at most {MAX_STEPS} steps"),
        });
    }
    for (i, step) in steps.iter().enumerate() {
        check_step(step).map_err(|reason| StepError {
            index: i + 1,
            reason,
        })?;
    }
    Ok(())
}

fn check_path(what: &str, path: &str) -> Result<(), String> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES || path.contains('\0') {
        return Err(format!(
            "{what} must be a path of 1 to {MAX_PATH_BYTES} bytes without NUL"
        ));
    }
    Ok(())
}

/// A command is 1 to [`MAX_COMMAND_BYTES`] bytes without NUL, its program not blank.
fn check_command(what: &str, cmd: &RunCommand) -> Result<(), String> {
    let argv = match cmd {
        RunCommand::Shell(line) => vec![line.as_str()],
        RunCommand::Exec(argv) => argv.iter().map(String::as_str).collect(),
    };
    if argv.is_empty() || argv[0].trim().is_empty() {
        return Err(format!("{what} needs a command"));
    }
    let bytes: usize = argv.iter().map(|a| a.len() + 1).sum();
    if bytes > MAX_COMMAND_BYTES {
        return Err(format!(
            "{what}'s command is over {MAX_COMMAND_BYTES} bytes"
        ));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(format!("{what}'s command contains NUL"));
    }
    Ok(())
}

fn check_step(step: &BuildStep) -> Result<(), String> {
    match step {
        BuildStep::Run(cmd) => check_command("RUN", cmd)?,
        BuildStep::Copy(c) => {
            if !validate_files_hash(&c.files) {
                return Err("COPY's files must be the hex SHA-256 of an uploaded archive".into());
            }
            check_path("COPY's destination", &c.dest)?;
            if let Some(user) = &c.chown {
                if !validate_default_user(user) {
                    return Err(format!("COPY's --chown names no valid user: {user:?}"));
                }
            }
        }
        BuildStep::Env(vars) => {
            if vars.is_empty() || vars.len() > MAX_ENV_VARS {
                return Err(format!("ENV sets 1 to {MAX_ENV_VARS} variables"));
            }
            for (k, v) in vars {
                if !validate_env_name(k) {
                    return Err(format!("ENV: invalid variable name {k:?}"));
                }
                if v.len() > MAX_ENV_VALUE_BYTES || v.contains('\0') {
                    return Err(format!(
                        "ENV {k}: a value is at most {MAX_ENV_VALUE_BYTES} bytes, without NUL"
                    ));
                }
            }
        }
        BuildStep::Workdir(dir) => check_path("WORKDIR", dir)?,
        BuildStep::User(user) => {
            if !validate_default_user(user) {
                return Err(format!("USER names no valid user: {user:?}"));
            }
        }
    }
    Ok(())
}

/// Whether `step` changes the disk (and so is run, committed and cached), or only the
/// context.
pub fn changes_disk(step: &BuildStep) -> bool {
    matches!(
        step,
        BuildStep::Run(_) | BuildStep::Copy(_) | BuildStep::Workdir(_)
    )
}

/// The key of what the build holds after `step`, given the key before it and the context it
/// runs in: the digest of the template a cached run of it made. Everything that can change
/// what the step does is in it (the `COPY` archive by its hash), so an unchanged step on an
/// unchanged base is found again; anything else starts a new chain.
pub fn step_key(before: &str, context: &StepContext, step: &BuildStep) -> String {
    let mut h = Sha256::new();
    h.update(b"space-build-step-v1\0");
    h.update(before.as_bytes());
    h.update(b"\0");
    // Both are serialized from ordered maps and plain fields: the same input, the same bytes.
    h.update(serde_json::to_vec(context).unwrap_or_default());
    h.update(b"\0");
    h.update(serde_json::to_vec(step).unwrap_or_default());
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str) -> BuildStep {
        BuildStep::Run(RunCommand::Shell(s.into()))
    }

    #[test]
    fn steps_read_like_the_api_writes_them() {
        let json = r#"[{"run":"apt-get update"},{"run":["/bin/echo","hi"]},
            {"copy":{"files":"aa","dest":"/app"}},{"env":{"A":"1"}},{"workdir":"/app"},
            {"user":"app"}]"#;
        let steps: Vec<BuildStep> = serde_json::from_str(json).unwrap();
        assert_eq!(steps[0], run("apt-get update"));
        assert_eq!(
            steps[1],
            BuildStep::Run(RunCommand::Exec(vec!["/bin/echo".into(), "hi".into()]))
        );
        assert_eq!(steps[5], BuildStep::User("app".into()));
        assert!(serde_json::from_str::<Vec<BuildStep>>(r#"[{"frobnicate":1}]"#).is_err());
    }

    #[test]
    fn bad_steps_are_refused_with_their_index() {
        let bad = [
            run(""),
            BuildStep::Run(RunCommand::Exec(vec![])),
            run(&"x".repeat(MAX_COMMAND_BYTES + 1)),
            BuildStep::Copy(CopyStep {
                files: "nothex".into(),
                dest: "/x".into(),
                chown: None,
            }),
            BuildStep::Env(BTreeMap::from([("1A".into(), "x".into())])),
            BuildStep::Env(BTreeMap::new()),
            BuildStep::Workdir(String::new()),
            BuildStep::User("a\nb".into()),
        ];
        for step in bad {
            let e = validate_steps(&[run("true"), step.clone()]).unwrap_err();
            assert_eq!(e.index, 2, "{step:?}");
        }
        let many = vec![run("true"); MAX_STEPS + 1];
        assert!(validate_steps(&many).is_err());
        assert!(validate_steps(&[run("true"), BuildStep::User("app".into())]).is_ok());
    }

    #[test]
    fn the_context_follows_env_workdir_and_user() {
        let mut cx = StepContext {
            user: "root".into(),
            ..Default::default()
        };
        assert_eq!(cx.resolve("app"), "/app");
        cx.apply(&BuildStep::Workdir("/srv//x/../app".into()));
        assert_eq!(cx.workdir.as_deref(), Some("/srv/app"));
        cx.apply(&BuildStep::Workdir("sub".into()));
        assert_eq!(cx.workdir.as_deref(), Some("/srv/app/sub"));
        assert_eq!(cx.resolve("../../../../etc"), "/etc");
        cx.apply(&BuildStep::Env(BTreeMap::from([("A".into(), "1".into())])));
        cx.apply(&BuildStep::User("app".into()));
        assert_eq!(cx.env["A"], "1");
        assert_eq!(cx.user, "app");
    }

    #[test]
    fn a_step_key_changes_with_anything_that_changes_the_step() {
        let cx = StepContext {
            user: "root".into(),
            ..Default::default()
        };
        let k = step_key("base", &cx, &run("make"));
        assert_eq!(k, step_key("base", &cx, &run("make")), "stable");
        assert_ne!(k, step_key("other", &cx, &run("make")), "another base");
        assert_ne!(
            k,
            step_key("base", &cx, &run("make all")),
            "another command"
        );
        let mut env = cx.clone();
        env.apply(&BuildStep::Env(BTreeMap::from([(
            "CC".into(),
            "clang".into(),
        )])));
        assert_ne!(
            k,
            step_key("base", &env, &run("make")),
            "another environment"
        );
        let mut user = cx.clone();
        user.apply(&BuildStep::User("app".into()));
        assert_ne!(k, step_key("base", &user, &run("make")), "another user");
        assert_eq!(k.len(), 64);
    }
}

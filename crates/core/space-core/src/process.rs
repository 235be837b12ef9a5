//! Processes inside a sandbox: what to run, what it reports, and the output event stream.
//!
//! These types travel unchanged from the API through the node to the guest daemon, so a
//! process is described the same way at every layer.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::error::excerpt;
use crate::files::{validate_path, PathError};

/// Identifies a process within one sandbox. Assigned by the daemon, never reused while the
/// sandbox lives (unlike an OS pid).
pub type ProcessId = u64;

/// Limits on a [`ProcessSpec`]: it crosses the API and the guest channel.
pub const MAX_ARGV: usize = 4096;
/// Longest single argument, or shell command line.
pub const MAX_ARG_BYTES: usize = 128 * 1024;
/// Most environment variables on one process.
pub const MAX_ENV: usize = 512;
/// Longest environment value.
pub const MAX_ENV_VALUE: usize = 32 * 1024;
/// Largest data chunk in one [`OutputEvent`], before base64.
pub const MAX_OUTPUT_CHUNK: usize = 32 * 1024;
/// Longest line of an NDJSON output stream (a base64 chunk plus framing).
pub const MAX_OUTPUT_LINE: usize = 64 * 1024;

/// What to run and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    /// Program and arguments, run without a shell. Exactly one of `argv` and `shell`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// A command line run by `/bin/sh -c`. Exactly one of `argv` and `shell`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Extra environment, on top of the sandbox's and the user's defaults.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; default the user's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// User to run as; default the template's default user (`user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kill the process (and its process group) after this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Keep stdin open for streaming; otherwise stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// Run on a pseudo-terminal of this size (stdout and stderr merge into `pty` events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Free-form label to find the process again in a listing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// Largest signal number a client may send.
pub const MAX_SIGNAL: i32 = 64;
/// Largest terminal dimension (rows or columns).
pub const MAX_PTY_DIM: u16 = 1000;

/// Terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Rows (1..=[`MAX_PTY_DIM`]).
    pub rows: u16,
    /// Columns (1..=[`MAX_PTY_DIM`]).
    pub cols: u16,
}

/// Why a [`ProcessSpec`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessSpecError {
    /// Neither or both of `argv` and `shell` were given.
    #[error("give exactly one of 'argv' (non-empty) and 'shell'")]
    Command,
    /// Too many or too long arguments.
    #[error("command too large: at most {MAX_ARGV} arguments of {MAX_ARG_BYTES} bytes each")]
    TooLarge,
    /// A string contains a NUL byte.
    #[error("arguments, environment and paths may not contain NUL bytes")]
    Nul,
    /// An environment variable name or value is not acceptable.
    #[error("bad environment variable '{0}': names are [A-Za-z_][A-Za-z0-9_]*, values at most {MAX_ENV_VALUE} bytes, at most {MAX_ENV} variables")]
    Env(String),
    /// The working directory is not acceptable.
    #[error("bad cwd: {0}")]
    Cwd(#[from] PathError),
    /// The user name is not acceptable.
    #[error("bad user name")]
    User,
    /// The terminal size is out of range.
    #[error("pty rows and cols must be between 1 and {MAX_PTY_DIM}")]
    Pty,
    /// The tag is too long.
    #[error("tag must be at most 128 bytes")]
    Tag,
}

impl ProcessSpec {
    /// A spec that runs `argv` directly.
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        Self {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Self::default()
        }
    }

    /// A spec that runs `line` with `/bin/sh -c`.
    pub fn shell(line: impl Into<String>) -> Self {
        Self {
            shell: Some(line.into()),
            ..Self::default()
        }
    }

    /// Checks every bound. Called by the API and again by the daemon.
    pub fn validate(&self) -> Result<(), ProcessSpecError> {
        match (&self.argv, &self.shell) {
            (Some(argv), None) if !argv.is_empty() => {
                if argv.len() > MAX_ARGV || argv.iter().any(|a| a.len() > MAX_ARG_BYTES) {
                    return Err(ProcessSpecError::TooLarge);
                }
                if argv.iter().any(|a| a.contains('\0')) {
                    return Err(ProcessSpecError::Nul);
                }
            }
            (None, Some(line)) => {
                if line.len() > MAX_ARG_BYTES {
                    return Err(ProcessSpecError::TooLarge);
                }
                if line.contains('\0') {
                    return Err(ProcessSpecError::Nul);
                }
            }
            _ => return Err(ProcessSpecError::Command),
        }
        validate_env(&self.env).map_err(ProcessSpecError::Env)?;
        if let Some(cwd) = &self.cwd {
            validate_path(cwd)?;
        }
        if let Some(user) = &self.user {
            validate_user_name(user).map_err(|_| ProcessSpecError::User)?;
        }
        if let Some(p) = self.pty {
            p.validate()?;
        }
        if self.tag.as_ref().is_some_and(|t| t.len() > 128) {
            return Err(ProcessSpecError::Tag);
        }
        Ok(())
    }

    /// The argv that will be executed (`/bin/sh -c LINE` for shell commands).
    pub fn effective_argv(&self) -> Vec<String> {
        match (&self.argv, &self.shell) {
            (Some(argv), _) => argv.clone(),
            (None, Some(line)) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
            (None, None) => Vec::new(),
        }
    }
}

impl PtySize {
    /// Both dimensions within 1..=[`MAX_PTY_DIM`]. Checked by the API, the node and the daemon.
    pub fn validate(&self) -> Result<(), ProcessSpecError> {
        let ok = |d: u16| (1..=MAX_PTY_DIM).contains(&d);
        if ok(self.rows) && ok(self.cols) {
            Ok(())
        } else {
            Err(ProcessSpecError::Pty)
        }
    }
}

/// A signal number outside 1..=[`MAX_SIGNAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("signal must be between 1 and {MAX_SIGNAL}, got {0}")]
pub struct InvalidSignal(pub i32);

/// Checks a signal number. Checked by the API, the node and the daemon.
pub fn validate_signal(signal: i32) -> Result<(), InvalidSignal> {
    if (1..=MAX_SIGNAL).contains(&signal) {
        Ok(())
    } else {
        Err(InvalidSignal(signal))
    }
}

/// A portable variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most 256 bytes.
pub fn valid_env_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 256
        && k.bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()))
}

/// Checks environment variables; the error carries the offending name.
pub fn validate_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    if env.len() > MAX_ENV {
        return Err(format!("{} variables", env.len()));
    }
    for (k, v) in env {
        if !valid_env_key(k) || v.len() > MAX_ENV_VALUE || v.contains('\0') {
            return Err(excerpt(k, 64));
        }
    }
    Ok(())
}

/// A user name that [`validate_user_name`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid user name: want [a-z_][a-z0-9_-]*, at most 32 bytes")]
pub struct InvalidUserName;

/// A POSIX-ish user name: `[a-z_][a-z0-9_-]*`, at most 32 bytes.
pub fn validate_user_name(name: &str) -> Result<(), InvalidUserName> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.bytes().enumerate().all(|(i, b)| {
            b == b'_' || b.is_ascii_lowercase() || (i > 0 && (b.is_ascii_digit() || b == b'-'))
        });
    if ok {
        Ok(())
    } else {
        Err(InvalidUserName)
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExitStatus {
    /// Exit code, if it exited normally.
    pub exit_code: Option<i32>,
    /// Signal number, if it was killed by a signal.
    pub signal: Option<i32>,
    /// It was killed because its timeout expired.
    pub timed_out: bool,
}

/// A process as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessInfo {
    /// Sandbox-unique process id.
    pub id: ProcessId,
    /// OS pid inside the guest.
    pub pid: u32,
    /// What is being run.
    pub argv: Vec<String>,
    /// User it runs as.
    pub user: String,
    /// The environment its start asked for (on top of the sandbox's and the user's
    /// defaults, which are not repeated here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its working directory, absolute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The tag given at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Runs on a pseudo-terminal.
    pub pty: bool,
    /// Milliseconds since the Unix epoch (guest clock).
    pub started_at_ms: u64,
    /// `None` while it runs.
    pub exit: Option<ExitStatus>,
}

/// Which stream a chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// The pseudo-terminal (stdout and stderr merged).
    Pty,
}

/// One event of a process's output stream, sent as one NDJSON line. `seq` numbers events
/// so a client that reconnects can ask for those after the last one it saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputEvent {
    /// The process started.
    Started {
        /// Sequence number.
        seq: u64,
        /// Process id.
        id: ProcessId,
        /// OS pid.
        pid: u32,
    },
    /// A chunk of output.
    Data {
        /// Sequence number.
        seq: u64,
        /// Which stream.
        stream: OutputStream,
        /// The bytes, base64 (standard alphabet).
        data: String,
    },
    /// Output was dropped because the client was away longer than the replay buffer lasts.
    Lost {
        /// Sequence number.
        seq: u64,
        /// How many bytes were dropped.
        bytes: u64,
    },
    /// The process ended. Always the last event.
    Exit {
        /// Sequence number.
        seq: u64,
        /// How it ended.
        #[serde(flatten)]
        status: ExitStatus,
    },
}

impl OutputEvent {
    /// A data event for `bytes`.
    pub fn data(seq: u64, stream: OutputStream, bytes: &[u8]) -> Self {
        OutputEvent::Data {
            seq,
            stream,
            data: base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }

    /// The sequence number.
    pub fn seq(&self) -> u64 {
        match self {
            OutputEvent::Started { seq, .. }
            | OutputEvent::Data { seq, .. }
            | OutputEvent::Lost { seq, .. }
            | OutputEvent::Exit { seq, .. } => *seq,
        }
    }

    /// Decodes the bytes of a data event; `None` for other events or bad base64.
    pub fn bytes(&self) -> Option<(OutputStream, Vec<u8>)> {
        match self {
            OutputEvent::Data { stream, data, .. } => base64::engine::general_purpose::STANDARD
                .decode(data)
                .ok()
                .map(|b| (*stream, b)),
            _ => None,
        }
    }
}

/// A request to deliver a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal number (1..=64), e.g. 15 for SIGTERM, 9 for SIGKILL.
    pub signal: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_command() {
        assert!(ProcessSpec::argv(["true"]).validate().is_ok());
        assert!(ProcessSpec::shell("echo hi").validate().is_ok());
        assert_eq!(
            ProcessSpec::default().validate(),
            Err(ProcessSpecError::Command)
        );
        assert_eq!(
            ProcessSpec::argv(Vec::<String>::new()).validate(),
            Err(ProcessSpecError::Command)
        );
        let both = ProcessSpec {
            shell: Some("x".into()),
            ..ProcessSpec::argv(["y"])
        };
        assert_eq!(both.validate(), Err(ProcessSpecError::Command));
    }

    #[test]
    fn env_and_user_rules() {
        let mut spec = ProcessSpec::argv(["env"]);
        spec.env.insert("1BAD".into(), "x".into());
        assert!(matches!(spec.validate(), Err(ProcessSpecError::Env(_))));
        assert!(validate_user_name("user").is_ok());
        assert!(validate_user_name("../root").is_err());
    }

    #[test]
    fn output_event_wire_format() {
        let ev = OutputEvent::data(3, OutputStream::Stdout, b"hi");
        let line = serde_json::to_string(&ev).unwrap();
        assert_eq!(
            line,
            r#"{"type":"data","seq":3,"stream":"stdout","data":"aGk="}"#
        );
        let exit = OutputEvent::Exit {
            seq: 4,
            status: ExitStatus {
                exit_code: Some(0),
                signal: None,
                timed_out: false,
            },
        };
        let back: OutputEvent =
            serde_json::from_str(&serde_json::to_string(&exit).unwrap()).unwrap();
        assert_eq!(back, exit);
    }
}

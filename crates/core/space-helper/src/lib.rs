//! Runs a helper: an external program the operator configured to reach something SPACE does
//! not speak itself (a vault for credential values, a cloud KMS for customer keys), in the
//! manner of git credential helpers.
//!
//! One run per operation: the operation's name is appended to the configured arguments, the
//! request goes to standard input, the answer comes from standard output. Exit status 0 is
//! success; anything else is [`HelperError::Failed`], carrying the exit status and the last
//! [`MAX_STDERR_TAIL`] bytes of standard error (control characters replaced), never anything
//! from standard output, which may hold a secret. Standard output is read up to the caller's
//! bound into a buffer wiped after use; more is an error. Every run has a timeout: the helper
//! runs in a process group of its own, and on timeout or oversized output the whole group is
//! killed, so a helper's own children do not linger. The environment and working directory
//! are inherited (helpers commonly need `HOME` or a service's address).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use zeroize::Zeroizing;

/// Timeout of one run unless configured otherwise.
pub const DEFAULT_HELPER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest timeout that may be configured.
pub const MAX_HELPER_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of standard error kept (the tail) for error messages.
pub const MAX_STDERR_TAIL: usize = 512;
/// Most configured arguments.
pub const MAX_HELPER_ARGS: usize = 32;

/// How to run a helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCommand {
    /// The program (absolute path recommended; otherwise looked up in `PATH`).
    pub program: PathBuf,
    /// Arguments before the operation.
    pub args: Vec<String>,
    /// Timeout of one run (at most [`MAX_HELPER_TIMEOUT`]).
    pub timeout: Duration,
}

/// Why a helper run failed. Never contains anything the helper wrote to standard output.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The configuration is unusable.
    #[error("helper configuration: {0}")]
    Config(String),
    /// The program could not be started.
    #[error("helper {program}: cannot start: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Talking to the program failed.
    #[error("helper {program} {operation}: {source}")]
    Io {
        /// The program.
        program: PathBuf,
        /// The operation.
        operation: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The program ran out of time and was killed.
    #[error("helper {program} {operation}: no answer within {timeout:?}; killed")]
    Timeout {
        /// The program.
        program: PathBuf,
        /// The operation.
        operation: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The program wrote too much and was killed.
    #[error("helper {program} {operation}: output exceeds {max} bytes; killed")]
    OutputTooLarge {
        /// The program.
        program: PathBuf,
        /// The operation.
        operation: String,
        /// The bound.
        max: usize,
    },
    /// The program exited unsuccessfully.
    #[error("helper {program} {operation} failed ({status}): {stderr}")]
    Failed {
        /// The program.
        program: PathBuf,
        /// The operation.
        operation: String,
        /// Exit status, as text.
        status: String,
        /// Tail of its standard error, control characters replaced.
        stderr: String,
    },
}

impl HelperCommand {
    /// `program` with no arguments and the default timeout.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            timeout: DEFAULT_HELPER_TIMEOUT,
        }
    }

    /// Checks the configuration's bounds.
    pub fn validate(&self) -> Result<(), HelperError> {
        if self.program.as_os_str().is_empty() {
            return Err(HelperError::Config("program is empty".into()));
        }
        if self.args.len() > MAX_HELPER_ARGS {
            return Err(HelperError::Config(format!(
                "more than {MAX_HELPER_ARGS} arguments"
            )));
        }
        if self.timeout.is_zero() || self.timeout > MAX_HELPER_TIMEOUT {
            return Err(HelperError::Config(format!(
                "timeout must be positive and at most {MAX_HELPER_TIMEOUT:?}"
            )));
        }
        Ok(())
    }

    /// Runs the helper for `operation` with `input` on standard input; returns its standard
    /// output (at most `max_output` bytes, wiped on drop).
    pub async fn run(
        &self,
        operation: &str,
        input: &[u8],
        max_output: usize,
    ) -> Result<Zeroizing<Vec<u8>>, HelperError> {
        self.validate()?;
        let program = self.program.clone();
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .arg(operation)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|source| HelperError::Spawn {
                program: program.clone(),
                source,
            })?;
        // The child leads its own process group (process_group(0)): its id is the group id.
        let group = child.id();
        let run = Run {
            program: &program,
            operation,
            group,
            max_output,
        };
        match tokio::time::timeout(self.timeout, run.interact(&mut child, input)).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => {
                kill_group(group);
                let _ = child.kill().await;
                tracing::warn!(program = %program.display(), operation, timeout = ?self.timeout, "helper timed out; killed");
                Err(HelperError::Timeout {
                    program,
                    operation: operation.to_owned(),
                    timeout: self.timeout,
                })
            }
        }
    }
}

/// One run under way.
struct Run<'a> {
    program: &'a Path,
    operation: &'a str,
    group: Option<u32>,
    max_output: usize,
}

impl Run<'_> {
    fn io_err(&self, source: std::io::Error) -> HelperError {
        HelperError::Io {
            program: self.program.to_owned(),
            operation: self.operation.to_owned(),
            source,
        }
    }

    /// Writes the request, reads both outputs (bounded) and waits for the exit.
    async fn interact(
        &self,
        child: &mut Child,
        input: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, HelperError> {
        let missing = || self.io_err(std::io::Error::other("pipe missing"));
        let mut stdin = child.stdin.take().ok_or_else(missing)?;
        let mut stdout = child.stdout.take().ok_or_else(missing)?;
        let mut stderr = child.stderr.take().ok_or_else(missing)?;

        let write = async move {
            // A helper that exits without reading its input is fine (broken pipe ignored).
            let _ = stdin.write_all(input).await;
            drop(stdin);
        };
        let read_out = async {
            let out = read_capped(&mut stdout, self.max_output).await;
            if matches!(out, Ok(None)) {
                // Over the bound: stop the helper now rather than at the timeout.
                kill_group(self.group);
            }
            out
        };
        let read_err = read_tail(&mut stderr, MAX_STDERR_TAIL);
        let ((), out, err_tail) = tokio::join!(write, read_out, read_err);
        let status = child.wait().await.map_err(|e| self.io_err(e))?;
        let Some(out) = out.map_err(|e| self.io_err(e))? else {
            return Err(HelperError::OutputTooLarge {
                program: self.program.to_owned(),
                operation: self.operation.to_owned(),
                max: self.max_output,
            });
        };
        if !status.success() {
            let stderr = sanitize_tail(&err_tail.unwrap_or_default());
            tracing::warn!(program = %self.program.display(), operation = self.operation, %status, stderr = %stderr, "helper failed");
            return Err(HelperError::Failed {
                program: self.program.to_owned(),
                operation: self.operation.to_owned(),
                status: status.to_string(),
                stderr,
            });
        }
        Ok(out)
    }
}

/// Reads to EOF into a fixed buffer (never reallocated, so no unwiped copies); `None` if
/// there is more than `max`.
async fn read_capped<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Option<Zeroizing<Vec<u8>>>> {
    let mut buf = Zeroizing::new(vec![0u8; max + 1]);
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            return Ok(None);
        }
        let n = reader.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    Ok(Some(buf))
}

/// Reads to EOF keeping only the last `keep` bytes.
async fn read_tail<R: AsyncRead + Unpin>(reader: &mut R, keep: usize) -> std::io::Result<Vec<u8>> {
    let mut tail = Vec::with_capacity(2 * keep);
    let mut chunk = [0u8; 4096];
    loop {
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            return Ok(tail);
        }
        tail.extend_from_slice(&chunk[..n]);
        if tail.len() > keep {
            tail.drain(..tail.len() - keep);
        }
    }
}

/// Standard error as one safe line: invalid UTF-8 and control characters replaced.
fn sanitize_tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let cleaned: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if cleaned.is_empty() {
        "no error output".into()
    } else {
        cleaned
    }
}

/// SIGKILL to the helper's whole process group. Best effort (it may be gone already).
fn kill_group(group: Option<u32>) {
    let Some(pid) = group.and_then(|g| i32::try_from(g).ok()) else {
        return;
    };
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> HelperCommand {
        HelperCommand {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into(), "helper".into()],
            timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn a_helper_gets_its_operation_and_input() {
        let out = sh(r#"printf '%s:' "$1"; cat"#)
            .run("wrap", b"hello", 64)
            .await
            .unwrap();
        assert_eq!(&out[..], b"wrap:hello");
    }

    #[tokio::test]
    async fn failures_carry_stderr_but_never_stdout() {
        let err = sh("echo secret-out; echo 'bad key' >&2; exit 3")
            .run("unwrap", b"", 64)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("bad key"), "{text}");
        assert!(!text.contains("secret-out"), "{text}");
    }

    #[tokio::test]
    async fn too_much_output_and_too_much_time_kill_the_helper() {
        let err = sh("yes").run("x", b"", 1024).await.unwrap_err();
        assert!(matches!(err, HelperError::OutputTooLarge { .. }), "{err}");
        let mut slow = sh("sleep 30 & wait");
        slow.timeout = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let err = slow.run("x", b"", 16).await.unwrap_err();
        assert!(matches!(err, HelperError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn bounds_are_checked() {
        let mut c = HelperCommand::new("");
        assert!(c.validate().is_err());
        c.program = "/bin/true".into();
        c.timeout = Duration::from_secs(600);
        assert!(c.validate().is_err());
    }
}

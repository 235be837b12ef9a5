//! Running external tools to completion (mkfs.btrfs, mount, losetup here; `space-images`
//! uses it too), with their error output in the error.

use std::process::Command;

use crate::error::StorageError;

/// How much of a tool's error output goes into an error message.
const STDERR_TAIL: usize = 2000;

/// Runs `cmd` to completion; fails with its command line, exit status and stderr unless it
/// exits 0. Returns its stdout.
pub fn run(cmd: &mut Command) -> Result<String, StorageError> {
    let line = describe(cmd);
    tracing::debug!(command = %line, "running");
    let out = cmd.output().map_err(|source| StorageError::Spawn {
        program: cmd.get_program().to_string_lossy().into_owned(),
        source,
    })?;
    if !out.status.success() {
        return Err(StorageError::Command {
            command: line,
            status: out.status.to_string(),
            stderr: tail(&out.stderr),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The command as a shell-like line, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The last [`STDERR_TAIL`] bytes of some output, trimmed.
fn tail(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    let start = s.len().saturating_sub(STDERR_TAIL);
    let start = (start..=s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    s[start..].to_owned()
}

//! Running a process in a guest to its exit with its output as log lines: a build's `RUN`
//! steps and a start command's ready checks.

use futures::StreamExt;
use space_core::process::{ExitStatus, OutputEvent, ProcessSpec};
use space_guest_client::GuestClient;

/// Longest partial output line kept before it is logged anyway.
const MAX_PENDING_LINE: usize = 2048;

/// Why a process could not be run to its exit.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// The guest refused to start it (no such program, bad user...).
    #[error("could not start: {0}")]
    Start(space_guest_client::GuestError),
    /// Its output stream failed or ended before it exited: the guest's fault, not the
    /// command's.
    #[error("its output: {0}")]
    Output(String),
}

/// Starts `spec` and waits for it to exit, handing each output line to `line`.
pub(crate) async fn run_to_exit(
    guest: &GuestClient,
    spec: &ProcessSpec,
    mut line: impl FnMut(&str),
) -> Result<ExitStatus, RunError> {
    let info = guest.start_process(spec).await.map_err(RunError::Start)?;
    let mut events = guest
        .output(info.id, None)
        .await
        .map_err(|e| RunError::Output(e.to_string()))?;
    let mut lines = LineSplitter::default();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| RunError::Output(e.to_string()))?;
        if let Some((_, bytes)) = event.bytes() {
            for l in lines.push(&bytes) {
                line(&l);
            }
            continue;
        }
        if let OutputEvent::Exit { status, .. } = event {
            if let Some(rest) = lines.finish() {
                line(&rest);
            }
            return Ok(status);
        }
    }
    Err(RunError::Output("ended before the process exited".into()))
}

/// How `status` reads in a log: `None` for a clean exit (code 0).
pub(crate) fn failure(status: &ExitStatus, timeout_secs: u64) -> Option<String> {
    if status.timed_out {
        return Some(format!("took longer than {timeout_secs} s"));
    }
    match (status.exit_code, status.signal) {
        (Some(0), _) => None,
        (Some(code), _) => Some(format!("exited with code {code}")),
        (None, Some(sig)) => Some(format!("was killed by signal {sig}")),
        (None, None) => Some("ended without a status".into()),
    }
}

/// Splits a process's output into lines for a log, bounding a line that never ends.
#[derive(Default)]
pub(crate) struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                out.push(self.take());
            } else if b != b'\r' {
                self.pending.push(b);
                if self.pending.len() >= MAX_PENDING_LINE {
                    out.push(self.take());
                }
            }
        }
        out
    }

    fn take(&mut self) -> String {
        let line = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        line
    }

    pub(crate) fn finish(&mut self) -> Option<String> {
        (!self.pending.is_empty()).then(|| self.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_split_into_bounded_lines() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"a\r\nb"), vec!["a".to_string()]);
        assert_eq!(s.push(b"c\n"), vec!["bc".to_string()]);
        let long = vec![b'x'; MAX_PENDING_LINE + 10];
        let lines = s.push(&long);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].len(), MAX_PENDING_LINE);
        assert_eq!(s.finish().map(|l| l.len()), Some(10));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn exits_read_plainly() {
        let s = |exit_code, signal, timed_out| ExitStatus {
            exit_code,
            signal,
            timed_out,
        };
        assert_eq!(failure(&s(Some(0), None, false), 5), None);
        assert_eq!(
            failure(&s(Some(3), None, false), 5).as_deref(),
            Some("exited with code 3")
        );
        assert_eq!(
            failure(&s(None, Some(9), true), 5).as_deref(),
            Some("took longer than 5 s")
        );
        assert_eq!(
            failure(&s(None, Some(9), false), 5).as_deref(),
            Some("was killed by signal 9")
        );
    }
}

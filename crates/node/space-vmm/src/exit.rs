//! How a VM ended, in words: combines the last QMP SHUTDOWN event with the process's exit
//! status (known only for processes we spawned and reaped ourselves).

use std::os::unix::process::ExitStatusExt;
use std::time::SystemTime;

use crate::qmp::ShutdownSeen;

/// The VMM process has exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmExit {
    /// E.g. "guest powered off", "QEMU exited with signal 9 (SIGKILL)", "QEMU exited with status 1".
    pub reason: String,
    /// When this process noticed the exit.
    pub at: SystemTime,
}

/// How the process itself ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEnd {
    /// It exited with this status.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
    /// Not our child (adopted after a restart): the exit status went to another parent.
    Unknown,
}

impl From<std::process::ExitStatus> for ProcessEnd {
    fn from(status: std::process::ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => ProcessEnd::Code(code),
            (None, Some(sig)) => ProcessEnd::Signal(sig),
            (None, None) => ProcessEnd::Unknown,
        }
    }
}

/// One line saying why the VM stopped. A guest-initiated SHUTDOWN explains a clean exit better
/// than "status 0"; an abnormal exit status is always reported. `sigkilled_by_us`: our kill()
/// had to fall back to SIGKILL.
pub(crate) fn exit_reason(
    shutdown: Option<&ShutdownSeen>,
    end: ProcessEnd,
    sigkilled_by_us: bool,
) -> String {
    let by_event = shutdown.map(|s| match s.reason.as_str() {
        "guest-shutdown" => "guest powered off".to_owned(),
        // -no-reboot turns a guest reboot into an exit.
        "guest-reset" => "guest rebooted (QEMU runs with -no-reboot, so the VM stopped)".to_owned(),
        "guest-panic" => "guest panicked".to_owned(),
        "host-qmp-quit" => "stopped by the host (QMP quit)".to_owned(),
        "host-signal" => "QEMU stopped by a signal".to_owned(),
        other => format!("QEMU shut down ({other})"),
    });
    let by_status = match end {
        ProcessEnd::Unknown | ProcessEnd::Signal(libc::SIGKILL) if sigkilled_by_us => {
            Some("QEMU killed with SIGKILL (it did not quit in time)".to_owned())
        }
        ProcessEnd::Code(0) => None,
        ProcessEnd::Code(code) => Some(format!("QEMU exited with status {code}")),
        ProcessEnd::Signal(sig) => Some(match signal_name(sig) {
            Some(name) => format!("QEMU exited with signal {sig} ({name})"),
            None => format!("QEMU exited with signal {sig}"),
        }),
        ProcessEnd::Unknown => None,
    };
    match (by_event, by_status) {
        (Some(e), Some(s)) => format!("{e}; {s}"),
        (Some(e), None) => e,
        (None, Some(s)) => s,
        (None, None) if end == ProcessEnd::Code(0) => "QEMU exited with status 0".to_owned(),
        (None, None) => {
            "QEMU exited (exit status unknown: its parent was not this node's)".to_owned()
        }
    }
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(reason: &str, guest: bool) -> ShutdownSeen {
        ShutdownSeen {
            guest,
            reason: reason.into(),
        }
    }

    #[test]
    fn reasons() {
        let r = |s: Option<&ShutdownSeen>, end| exit_reason(s, end, false);
        assert_eq!(
            r(Some(&seen("guest-shutdown", true)), ProcessEnd::Code(0)),
            "guest powered off"
        );
        assert_eq!(
            r(Some(&seen("guest-shutdown", true)), ProcessEnd::Unknown),
            "guest powered off"
        );
        assert_eq!(
            r(None, ProcessEnd::Signal(9)),
            "QEMU exited with signal 9 (SIGKILL)"
        );
        assert_eq!(r(None, ProcessEnd::Code(1)), "QEMU exited with status 1");
        assert_eq!(
            r(Some(&seen("host-qmp-quit", false)), ProcessEnd::Code(0)),
            "stopped by the host (QMP quit)"
        );
        assert_eq!(
            r(Some(&seen("guest-panic", true)), ProcessEnd::Code(1)),
            "guest panicked; QEMU exited with status 1"
        );
        assert!(r(None, ProcessEnd::Unknown).contains("unknown"));
        assert_eq!(
            r(None, ProcessEnd::Signal(64)),
            "QEMU exited with signal 64"
        );
        let killed = "QEMU killed with SIGKILL (it did not quit in time)";
        assert_eq!(exit_reason(None, ProcessEnd::Unknown, true), killed);
        assert_eq!(exit_reason(None, ProcessEnd::Signal(9), true), killed);
    }
}

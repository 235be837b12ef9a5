//! A process a test started and must not leave behind: stopped with SIGTERM, then SIGKILL
//! after a grace period, when asked or when dropped.

use std::process::Child;
use std::time::{Duration, Instant};

/// A child process stopped when dropped.
pub(crate) struct StoppedOnDrop {
    child: Child,
    grace: Duration,
}

impl StoppedOnDrop {
    /// `child`, given `grace` to exit after SIGTERM.
    pub(crate) fn new(child: Child, grace: Duration) -> Self {
        StoppedOnDrop { child, grace }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics, with `log`'s contents, if `what` has exited (while the test waits for it
    /// to be ready).
    pub(crate) fn assert_running(&mut self, what: &str, log: &std::path::Path) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{what} exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }

    /// SIGTERM, up to the grace period, then SIGKILL; returns once it is reaped.
    pub(crate) fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A log file for a child's stdout and stderr, appended to.
pub(crate) fn log_to(path: &std::path::Path) -> (std::process::Stdio, std::process::Stdio) {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("child log");
    let err = out.try_clone().expect("child log fd");
    (out.into(), err.into())
}

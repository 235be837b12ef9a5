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

    /// Its exit status, if it has exited.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
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

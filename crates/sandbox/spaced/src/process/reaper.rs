//! Reaps every child of the daemon: the processes it started and orphans reparented to it
//! (the daemon is a child subreaper).
//!
//! tokio's own child handling waits for specific pids and would race with a `waitpid(-1)`
//! for orphans, so the daemon spawns with `std::process` and reaps everything here. Spawning
//! and reaping share a lock, so a child that exits at once is still registered before the
//! reaper can collect its status.

use std::collections::HashMap;
use std::io;
use std::process::Child;
use std::sync::{Arc, Mutex};

use space_core::process::ExitStatus;
use tokio::sync::oneshot;

/// Exit statuses waiting to be collected, by pid.
#[derive(Debug, Default)]
pub struct Reaper {
    waiting: Mutex<HashMap<i32, oneshot::Sender<ExitStatus>>>,
}

/// Decodes a `waitpid` status.
pub fn decode_status(status: libc::c_int) -> ExitStatus {
    if libc::WIFEXITED(status) {
        ExitStatus {
            exit_code: Some(libc::WEXITSTATUS(status)),
            signal: None,
            timed_out: false,
        }
    } else if libc::WIFSIGNALED(status) {
        ExitStatus {
            exit_code: None,
            signal: Some(libc::WTERMSIG(status)),
            timed_out: false,
        }
    } else {
        ExitStatus {
            exit_code: None,
            signal: None,
            timed_out: false,
        }
    }
}

impl Reaper {
    /// Runs `spawn` (which forks) under the reaper's lock and registers the child's pid.
    /// Blocking: call on a blocking thread.
    pub fn spawn_registered(
        &self,
        spawn: impl FnOnce() -> io::Result<Child>,
    ) -> io::Result<(Child, oneshot::Receiver<ExitStatus>)> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let child = spawn()?;
        let (tx, rx) = oneshot::channel();
        waiting.insert(child.id() as i32, tx);
        Ok((child, rx))
    }

    /// Collects every exited child. Blocking only on the lock.
    pub fn reap_all(&self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid writes the status int.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            match waiting.remove(&pid) {
                Some(tx) => {
                    let _ = tx.send(decode_status(status));
                }
                None => tracing::debug!(pid, "reaped orphan"),
            }
        }
    }

    /// Installs the SIGCHLD listener now (so no exit is missed) and reaps on every SIGCHLD
    /// in a background task. Must be called inside the runtime, before spawning anything.
    pub fn start(self: Arc<Self>) -> io::Result<()> {
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        tokio::spawn(async move {
            loop {
                let me = self.clone();
                let _ = tokio::task::spawn_blocking(move || me.reap_all()).await;
                if sigchld.recv().await.is_none() {
                    return;
                }
            }
        });
        Ok(())
    }
}

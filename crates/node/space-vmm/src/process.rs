//! A handle on the QEMU process that stays correct after the pid is reaped: signals and exit
//! waits go through a pidfd, so a recycled pid can never be signalled by mistake. Falls back
//! to kill(2) and /proc polling on kernels without pidfd (< 5.3).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::procfs;

/// How often the fallback path polls /proc for the process's end.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// One process, referred to by pidfd when the kernel allows.
#[derive(Debug)]
pub(crate) struct ProcHandle {
    pid: u32,
    pidfd: Option<AsyncFd<OwnedFd>>,
}

impl ProcHandle {
    /// Opens a handle; must run inside a Tokio runtime. `ESRCH` means the process is gone.
    pub(crate) fn open(pid: u32) -> io::Result<Self> {
        let pidfd = match pidfd_open(pid) {
            // SAFETY: an OwnedFd is a valid open fd that stays the same until it is dropped,
            // and the AsyncFd owns it for its whole life.
            Ok(fd) => Some(
                unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                    .map_err(|e| e.into_parts().1)?,
            ),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(e),
            Err(e) => {
                tracing::warn!(pid, error = %e, "pidfd_open failed; falling back to polling /proc");
                None
            }
        };
        Ok(ProcHandle { pid, pidfd })
    }

    /// A handle on a child made with `clone3(CLONE_PIDFD)`; must run inside a Tokio runtime.
    pub(crate) fn from_pidfd(pid: u32, pidfd: OwnedFd) -> io::Result<Self> {
        // SAFETY: as in `open`: the AsyncFd owns the descriptor for its whole life.
        let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(ProcHandle {
            pid,
            pidfd: Some(pidfd),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Reaps our child once it has exited ([`Self::wait_exit`] first) and says how it ended.
    pub(crate) fn reap(&self) -> crate::exit::ProcessEnd {
        use crate::exit::ProcessEnd;
        let Some(fd) = &self.pidfd else {
            return ProcessEnd::Unknown;
        };
        // SAFETY: siginfo_t is plain data, filled by waitid on a pidfd we own.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                fd.get_ref().as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG,
            )
        };
        if rc < 0 {
            tracing::warn!(pid = self.pid, error = %io::Error::last_os_error(), "cannot reap VMM");
            return ProcessEnd::Unknown;
        }
        // SAFETY: waitid succeeded for an exited child, so the status fields are set.
        let status = unsafe { info.si_status() };
        match info.si_code {
            libc::CLD_EXITED => ProcessEnd::Code(status),
            libc::CLD_KILLED | libc::CLD_DUMPED => ProcessEnd::Signal(status),
            _ => ProcessEnd::Unknown,
        }
    }

    /// Sends `sig`; `Ok(false)` when the process had already exited.
    pub(crate) fn signal(&self, sig: libc::c_int) -> io::Result<bool> {
        let rc = match &self.pidfd {
            // SAFETY: plain syscall on a pidfd we own; no pointers besides the null siginfo.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.get_ref().as_raw_fd(),
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0u32,
                )
            },
            None => {
                if !procfs::is_alive(self.pid) {
                    return Ok(false);
                }
                let pid = libc::pid_t::try_from(self.pid)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
                // SAFETY: kill(2) takes no pointers.
                i64::from(unsafe { libc::kill(pid, sig) })
            }
        };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            Ok(false)
        } else {
            Err(err)
        }
    }

    /// Resolves once the process has exited (it may still be an unreaped zombie).
    pub(crate) async fn wait_exit(&self) {
        match &self.pidfd {
            Some(fd) => {
                // A pidfd turns readable when the process exits; readiness is never cleared,
                // so every later waiter returns at once too.
                if let Err(e) = fd.readable().await {
                    tracing::warn!(pid = self.pid, error = %e, "pidfd wait failed; polling /proc");
                    self.poll_exit().await;
                }
            }
            None => self.poll_exit().await,
        }
    }

    async fn poll_exit(&self) {
        while procfs::is_alive(self.pid) {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(rc)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "pidfd out of range"))?;
    // SAFETY: the kernel just gave us this fd and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_and_signals_a_real_process() {
        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let h = ProcHandle::open(child.id().unwrap()).unwrap();
        assert!(h.signal(libc::SIGKILL).unwrap());
        h.wait_exit().await;
        child.wait().await.unwrap();
        // Reaped: the pidfd still refers to the dead process, never to a recycled pid.
        assert!(!h.signal(libc::SIGKILL).unwrap());
        h.wait_exit().await;
    }
}

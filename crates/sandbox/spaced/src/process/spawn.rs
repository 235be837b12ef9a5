//! Starting one process: credentials, session, terminal and stdio, then fork/exec.
//!
//! Runs on a blocking thread. The child becomes a session (and process-group) leader so a
//! signal or a timeout reaches everything it started; on a pty the slave becomes its
//! controlling terminal. Identity changes happen in `pre_exec`, after std's own setup, so
//! `chdir` is checked with the user's permissions.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use space_core::process::{ExitStatus, PtySize};
use tokio::sync::oneshot;

use super::pty;
use super::reaper::Reaper;
use crate::users::UserInfo;

/// Everything needed to start a process.
#[derive(Debug, Clone)]
pub struct SpawnRequest {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Complete environment.
    pub env: BTreeMap<String, String>,
    /// Absolute working directory.
    pub cwd: PathBuf,
    /// Who runs it.
    pub user: UserInfo,
    /// Pipe stdin (otherwise `/dev/null`).
    pub stdin: bool,
    /// Run on a pty of this size.
    pub pty: Option<PtySize>,
    /// Group owning the pty slave (`tty`), if known.
    pub tty_gid: Option<u32>,
}

/// A started process.
#[derive(Debug)]
pub struct Spawned {
    /// OS pid (also its process group and session id).
    pub pid: u32,
    /// Write end of stdin, when piped.
    pub stdin: Option<OwnedFd>,
    /// Read end of stdout, when not on a pty.
    pub stdout: Option<OwnedFd>,
    /// Read end of stderr, when not on a pty.
    pub stderr: Option<OwnedFd>,
    /// The pty master, when on a pty.
    pub pty_master: Option<OwnedFd>,
    /// Resolves when the reaper collects the process.
    pub exit: oneshot::Receiver<ExitStatus>,
}

/// Why a process could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program could not be executed (missing, not executable, bad format).
    #[error("cannot execute '{program}': {reason}")]
    Exec {
        /// The program.
        program: String,
        /// Why.
        reason: String,
    },
    /// Anything else (out of descriptors, pty failure, fork failure).
    #[error("cannot start process: {0}")]
    Setup(io::Error),
    /// The workload cgroup is frozen: a process started now would freeze before exec.
    #[error("the workload is frozen; no process can start until it is thawed")]
    WorkloadFrozen,
}

fn classify(program: &str, e: io::Error) -> SpawnError {
    let reason = match e.raw_os_error() {
        Some(libc::ENOENT) => "no such file or directory (not found in PATH)".to_owned(),
        Some(libc::EACCES) => "permission denied".to_owned(),
        Some(libc::ENOEXEC) => "not an executable format".to_owned(),
        Some(
            libc::ENOTDIR
            | libc::ELOOP
            | libc::ENAMETOOLONG
            | libc::E2BIG
            | libc::ETXTBSY
            | libc::EISDIR,
        ) => e.to_string(),
        _ => return SpawnError::Setup(e),
    };
    SpawnError::Exec {
        program: program.to_owned(),
        reason,
    }
}

/// Starts the process and registers it with the reaper. Blocking. `cgroup_procs` is the
/// open `cgroup.procs` of the workload cgroup; it must stay open until this returns.
pub fn spawn(
    req: SpawnRequest,
    reaper: &Reaper,
    cgroup_procs: Option<RawFd>,
) -> Result<Spawned, SpawnError> {
    let program = req.argv.first().cloned().unwrap_or_default();
    let mut cmd = Command::new(&program);
    cmd.args(req.argv.iter().skip(1));
    cmd.env_clear();
    cmd.envs(&req.env);

    let mut master = None;
    if let Some(size) = req.pty {
        let (m, slave) = pty::open(size, req.user.uid, req.tty_gid).map_err(SpawnError::Setup)?;
        let dup = |fd: &OwnedFd| fd.try_clone().map(Stdio::from).map_err(SpawnError::Setup);
        cmd.stdin(dup(&slave)?)
            .stdout(dup(&slave)?)
            .stderr(Stdio::from(slave));
        master = Some(m);
    } else {
        cmd.stdin(if req.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }

    let cwd = CString::new(req.cwd.as_os_str().as_encoded_bytes())
        .map_err(|_| SpawnError::Setup(io::ErrorKind::InvalidInput.into()))?;
    let groups: Vec<libc::gid_t> = req.user.groups.clone();
    let (uid, gid, on_pty) = (req.user.uid, req.user.gid, req.pty.is_some());
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system
    // calls on data prepared before the fork (no allocation, no locks).
    unsafe {
        cmd.pre_exec(move || {
            // Into the workload cgroup, while still root and before anything of the
            // workload runs: writing "0" to cgroup.procs moves the writer. std::process has
            // no clone3/CLONE_INTO_CGROUP, and the reaper needs std's spawn (it registers
            // the pid under its lock), so we move the child here with one async-signal-safe
            // write(2) on a descriptor opened before the fork. A failure is ignored: the
            // process then runs outside the workload cgroup rather than not at all.
            if let Some(fd) = cgroup_procs {
                let _ = libc::write(fd, b"0".as_ptr().cast(), 1);
            }
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if on_pty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setgid(gid) < 0 || libc::setuid(uid) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::chdir(cwd.as_ptr()) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }

    let (mut child, exit) = reaper
        .spawn_registered(|| cmd.spawn())
        .map_err(|e| classify(&program, e))?;
    // Close our copies of the pty slave now, so the master sees EOF when the child is done.
    drop(cmd);
    Ok(Spawned {
        pid: child.id(),
        stdin: child.stdin.take().map(OwnedFd::from),
        stdout: child.stdout.take().map(OwnedFd::from),
        stderr: child.stderr.take().map(OwnedFd::from),
        pty_master: master,
        exit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_exec_errors() {
        assert!(matches!(
            classify("x", io::Error::from_raw_os_error(libc::ENOENT)),
            SpawnError::Exec { .. }
        ));
        assert!(matches!(
            classify("x", io::Error::from_raw_os_error(libc::EAGAIN)),
            SpawnError::Setup(_)
        ));
    }
}

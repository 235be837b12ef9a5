//! The one error type of this crate: every failure names the VM and says what to look at.

use std::io;
use std::path::PathBuf;

/// Why a VMM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// invalid VM configuration: {0}
    #[error("invalid VM configuration: {0}")]
    InvalidConfig(String),

    /// An I/O operation on the host failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// The VMM binary could not be started at all.
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The VMM could not be confined (uid, cgroup, jail directory) or failed a step of its
    /// jail before it ran.
    #[error("cannot jail the VMM: {step}: {source}")]
    Jail {
        step: String,
        #[source]
        source: io::Error,
    },

    /// QEMU exited before the VM was up; `detail` holds the end of vmm.log.
    #[error("QEMU exited during start: {detail}")]
    StartFailed { detail: String },

    /// An in-memory image cannot be used as asked.
    #[error(transparent)]
    InMemoryImage(#[from] crate::jail::InMemoryImageError),

    /// A step did not finish in time.
    #[error("timed out: {0}")]
    Timeout(String),

    /// A QMP command failed or the QMP connection broke.
    #[error("QMP: {0}")]
    Qmp(String),

    /// Another QEMU of ours is already running in this run directory.
    #[error("a VM named {name:?} is already running from {run_dir} (pid {pid})")]
    AlreadyRunning {
        name: String,
        run_dir: PathBuf,
        pid: u32,
    },

    /// There is no live VM to adopt (no pidfile, or the process is gone).
    #[error("VM is not running: {0}")]
    NotRunning(String),

    /// The pid from the pidfile belongs to some other process (pid reuse) or another VM.
    #[error("pid {pid} is not our QEMU for VM {name:?}: {why}")]
    NotOurVm { pid: u32, name: String, why: String },

    /// The VM has already exited; `0` says how.
    #[error("VM has exited: {0}")]
    Exited(String),

    /// Saving or restoring VM state (QEMU migration) failed; the VM keeps its previous state.
    #[error("VM state transfer failed: {0}")]
    Migration(String),

    /// Even SIGKILL did not make the process go away in time.
    #[error("could not stop VM: {0}")]
    KillFailed(String),
}

impl VmmError {
    /// Wraps an I/O error with what we were doing.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        VmmError::Io {
            context: context.into(),
            source,
        }
    }
}

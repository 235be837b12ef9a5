//! The workload cgroup: every process the daemon starts (exec, pty, background) runs in
//! cgroup v2 `/sys/fs/cgroup/workload`, so the node can freeze the whole workload at once
//! (`POST /v1/workload/freeze`) and measure it (`GET /v1/activity`). The daemon itself stays
//! in the root cgroup and keeps serving while the workload is frozen.
//!
//! Without cgroup v2 (or on the development channel, where the "guest" is the developer's
//! machine) there is no workload cgroup: processes run where the daemon runs, freezing the
//! workload is refused, and this is logged once at start.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use space_guest_proto::limits::WORKLOAD_FREEZE_WAIT_MS;

/// Where cgroup v2 is mounted (`spaced init` mounts it).
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The workload cgroup.
pub const WORKLOAD_CGROUP: &str = "/sys/fs/cgroup/workload";
/// Poll interval while waiting for `cgroup.events` to say frozen.
const FREEZE_POLL: Duration = Duration::from_millis(10);
/// Cgroups visited when counting the workload's processes (it may create its own).
const MAX_CGROUPS_WALKED: usize = 1024;
/// Largest cgroup interface file read (a `cgroup.procs` of many thousand pids).
const MAX_CGROUP_FILE: u64 = 4 * 1024 * 1024;

/// Why a workload operation failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// No workload cgroup in this guest.
    #[error("this guest has no workload cgroup (cgroup v2 unavailable)")]
    Unavailable,
    /// `cgroup.events` did not report frozen in time; the freeze was undone.
    #[error(
        "the workload did not freeze within {WORKLOAD_FREEZE_WAIT_MS} ms (a process may be \
         stuck in the kernel, e.g. writing to a frozen file system); it was thawed again"
    )]
    FreezeTimeout,
    /// A cgroup file could not be read or written.
    #[error("{step}: {source}")]
    Io {
        /// What we were doing.
        step: String,
        /// The error.
        source: io::Error,
    },
    /// The blocking worker died.
    #[error("workload worker failed: {0}")]
    Worker(#[from] tokio::task::JoinError),
}

#[derive(Debug)]
struct Cgroup {
    dir: PathBuf,
    /// `cgroup.procs`, open for writing: children write "0" to it before exec.
    procs: OwnedFd,
}

/// The workload cgroup, if there is one, and its frozen state.
#[derive(Debug)]
pub struct Workload {
    cgroup: Option<Cgroup>,
    /// Held shared by every spawn from its frozen check until the child is in the cgroup,
    /// exclusively by a freeze while it sets `cgroup.freeze`: so no spawn slips into a
    /// cgroup being frozen (its child would freeze before exec, with the spawning thread
    /// waiting for that exec).
    gate: RwLock<()>,
    frozen: AtomicBool,
    /// Serialises freeze and thaw.
    op: tokio::sync::Mutex<()>,
}

fn io_step(step: impl Into<String>) -> impl FnOnce(io::Error) -> WorkloadError {
    let step = step.into();
    move |source| WorkloadError::Io { step, source }
}

/// Reads a cgroup interface file, bounded.
fn read_small(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    File::open(path)?
        .take(MAX_CGROUP_FILE)
        .read_to_string(&mut text)?;
    Ok(text)
}

fn write_file(path: &Path, value: &str) -> Result<(), WorkloadError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(io_step(format!("write {value} to {}", path.display())))
}

/// `frozen` of a `cgroup.events` text.
pub fn parse_frozen(events: &str) -> Option<bool> {
    events.lines().find_map(|l| match l.split_once(' ')? {
        ("frozen", v) => Some(v.trim() == "1"),
        _ => None,
    })
}

/// `usage_usec` of a `cpu.stat` text.
pub fn parse_usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat.lines().find_map(|l| match l.split_once(' ')? {
        ("usage_usec", v) => v.trim().parse().ok(),
        _ => None,
    })
}

/// Processes listed in a `cgroup.procs` text.
pub fn count_procs(procs: &str) -> u32 {
    let n = procs.lines().filter(|l| !l.trim().is_empty()).count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn create(dir: &Path) -> io::Result<Cgroup> {
    if !Path::new(CGROUP_ROOT).join("cgroup.controllers").exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no cgroup v2 at {CGROUP_ROOT}"),
        ));
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // std opens with O_CLOEXEC: the descriptor survives fork (for the child's write) but
    // never reaches a workload program.
    let procs = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))?;
    Ok(Cgroup {
        dir: dir.to_owned(),
        procs: procs.into(),
    })
}

impl Workload {
    /// Creates (or reuses) the workload cgroup. `host_safe` (development channel): none.
    /// Logs once when there is none.
    pub fn setup(host_safe: bool) -> Workload {
        let cgroup = if host_safe {
            tracing::info!("development channel: no workload cgroup");
            None
        } else {
            match create(Path::new(WORKLOAD_CGROUP)) {
                Ok(c) => {
                    tracing::info!(cgroup = WORKLOAD_CGROUP, "workload cgroup ready");
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!(cgroup = WORKLOAD_CGROUP, error = %e, "no workload cgroup; processes run in the daemon's cgroup and the workload cannot be frozen");
                    None
                }
            }
        };
        Workload {
            cgroup,
            gate: RwLock::new(()),
            frozen: AtomicBool::new(false),
            op: tokio::sync::Mutex::new(()),
        }
    }

    /// Permission to start a process now: `None` while the workload is frozen. Hold it
    /// until the child has exec'd (i.e. across the spawn).
    pub fn spawn_permit(&self) -> Option<RwLockReadGuard<'_, ()>> {
        let guard = self.gate.read().unwrap_or_else(|p| p.into_inner());
        (!self.frozen.load(Ordering::Acquire)).then_some(guard)
    }

    /// The open `cgroup.procs` a child writes "0" to, to move itself into the workload.
    pub fn procs_fd(&self) -> Option<RawFd> {
        self.cgroup.as_ref().map(|c| c.procs.as_raw_fd())
    }

    /// Freezes the workload; returns once `cgroup.events` says frozen (undoes the freeze
    /// and fails after [`WORKLOAD_FREEZE_WAIT_MS`]).
    pub async fn freeze(self: &Arc<Self>) -> Result<(), WorkloadError> {
        let dir = self
            .cgroup
            .as_ref()
            .ok_or(WorkloadError::Unavailable)?
            .dir
            .clone();
        let _op = self.op.lock().await;
        let me = self.clone();
        let freeze_file = dir.join("cgroup.freeze");
        tokio::task::spawn_blocking(move || {
            let _gate = me.gate.write().unwrap_or_else(|p| p.into_inner());
            write_file(&freeze_file, "1")?;
            me.frozen.store(true, Ordering::Release);
            Ok::<_, WorkloadError>(())
        })
        .await??;

        let events = dir.join("cgroup.events");
        let wait = async {
            loop {
                match read_small(&events) {
                    Ok(text) if parse_frozen(&text) == Some(true) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => return Err(io_step(format!("read {}", events.display()))(e)),
                }
                tokio::time::sleep(FREEZE_POLL).await;
            }
        };
        let res = tokio::time::timeout(Duration::from_millis(WORKLOAD_FREEZE_WAIT_MS), wait)
            .await
            .unwrap_or(Err(WorkloadError::FreezeTimeout));
        if res.is_err() {
            if let Err(e) = self.thaw_locked(&dir) {
                tracing::warn!(error = %e, "cannot thaw the workload after a failed freeze");
            }
        }
        res
    }

    /// Thaws the workload. Not frozen, or no workload cgroup: nothing to do.
    pub async fn thaw(&self) -> Result<(), WorkloadError> {
        let Some(c) = &self.cgroup else {
            return Ok(());
        };
        let _op = self.op.lock().await;
        self.thaw_locked(&c.dir)
    }

    fn thaw_locked(&self, dir: &Path) -> Result<(), WorkloadError> {
        write_file(&dir.join("cgroup.freeze"), "0")?;
        self.frozen.store(false, Ordering::Release);
        Ok(())
    }

    /// (processes, CPU µs) of the workload cgroup and its descendants; `None` without one.
    /// Blocking.
    pub fn usage(&self) -> Option<(u32, u64)> {
        let dir = &self.cgroup.as_ref()?.dir;
        let cpu = read_small(&dir.join("cpu.stat"))
            .ok()
            .and_then(|t| parse_usage_usec(&t))
            .unwrap_or(0);
        let mut processes = 0u32;
        let mut todo = vec![dir.clone()];
        let mut visited = 0;
        while let Some(d) = todo.pop() {
            visited += 1;
            if visited > MAX_CGROUPS_WALKED {
                break;
            }
            if let Ok(text) = read_small(&d.join("cgroup.procs")) {
                processes = processes.saturating_add(count_procs(&text));
            }
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(e.path());
                }
            }
        }
        Some((processes, cpu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cgroup_files() {
        assert_eq!(parse_frozen("populated 1\nfrozen 1\n"), Some(true));
        assert_eq!(parse_frozen("populated 0\nfrozen 0\n"), Some(false));
        assert_eq!(parse_frozen("populated 1\n"), None);
        let cpu = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 0\n";
        assert_eq!(parse_usage_usec(cpu), Some(123_456));
        assert_eq!(parse_usage_usec("user_usec 1\n"), None);
        assert_eq!(parse_usage_usec("usage_usec x\n"), None);
        assert_eq!(count_procs("12\n345\n\n"), 2);
        assert_eq!(count_procs(""), 0);
    }

    #[tokio::test]
    async fn without_a_cgroup() {
        let w = Arc::new(Workload::setup(true));
        assert!(w.procs_fd().is_none());
        assert!(w.spawn_permit().is_some());
        assert!(matches!(w.freeze().await, Err(WorkloadError::Unavailable)));
        w.thaw().await.unwrap();
        assert!(w.usage().is_none());
    }
}

//! A running VM: status and lifecycle over QMP, exit notification, and a kill that never
//! leaves the process behind. Dropping a [`Vm`] stops watching it but leaves QEMU running, so
//! a restarted node can adopt it again.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use qapi::{qmp, Enum};
use tokio::sync::{oneshot, watch};
use tokio::task::AbortHandle;

use crate::config::VmPaths;
use crate::error::VmmError;
use crate::exit::{exit_reason, ProcessEnd, VmExit};
use crate::process::ProcHandle;
use crate::qmp::{Qmp, QmpState};
use crate::state::{SaveOptions, SaveReport};

/// How long to wait for the exit after SIGKILL before giving up (D-state processes).
const KILL_WAIT: Duration = Duration::from_secs(30);
/// After the process ends, how long to let the event reader catch the final SHUTDOWN event.
const EVENT_DRAIN: Duration = Duration::from_secs(2);

/// What QMP `query-status` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmStatus {
    Running,
    /// Stopped by QMP `stop` (or a pause); memory kept.
    Paused,
    /// The guest shut down but QEMU has not exited yet.
    Shutdown,
    /// Any other QEMU run state, by its QMP name (e.g. `prelaunch`, `inmigrate`, `internal-error`).
    Other(String),
}

/// How a process that is not this one's child learns, once it has ended, how it ended: from
/// its parent (the node manager).
pub type ExitStatus = std::pin::Pin<Box<dyn Future<Output = ProcessEnd> + Send>>;

/// How long the exit status is waited for once the process has ended.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(5);

/// Where the exit of the process is learned from.
pub(crate) enum ExitSource {
    /// We spawned it: the reaper task reports the real exit status.
    Child(watch::Receiver<Option<ProcessEnd>>),
    /// Adopted: only the pidfd (or /proc) says it ended.
    Pidfd,
    /// Attached: the pidfd says it ended, its parent says how.
    Reported(ExitStatus),
}

/// The task copying the serial console into console.log.
pub(crate) struct ConsoleCopier {
    pub(crate) task: AbortHandle,
    /// Resolves (with an error) once the copier has ended, i.e. written all QEMU sent.
    pub(crate) drained: oneshot::Receiver<()>,
}

/// Aborts the VM's background tasks when the [`Vm`] goes away.
#[derive(Default)]
pub(crate) struct Tasks {
    handles: Vec<AbortHandle>,
    /// The console copier, apart: [`Vm::release`] keeps it running.
    console: Option<AbortHandle>,
    console_drained: Option<oneshot::Receiver<()>>,
}

impl Tasks {
    pub(crate) fn push(&mut self, handle: AbortHandle) {
        self.handles.push(handle);
    }

    pub(crate) fn push_console(&mut self, copier: ConsoleCopier) {
        self.console = Some(copier.task);
        self.console_drained = Some(copier.drained);
    }

    /// Lets the tasks run on by themselves (each ends with its VMM).
    pub(crate) fn detach(mut self) {
        self.handles.clear();
        self.console = None;
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in self.handles.iter().chain(&self.console) {
            t.abort();
        }
    }
}

/// A VMM this process launched and then handed over ([`Vm::release`]): another process
/// controls it over QMP; this one still reaps it when it exits (and undoes its confinement),
/// copies its console into `console.log`, and may kill it.
pub struct ReleasedVm {
    name: String,
    proc: Arc<ProcHandle>,
    /// The reaper's report: set once the process is reaped and its confinement undone.
    reaped: Option<watch::Receiver<Option<ProcessEnd>>>,
    console: Option<AbortHandle>,
}

impl std::fmt::Debug for ReleasedVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleasedVm")
            .field("name", &self.name)
            .field("pid", &self.proc.pid())
            .finish()
    }
}

impl ReleasedVm {
    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Whether the process still runs.
    pub fn is_running(&self) -> bool {
        crate::procfs::is_alive(self.proc.pid())
    }

    /// Whether it has ended and been reaped, its lent files given back (see
    /// [`ReleasedVm::reaped`]).
    pub fn is_reaped(&self) -> bool {
        match &self.reaped {
            Some(rx) => rx.borrow().is_some(),
            None => !self.is_running(),
        }
    }

    /// SIGKILL, then waits until the process is gone.
    pub async fn kill(&self) -> Result<(), VmmError> {
        if !self.is_running() {
            return Ok(());
        }
        tracing::warn!(vm = %self.name, pid = self.pid(), "killing a VMM that did not quit");
        sigkill(&self.proc)?;
        tokio::time::timeout(KILL_WAIT, self.proc.wait_exit())
            .await
            .map_err(|_| survived_sigkill(self.pid()))
    }

    /// How it ended, once reaped.
    pub fn end(&self) -> Option<ProcessEnd> {
        self.reaped.as_ref().and_then(|rx| *rx.borrow())
    }

    /// Resolves once the process has exited and been reaped, and what its start lent it
    /// (its disk, its memory file) is given back, with how it ended (`None` if the reaper
    /// is gone): before then, a new VMM of the same sandbox must not be lent the same
    /// files. Borrows nothing, so it can be awaited without holding whatever holds `self`.
    pub fn reaped(&self) -> impl Future<Output = Option<ProcessEnd>> + Send + 'static {
        let (rx, proc) = (self.reaped.clone(), self.proc.clone());
        async move {
            if let Some(mut rx) = rx {
                if let Ok(end) = rx.wait_for(Option::is_some).await {
                    return *end;
                }
            }
            proc.wait_exit().await;
            None
        }
    }
}

impl Drop for ReleasedVm {
    fn drop(&mut self) {
        if let Some(c) = &self.console {
            c.abort();
        }
    }
}

/// A VM whose QEMU process this node watches.
pub struct Vm {
    name: String,
    paths: VmPaths,
    proc: Arc<ProcHandle>,
    qmp: Qmp,
    qmp_state: Arc<QmpState>,
    exit_rx: watch::Receiver<Option<VmExit>>,
    kill_lock: tokio::sync::Mutex<()>,
    /// Set before kill() falls back to SIGKILL, so the exit reason can say so.
    sigkilled: Arc<AtomicBool>,
    /// The reaper's report, for a VMM this process spawned (see [`ReleasedVm`]).
    reaped: Option<watch::Receiver<Option<ProcessEnd>>>,
    _tasks: Tasks,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("name", &self.name)
            .field("pid", &self.proc.pid())
            .field("run_dir", &self.paths.run_dir)
            .finish()
    }
}

impl Vm {
    /// Assembles a VM and starts its exit monitor; `tasks` already holds the QMP event reader
    /// and the console copier.
    pub(crate) fn new(
        name: String,
        paths: VmPaths,
        proc: Arc<ProcHandle>,
        qmp: Qmp,
        qmp_state: Arc<QmpState>,
        source: ExitSource,
        mut tasks: Tasks,
    ) -> Vm {
        let (exit_tx, exit_rx) = watch::channel(None);
        let sigkilled = Arc::new(AtomicBool::new(false));
        let reaped = match &source {
            ExitSource::Child(rx) => Some(rx.clone()),
            ExitSource::Pidfd | ExitSource::Reported(_) => None,
        };
        let monitor = tokio::spawn(monitor(
            name.clone(),
            paths.clone(),
            proc.clone(),
            Outputs {
                qmp: qmp_state.clone(),
                console_drained: tasks.console_drained.take(),
            },
            source,
            sigkilled.clone(),
            exit_tx,
        ));
        tasks.push(monitor.abort_handle());
        Vm {
            name,
            paths,
            proc,
            qmp,
            qmp_state,
            exit_rx,
            kill_lock: tokio::sync::Mutex::new(()),
            sigkilled,
            reaped,
            _tasks: tasks,
        }
    }

    /// The VM name (sandbox id) given at launch.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Pid of the QEMU process.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn paths(&self) -> &VmPaths {
        &self.paths
    }

    /// The exit, if it has already been noticed.
    pub fn exit_now(&self) -> Option<VmExit> {
        self.exit_rx.borrow().clone()
    }

    /// QMP `query-status`. Fails with [`VmmError::Exited`] once the process is gone.
    pub async fn status(&self) -> Result<VmStatus, VmmError> {
        self.ensure_running()?;
        match self.qmp.execute(qmp::query_status {}).await {
            Ok(info) => Ok(match info.status {
                qmp::RunState::running => VmStatus::Running,
                qmp::RunState::paused => VmStatus::Paused,
                qmp::RunState::shutdown => VmStatus::Shutdown,
                other => VmStatus::Other(other.name().to_owned()),
            }),
            Err(e) => Err(self.explain(e)),
        }
    }

    /// Pauses the vCPUs (QMP `stop`); memory stays resident.
    pub async fn pause(&self) -> Result<(), VmmError> {
        self.ensure_running()?;
        self.qmp
            .execute(qmp::stop {})
            .await
            .map(drop)
            .map_err(|e| self.explain(e))
    }

    /// Resumes paused vCPUs (QMP `cont`).
    pub async fn resume(&self) -> Result<(), VmmError> {
        self.ensure_running()?;
        self.qmp
            .execute(qmp::cont {})
            .await
            .map(drop)
            .map_err(|e| self.explain(e))
    }

    /// Saves the VM's state into `out`, a file or a pipe (see [`SaveOptions`]). On success
    /// the VM is left paused, so the caller can snapshot the disk at the same instant; it
    /// then calls [`Vm::resume`]. On failure the VM runs on as before.
    pub async fn save_state(
        &self,
        out: std::os::fd::BorrowedFd<'_>,
        opts: SaveOptions,
    ) -> Result<SaveReport, VmmError> {
        self.ensure_running()?;
        crate::state::save(&self.qmp, out, opts)
            .await
            .map_err(|e| self.explain_migration(e))
    }

    /// Feeds saved state from `state` (a file, or a pipe) into a VM launched with
    /// [`crate::RestoreFrom`], within `timeout`. The VM is left paused: the caller checks
    /// that what fed it was whole (a sealed state opens chunk by chunk) before
    /// [`Vm::resume`].
    pub async fn load_state(
        &self,
        state: std::os::fd::BorrowedFd<'_>,
        ignore_shared: bool,
        timeout: Duration,
    ) -> Result<(), VmmError> {
        self.ensure_running()?;
        let deadline = tokio::time::Instant::now() + timeout;
        crate::state::restore(&self.qmp, state, ignore_shared, deadline)
            .await
            .map_err(|e| self.explain_migration(e))
    }

    /// QEMU 7.2 gives no detail of a failed migration over QMP; its stderr does.
    fn explain_migration(&self, e: VmmError) -> VmmError {
        match self.explain(e) {
            VmmError::Migration(msg) => {
                let log = crate::console::tail_of(&self.paths.vmm_log, 512)
                    .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
                    .unwrap_or_default();
                VmmError::Migration(format!("{msg}; QEMU said: {log}"))
            }
            other => other,
        }
    }

    /// Cancels a state save left running (by a node process that died mid-checkpoint) and
    /// waits for it to end. The VM may then be paused; call [`Vm::resume`].
    pub async fn cancel_save(&self) -> Result<(), VmmError> {
        self.ensure_running()?;
        crate::state::cancel(&self.qmp)
            .await
            .map_err(|e| self.explain(e))
    }

    /// How long the vCPUs were stopped the last time they stopped and started again, by
    /// QEMU's own event timestamps: the pause the guest saw.
    pub fn last_pause(&self) -> Option<Duration> {
        let changes = self.qmp_state.run_changes();
        changes.resumed?.checked_sub(changes.stopped?)
    }

    /// Tells the guest its disk grew to `bytes` (the file must already have that size).
    pub async fn resize_root_disk(&self, bytes: u64) -> Result<(), VmmError> {
        self.ensure_running()?;
        let size = i64::try_from(bytes)
            .map_err(|_| VmmError::InvalidConfig(format!("disk size {bytes} too large")))?;
        self.qmp
            .execute(qmp::block_resize {
                device: Some(crate::qemu_args::ROOT_DRIVE.to_owned()),
                node_name: None,
                size,
            })
            .await
            .map(drop)
            .map_err(|e| self.explain(e))
    }

    /// Resolves when the VMM process has exited, with how. Keep the `Vm` alive while waiting:
    /// once it is dropped nobody watches the process and this resolves with a reason saying so.
    pub fn exited(&self) -> impl Future<Output = VmExit> + Send + 'static {
        let mut rx = self.exit_rx.clone();
        async move {
            loop {
                if let Some(exit) = rx.borrow_and_update().clone() {
                    return exit;
                }
                if rx.changed().await.is_err() {
                    return rx.borrow().clone().unwrap_or_else(|| VmExit {
                        reason: "exit monitoring stopped: the Vm handle was dropped".into(),
                        at: SystemTime::now(),
                    });
                }
            }
        }
    }

    /// Gives up control of a VM this process launched, so that another process may connect
    /// to its QMP socket ([`crate::attach`]): closes this process's QMP connection and stops
    /// watching, but keeps reaping it and copying its console (see [`ReleasedVm`]).
    pub fn release(self) -> ReleasedVm {
        let Vm {
            name,
            proc,
            qmp,
            reaped,
            mut _tasks,
            ..
        } = self;
        let console = _tasks.console.take();
        // Aborting the event reader drops the socket's read half; with `qmp` the write half.
        drop(_tasks);
        drop(qmp);
        ReleasedVm {
            name,
            proc,
            reaped,
            console,
        }
    }

    /// Stops the VM for good: QMP `quit`, up to `grace` for QEMU to exit, then SIGKILL and
    /// wait. Idempotent; returns once the process is gone (and reaped, if it is our child).
    pub async fn kill(&self, grace: Duration) -> Result<(), VmmError> {
        let proc = self.proc.clone();
        self.kill_with(grace, || async move { sigkill(&proc) })
            .await
    }

    /// [`Vm::kill`] with `force` in place of this process's SIGKILL: for a VMM another,
    /// more privileged, process must kill (the node manager's).
    pub async fn kill_with<F, Fut>(&self, grace: Duration, force: F) -> Result<(), VmmError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), VmmError>>,
    {
        let _one_at_a_time = self.kill_lock.lock().await;
        if self.exit_now().is_some() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + grace;
        match tokio::time::timeout_at(deadline, self.qmp.execute(qmp::quit {})).await {
            Ok(Ok(_)) => tracing::debug!(vm = %self.name, "QMP quit accepted"),
            // QEMU may close the socket before replying; the exit wait below decides.
            Ok(Err(e)) => tracing::debug!(vm = %self.name, error = %e, "QMP quit failed"),
            Err(_) => {}
        }
        if tokio::time::timeout_at(deadline, self.wait_exited())
            .await
            .is_ok()
        {
            return Ok(());
        }
        tracing::warn!(vm = %self.name, pid = self.pid(), ?grace, "QEMU did not quit in time; sending SIGKILL");
        self.sigkilled.store(true, Ordering::SeqCst);
        force().await?;
        tokio::time::timeout(KILL_WAIT, self.wait_exited())
            .await
            .map_err(|_| survived_sigkill(self.pid()))
    }

    /// Resident set size of the QEMU process (VmRSS), while it runs.
    pub fn rss_bytes(&self) -> Option<u64> {
        if self.exit_now().is_some() {
            return None;
        }
        crate::procfs::rss_bytes(self.pid())
    }

    async fn wait_exited(&self) {
        let mut rx = self.exit_rx.clone();
        if rx.wait_for(Option::is_some).await.is_err() {
            // The monitor is gone (cannot happen while self lives); fall back to the pidfd.
            self.proc.wait_exit().await;
        }
    }

    fn ensure_running(&self) -> Result<(), VmmError> {
        match self.exit_now() {
            Some(exit) => Err(VmmError::Exited(exit.reason)),
            None => Ok(()),
        }
    }

    /// A QMP failure while the process is exiting is better reported as the exit.
    fn explain(&self, e: VmmError) -> VmmError {
        match self.exit_now() {
            Some(exit) => VmmError::Exited(exit.reason),
            None => e,
        }
    }
}

/// SIGKILL to the VMM.
fn sigkill(proc: &ProcHandle) -> Result<(), VmmError> {
    proc.signal(libc::SIGKILL)
        .map(drop)
        .map_err(|e| VmmError::io(format!("SIGKILL pid {}", proc.pid()), e))
}

/// A VMM still there [`KILL_WAIT`] after its SIGKILL (stuck in the kernel).
fn survived_sigkill(pid: u32) -> VmmError {
    VmmError::KillFailed(format!("pid {pid} still there {KILL_WAIT:?} after SIGKILL"))
}

/// What a VM's output readers leave behind when QEMU exits, to be drained before the exit
/// is published.
struct Outputs {
    qmp: Arc<QmpState>,
    console_drained: Option<oneshot::Receiver<()>>,
}

/// Waits for the process to end, then publishes why (after removing its stale sockets).
async fn monitor(
    name: String,
    paths: VmPaths,
    proc: Arc<ProcHandle>,
    outputs: Outputs,
    source: ExitSource,
    sigkilled: Arc<AtomicBool>,
    exit_tx: watch::Sender<Option<VmExit>>,
) {
    let Outputs {
        qmp: qmp_state,
        console_drained,
    } = outputs;
    let attached = matches!(source, ExitSource::Reported(_));
    let end = match source {
        ExitSource::Child(mut rx) => {
            let reported = rx
                .wait_for(Option::is_some)
                .await
                .map(|end| *end)
                .ok()
                .flatten();
            match reported {
                Some(end) => end,
                None => {
                    // The reaper vanished without a status (runtime shutting down): use the pidfd.
                    proc.wait_exit().await;
                    ProcessEnd::Unknown
                }
            }
        }
        ExitSource::Pidfd => {
            proc.wait_exit().await;
            ProcessEnd::Unknown
        }
        ExitSource::Reported(status) => {
            proc.wait_exit().await;
            tokio::time::timeout(EXIT_STATUS_WAIT, status)
                .await
                .unwrap_or(ProcessEnd::Unknown)
        }
    };
    // QEMU writes SHUTDOWN before exiting, but our reader may not have processed it yet; the
    // socket is at EOF now, so draining it is quick. The same holds for the console: whoever
    // reads console.log after the exit (a failure reason, say) must see the guest's last words.
    let console = async {
        if let Some(drained) = console_drained {
            let _ = drained.await;
        }
    };
    let _ = tokio::time::timeout(
        EVENT_DRAIN,
        futures::future::join(qmp_state.wait_closed(), console),
    )
    .await;
    let reason = exit_reason(
        qmp_state.shutdown().as_ref(),
        end,
        sigkilled.load(Ordering::SeqCst),
    );
    if !attached {
        // An attached VM's launcher (the node manager) removes them; its run directory is
        // not this process's to write.
        paths.remove_runtime_files();
    }
    tracing::info!(vm = %name, pid = proc.pid(), %reason, "VM exited");
    exit_tx.send_replace(Some(VmExit {
        reason,
        at: SystemTime::now(),
    }));
}

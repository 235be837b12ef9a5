//! The QEMU microvm backend: spawns QEMU detached from our process (so VMs survive a node
//! restart), brings it up paused, attaches QMP and the console, then lets the guest run; and
//! re-adopts a QEMU started by an earlier process.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use qapi::qmp;
use tokio::net::UnixStream;
use tokio::process::Child;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{self, VmConfig, VmPaths};
use crate::console::{self, RotatingLog, CONSOLE_LOG_MAX_BYTES};
use crate::error::VmmError;
use crate::exit::ProcessEnd;
use crate::process::ProcHandle;
use crate::procfs;
use crate::qemu_args::{self, CONSOLE_CHARDEV};
use crate::qmp::{self as qmp_conn, Qmp, QmpState};
use crate::vm::{ConsoleCopier, ExitSource, Tasks, Vm};
use crate::{Accel, Vmm};

/// From spawn to a QMP greeting; QEMU needs ~50 ms, but the host may be very busy.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Reconnecting QMP to an already running QEMU.
const ADOPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for QEMU to accept our console connection before letting the guest run.
const CONSOLE_ATTACH_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of vmm.log goes into a start failure message.
const LOG_TAIL_BYTES: usize = 2048;

/// Runs VMs with `qemu-system-x86_64 -M microvm`.
#[derive(Debug, Clone)]
pub struct QemuVmm {
    binary: PathBuf,
}

impl Default for QemuVmm {
    fn default() -> Self {
        Self::new()
    }
}

impl QemuVmm {
    /// Uses `qemu-system-x86_64` from PATH.
    pub fn new() -> Self {
        Self::with_binary("qemu-system-x86_64")
    }

    pub fn with_binary(binary: impl Into<PathBuf>) -> Self {
        QemuVmm {
            binary: binary.into(),
        }
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The exact command line `launch` would run for `cfg` (for logs and reports).
    pub async fn command_line(&self, cfg: &VmConfig) -> String {
        let tsc = match cfg.accel {
            Accel::Tcg => crate::tsc::host_tsc_khz().await,
            Accel::Kvm => None,
        };
        let args = qemu_args::qemu_args(cfg, &VmPaths::new(&cfg.run_dir), tsc);
        qemu_args::display_command(self.binary.as_os_str(), &args)
    }

    fn spawn(&self, cfg: &VmConfig, paths: &VmPaths, tsc: Option<u64>) -> Result<Child, VmmError> {
        let log = std::fs::File::create(&paths.vmm_log)
            .map_err(|e| VmmError::io(format!("create {}", paths.vmm_log.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| VmmError::io("duplicate vmm.log handle", e))?;
        let args = qemu_args::qemu_args(cfg, paths, tsc);
        tracing::info!(
            vm = %cfg.name,
            accel = %cfg.accel,
            command = %qemu_args::display_command(self.binary.as_os_str(), &args),
            "starting QEMU"
        );
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(false);
        // Opened here (close-on-exec): the child only calls setns on it.
        let netns = match &cfg.network {
            Some(net) => Some(std::fs::File::open(&net.netns).map_err(|e| {
                VmmError::io(format!("open network namespace {}", net.netns.display()), e)
            })?),
            None => None,
        };
        let netns_fd = netns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        // SAFETY: setsid(2) and setns(2) are async-signal-safe and touch no memory; the fd
        // stays open until spawn returns (`netns` lives past it). A new session keeps QEMU
        // out of our process group and terminal, so signals aimed at the node (Ctrl-C, a
        // service manager stopping it) do not take the VMs down with it.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = netns_fd {
                    if libc::setns(fd, libc::CLONE_NEWNET) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| VmmError::Spawn {
            binary: self.binary.clone(),
            source,
        });
        drop(netns);
        child
    }
}

#[async_trait::async_trait]
impl Vmm for QemuVmm {
    fn kind(&self) -> &'static str {
        "qemu"
    }

    async fn launch(&self, cfg: &VmConfig) -> Result<Vm, VmmError> {
        config::validate(cfg)?;
        let paths = VmPaths::new(&cfg.run_dir);
        tokio::fs::create_dir_all(&paths.run_dir)
            .await
            .map_err(|e| VmmError::io(format!("create run dir {}", paths.run_dir.display()), e))?;
        refuse_if_running(&cfg.name, &paths)?;
        // QEMU would silently take over socket paths left by a dead VM; start clean.
        paths.remove_runtime_files();
        let tsc = match cfg.accel {
            Accel::Tcg => crate::tsc::host_tsc_khz().await,
            Accel::Kvm => None,
        };

        let child = self.spawn(cfg, &paths, tsc)?;
        let pid = child.id().ok_or_else(|| VmmError::StartFailed {
            detail: "QEMU exited at once".into(),
        })?;
        // The child cannot be reaped before the reaper runs, so this pidfd is surely QEMU's.
        let proc = match ProcHandle::open(pid) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                // Dropping the Child would leave a zombie for tokio's orphan reaper; kill first.
                let mut child = child;
                let _ = child.kill().await;
                return Err(VmmError::io(format!("open pidfd for pid {pid}"), e));
            }
        };
        let mut status_rx = spawn_reaper(cfg.name.clone(), child);
        // If the caller drops this future mid-start, nobody would ever `cont` or kill the
        // paused QEMU; the guard kills it (the reaper task still reaps it).
        let mut cancel_guard = KillOnCancel(Some(proc.clone()));

        let started = start(cfg, &paths, &proc, &status_rx).await;
        cancel_guard.0 = None;
        match started {
            Ok((qmp, qmp_state, tasks)) => {
                tracing::info!(vm = %cfg.name, pid, "VM running");
                Ok(Vm::new(
                    cfg.name.clone(),
                    paths,
                    proc,
                    qmp,
                    qmp_state,
                    ExitSource::Child(status_rx),
                    tasks,
                ))
            }
            Err(e) => {
                // A QEMU that fails (bad kernel, bad option) exits right after closing QMP;
                // give the reaper a moment so the error can say "exited" with QEMU's words.
                let exited_by_itself = tokio::time::timeout(
                    Duration::from_secs(1),
                    status_rx.wait_for(Option::is_some),
                )
                .await
                .is_ok_and(|r| r.is_ok());
                if !exited_by_itself {
                    if let Err(kill_err) = proc.signal(libc::SIGKILL) {
                        tracing::warn!(vm = %cfg.name, pid, error = %kill_err, "cannot kill failed QEMU");
                    }
                }
                let _ = tokio::time::timeout(
                    Duration::from_secs(10),
                    status_rx.wait_for(Option::is_some),
                )
                .await;
                paths.remove_runtime_files();
                let tail = log_tail(&paths.vmm_log);
                Err(if exited_by_itself || matches!(e, VmmError::Exited(_)) {
                    VmmError::StartFailed { detail: tail }
                } else {
                    tracing::warn!(vm = %cfg.name, error = %e, vmm_log = %tail, "VM start failed");
                    e
                })
            }
        }
    }

    fn names_under(&self, run_root: &Path) -> Vec<String> {
        procfs::qemu_names_under(run_root)
    }

    async fn kill_strays(&self, name: &str) -> Result<usize, VmmError> {
        config::validate_name(name)?;
        let mut killed = 0;
        for pid in procfs::our_qemus(name) {
            let proc = match ProcHandle::open(pid) {
                Ok(p) => p,
                Err(_) => continue, // already gone
            };
            // The pidfd pins the process: check again that it is ours before the signal.
            if !matches!(procfs::verify_our_qemu(pid, name), Ok(Ok(()))) {
                continue;
            }
            tracing::warn!(vm = %name, pid, "killing a stray VMM");
            proc.signal(libc::SIGKILL)
                .map_err(|e| VmmError::io(format!("SIGKILL pid {pid}"), e))?;
            tokio::time::timeout(Duration::from_secs(30), proc.wait_exit())
                .await
                .map_err(|_| {
                    VmmError::KillFailed(format!("pid {pid} still there after SIGKILL"))
                })?;
            killed += 1;
        }
        Ok(killed)
    }

    async fn adopt(&self, name: &str, run_dir: &Path) -> Result<Vm, VmmError> {
        config::validate_name(name)?;
        let paths = VmPaths::new(run_dir);
        let pid = match procfs::read_pidfile(&paths.pidfile) {
            Ok(pid) => pid,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(VmmError::NotRunning(format!(
                    "no pidfile at {}",
                    paths.pidfile.display()
                )))
            }
            Err(e) => {
                return Err(VmmError::NotRunning(format!(
                    "unusable pidfile {}: {e}",
                    paths.pidfile.display()
                )))
            }
        };
        check_ours(pid, name)?;
        let proc = match ProcHandle::open(pid) {
            Ok(p) => Arc::new(p),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(VmmError::NotRunning(format!("pid {pid} has exited")))
            }
            Err(e) => return Err(VmmError::io(format!("open pidfd for pid {pid}"), e)),
        };
        // The pid could have been recycled between the check and pidfd_open; the pidfd pins
        // the process, so checking again makes the identity certain.
        check_ours(pid, name)?;

        let deadline = Instant::now() + ADOPT_TIMEOUT;
        let (qmp, events) =
            Qmp::connect(name, &paths.qmp, deadline, || procfs::is_alive(pid)).await?;
        let qmp_state = QmpState::new();
        let mut tasks = Tasks::default();
        tasks.push(
            tokio::spawn(qmp_conn::run_events(
                name.to_owned(),
                events,
                qmp_state.clone(),
            ))
            .abort_handle(),
        );
        // Output the guest wrote while nobody was connected is lost; from now on it is kept.
        match attach_console(name, &paths).await {
            Ok(copier) => tasks.push_console(copier),
            Err(e) => {
                tracing::warn!(vm = %name, error = %e, "cannot reattach console; console.log will not grow")
            }
        }
        tracing::info!(vm = %name, pid, "adopted running VM");
        Ok(Vm::new(
            name.to_owned(),
            paths,
            proc,
            qmp,
            qmp_state,
            ExitSource::Pidfd,
            tasks,
        ))
    }
}

/// QMP up, console attached, guest running. On error the caller kills QEMU.
async fn start(
    cfg: &VmConfig,
    paths: &VmPaths,
    proc: &Arc<ProcHandle>,
    status_rx: &watch::Receiver<Option<ProcessEnd>>,
) -> Result<(Qmp, Arc<QmpState>, Tasks), VmmError> {
    let deadline = Instant::now() + START_TIMEOUT;
    let alive = || status_rx.borrow().is_none();
    let (qmp, events) = Qmp::connect(&cfg.name, &paths.qmp, deadline, alive).await?;
    let qmp_state = QmpState::new();
    let mut tasks = Tasks::default();
    tasks.push(
        tokio::spawn(qmp_conn::run_events(
            cfg.name.clone(),
            events,
            qmp_state.clone(),
        ))
        .abort_handle(),
    );
    // QMP answering means QEMU has created all its sockets, including the console's.
    tasks.push_console(attach_console(&cfg.name, paths).await?);
    wait_console_attached(&qmp).await?;
    if !alive() {
        return Err(VmmError::Exited(
            "QEMU exited before the guest started".into(),
        ));
    }
    if let Some(from) = &cfg.restore {
        crate::state::restore(&qmp, &from.state, from.ignore_shared, deadline).await?;
        if from.paused {
            tracing::debug!(vm = %cfg.name, pid = proc.pid(), "state loaded; VM left paused");
            return Ok((qmp, qmp_state, tasks));
        }
    }
    qmp.execute(qmp::cont {}).await?;
    let status = qmp.execute(qmp::query_status {}).await?;
    if !matches!(status.status, qmp::RunState::running) {
        use qapi::Enum;
        return Err(VmmError::Qmp(format!(
            "guest is {} instead of running after cont",
            status.status.name()
        )));
    }
    tracing::debug!(vm = %cfg.name, pid = proc.pid(), "guest started");
    Ok((qmp, qmp_state, tasks))
}

/// Connects to the console socket and starts copying it into console.log.
async fn attach_console(name: &str, paths: &VmPaths) -> Result<ConsoleCopier, VmmError> {
    let stream = UnixStream::connect(&paths.console).await.map_err(|e| {
        VmmError::io(
            format!("connect console socket {}", paths.console.display()),
            e,
        )
    })?;
    let log = RotatingLog::open(&paths.console_log, CONSOLE_LOG_MAX_BYTES)
        .await
        .map_err(|e| VmmError::io(format!("open {}", paths.console_log.display()), e))?;
    let (drained_tx, drained) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(console::copy_console(
        name.to_owned(),
        stream,
        log,
        drained_tx,
    ));
    Ok(ConsoleCopier {
        task: task.abort_handle(),
        drained,
    })
}

/// QEMU accepts socket clients from its main loop; until it has accepted ours, serial output
/// would be dropped. `query-chardev` shows a "disconnected:" filename until then.
async fn wait_console_attached(qmp: &Qmp) -> Result<(), VmmError> {
    let deadline = Instant::now() + CONSOLE_ATTACH_TIMEOUT;
    loop {
        let chardevs = qmp.execute(qmp::query_chardev {}).await?;
        let attached = chardevs
            .iter()
            .any(|c| c.label == CONSOLE_CHARDEV && !c.filename.starts_with("disconnected:"));
        if attached {
            return Ok(());
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                "QEMU has not accepted the console connection; early console output may be lost"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Kills a half-started QEMU when `launch` is cancelled.
struct KillOnCancel(Option<Arc<ProcHandle>>);

impl Drop for KillOnCancel {
    fn drop(&mut self) {
        if let Some(proc) = self.0.take() {
            tracing::warn!(pid = proc.pid(), "VM launch cancelled; killing QEMU");
            if let Err(e) = proc.signal(libc::SIGKILL) {
                tracing::warn!(pid = proc.pid(), error = %e, "cannot kill QEMU of a cancelled launch");
            }
        }
    }
}

/// Owns the child and reaps it, so no zombie stays behind even if the `Vm` is dropped.
fn spawn_reaper(name: String, mut child: Child) -> watch::Receiver<Option<ProcessEnd>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let end = match child.wait().await {
            Ok(status) => ProcessEnd::from(status),
            Err(e) => {
                tracing::warn!(vm = %name, error = %e, "waiting for QEMU failed");
                ProcessEnd::Unknown
            }
        };
        tracing::debug!(vm = %name, ?end, "QEMU reaped");
        tx.send_replace(Some(end));
    });
    rx
}

/// A second QEMU in the same run dir would steal the first one's sockets.
fn refuse_if_running(name: &str, paths: &VmPaths) -> Result<(), VmmError> {
    let Ok(pid) = procfs::read_pidfile(&paths.pidfile) else {
        return Ok(());
    };
    if procfs::is_alive(pid) && matches!(procfs::verify_our_qemu(pid, name), Ok(Ok(()))) {
        return Err(VmmError::AlreadyRunning {
            name: name.to_owned(),
            run_dir: paths.run_dir.clone(),
            pid,
        });
    }
    Ok(())
}

/// Errors unless `pid` is alive and is our QEMU for `name`.
fn check_ours(pid: u32, name: &str) -> Result<(), VmmError> {
    match procfs::verify_our_qemu(pid, name) {
        Ok(Ok(())) if procfs::is_alive(pid) => Ok(()),
        Ok(Ok(())) => Err(VmmError::NotRunning(format!("pid {pid} has exited"))),
        Ok(Err(procfs::CmdlineMismatch::Empty)) => {
            Err(VmmError::NotRunning(format!("pid {pid} has exited")))
        }
        Ok(Err(why)) => Err(VmmError::NotOurVm {
            pid,
            name: name.to_owned(),
            why: why.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(VmmError::NotRunning(format!("pid {pid} does not exist")))
        }
        Err(e) => Err(VmmError::io(format!("read /proc/{pid}/cmdline"), e)),
    }
}

/// The end of vmm.log for error messages.
fn log_tail(path: &Path) -> String {
    match console::tail_of(path, LOG_TAIL_BYTES) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let text = text.trim();
            if text.is_empty() {
                "(vmm.log is empty)".to_owned()
            } else {
                text.to_owned()
            }
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

//! The QEMU microvm backend: spawns QEMU detached from our process (so VMs survive a node
//! restart), brings it up paused, attaches QMP and the console, then lets the guest run; and
//! re-adopts a QEMU started by an earlier process.

use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use qapi::qmp;
use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{self, VmConfig, VmPaths};
use crate::console::{self, RotatingLog, CONSOLE_LOG_MAX_BYTES};
use crate::error::VmmError;
use crate::exit::ProcessEnd;
use crate::jail::{
    self, BlockDevices, JailConfig, JailedFiles, MemoryImages, PassedMemory, VmCgroup,
};
use crate::process::ProcHandle;
use crate::procfs;
use crate::qemu_args::{self, CONSOLE_CHARDEV};
use crate::qmp::{self as qmp_conn, Qmp, QmpState};
use crate::vm::{ConsoleCopier, ExitSource, ExitStatus, Tasks, Vm};
use crate::{Accel, Vmm};

/// From spawn to a QMP greeting; QEMU needs ~50 ms, but the host may be very busy.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Reconnecting QMP to an already running QEMU.
const ADOPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for QEMU to accept our console connection before letting the guest run.
const CONSOLE_ATTACH_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of vmm.log goes into a start failure message.
const LOG_TAIL_BYTES: usize = 2048;

/// Runs VMs with `qemu-system-x86_64 -M microvm`, each in a jail of its own (see
/// [`crate::jail`]) unless made [`QemuVmm::unjailed`].
#[derive(Debug, Clone)]
pub struct QemuVmm {
    binary: PathBuf,
    jail: Option<Arc<Jailer>>,
    /// Memory images passed to VMMs as memfds.
    images: Arc<MemoryImages>,
}

/// What jailing needs across launches.
#[derive(Debug)]
struct Jailer {
    config: JailConfig,
    devices: BlockDevices,
}

impl Default for QemuVmm {
    fn default() -> Self {
        Self::new()
    }
}

impl QemuVmm {
    /// Jailed VMMs from `qemu-system-x86_64` on PATH, with [`JailConfig::new`]'s defaults.
    pub fn new() -> Self {
        Self::jailed("qemu-system-x86_64", JailConfig::new("vmm"))
    }

    /// Every VM in a jail built by `config`.
    pub fn jailed(binary: impl Into<PathBuf>, config: JailConfig) -> Self {
        QemuVmm {
            binary: binary.into(),
            jail: Some(Arc::new(Jailer {
                config,
                devices: BlockDevices::default(),
            })),
            images: Arc::default(),
        }
    }

    /// VMMs as root in this process's namespaces, unconfined: only for measuring what the jail
    /// costs, never for serving.
    pub fn unjailed(binary: impl Into<PathBuf>) -> Self {
        QemuVmm {
            binary: binary.into(),
            jail: None,
            images: Arc::default(),
        }
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The cgroup VM `name`'s VMM runs in, when jailed.
    fn vm_cgroup(&self, name: &str) -> Option<VmCgroup> {
        self.jail
            .as_ref()
            .map(|j| VmCgroup::of(&j.config.cgroups, &j.config.cgroup_parent, name))
    }

    /// Who the files a VM is started from belong to: the jail's files owner, or this
    /// process unjailed.
    fn files_owner(&self) -> jail::FileOwner {
        self.jail
            .as_ref()
            .map_or_else(jail::FileOwner::current, |j| j.config.files_owner)
    }

    /// The descriptor of guest RAM passed to a VMM of `memory_mib` MiB.
    fn memory_fd(&self, memory: &PassedMemory, memory_mib: u32) -> Result<OwnedFd, VmmError> {
        let image = match memory {
            PassedMemory::ImageFile(path) => self
                .images
                .get(path, self.files_owner())
                .map_err(|e| VmmError::io(format!("load memory image {}", path.display()), e))?,
            PassedMemory::FillInMemory(name) => {
                return Ok(self.images.fill(name, u64::from(memory_mib) << 20)?)
            }
            PassedMemory::MapInMemory(name) => self.images.sealed(name)?,
        };
        image
            .try_clone()
            .map_err(|e| VmmError::io("pass the memory image", e))
    }

    /// The exact command line `launch` would run for `cfg` (for logs and reports).
    pub async fn command_line(&self, cfg: &VmConfig) -> String {
        let tsc = match cfg.accel {
            Accel::Tcg => crate::tsc::host_tsc_khz().await,
            Accel::Kvm => None,
        };
        let binary = resolve_binary(&self.binary).unwrap_or_else(|_| self.binary.clone());
        let (files, confined) = match &self.jail {
            Some(j) => {
                let plan = jail::plan(cfg, &j.config, &binary, None);
                (plan.files, Some(plan.disk))
            }
            None => (JailedFiles::host(cfg), None),
        };
        let args = qemu_args::qemu_args(cfg, &files, confined.as_ref(), tsc);
        qemu_args::display_command(binary.as_os_str(), &args)
    }

    /// Starts QEMU (jailed or not) and returns once it runs the VMM program, recorded in the
    /// pidfile and in its cgroup; QMP and the guest are not up yet.
    async fn spawn(
        &self,
        cfg: &VmConfig,
        paths: &VmPaths,
        tsc: Option<u64>,
        program: Program<'_>,
    ) -> Result<
        (
            Arc<ProcHandle>,
            watch::Receiver<Option<ProcessEnd>>,
            Option<u32>,
        ),
        VmmError,
    > {
        let begun = std::time::Instant::now();
        let binary = resolve_binary(&self.binary)?;
        let jail_err = |step: &str| {
            let step = step.to_owned();
            move |source| VmmError::Jail { step, source }
        };
        let mut fds: Vec<(OwnedFd, RawFd)> = vec![
            (open_null()?, 0),
            (log_file(&paths.vmm_log)?, 1),
            (log_file(&paths.vmm_log)?, 2),
            (listen(&paths.qmp)?, jail::fds::QMP),
            (listen(&paths.console)?, jail::fds::CONSOLE),
            (listen(&paths.channel)?, jail::fds::CHANNEL),
        ];
        let netns = match &cfg.network {
            Some(net) => Some(OwnedFd::from(std::fs::File::open(&net.netns).map_err(
                |e| VmmError::io(format!("open network namespace {}", net.netns.display()), e),
            )?)),
            None => None,
        };
        if let Some(memory) = jail::passed_memory(&cfg.memory, self.jail.is_some()) {
            fds.push((self.memory_fd(&memory, cfg.memory_mib)?, jail::fds::MEMORY));
        }
        let mut confinement = None;
        let (files, confined) = match &self.jail {
            None => (JailedFiles::host(cfg), None),
            Some(j) => {
                for socket in [&paths.qmp, &paths.console, &paths.channel] {
                    jail::prepare::hand_socket(socket, j.config.files_owner)
                        .map_err(jail_err("handing the VM's sockets to the sandbox manager"))?;
                }
                let lease = jail::lease_uid(j.config.uids, &j.config.uid_lock_dir)
                    .map_err(jail_err("taking a VMM uid"))?;
                let device = j.devices.of(&cfg.root_disk);
                let mut plan = jail::plan(cfg, &j.config, &binary, device);
                if let Program::Other { host, .. } = program {
                    plan.binds.push(jail::Bind::program(host, OTHER_PROGRAM));
                }
                let (steps, lent) = jail::prepare::steps(&plan, lease.uid, j.config.files_owner)
                    .map_err(jail_err("preparing the jail"))?;
                let cgroup = VmCgroup::create(
                    &j.config.cgroups,
                    &j.config.cgroup_parent,
                    &cfg.name,
                    &plan.limits,
                )
                .map_err(jail_err("creating the VMM's cgroup"))?;
                let files = plan.files.clone();
                let disk = plan.disk;
                confinement = Some((steps, lease, cgroup, lent, j.config.oom_score_adj));
                (files, Some(disk))
            }
        };
        let (exe, argv) = match program {
            Program::Vmm => {
                let args = qemu_args::qemu_args(cfg, &files, confined.as_ref(), tsc);
                tracing::info!(
                    vm = %cfg.name,
                    accel = %cfg.accel,
                    jailed = confinement.is_some(),
                    command = %qemu_args::display_command(binary.as_os_str(), &args),
                    "starting QEMU"
                );
                let mut argv = vec![binary.as_os_str().to_owned()];
                argv.extend(args);
                (binary.clone(), argv)
            }
            Program::Other { host, args } => {
                let exe = match &self.jail {
                    Some(_) => PathBuf::from(OTHER_PROGRAM),
                    None => host.to_owned(),
                };
                let mut argv = vec![exe.as_os_str().to_owned()];
                argv.extend(args.iter().cloned());
                (exe, argv)
            }
        };
        let uid = confinement.as_ref().map(|c| c.1.uid);
        let (steps, cleanup, confined_by) = match confinement {
            Some((steps, lease, cgroup, lent, oom)) => {
                fds.push((lease.lock, jail::fds::UID_LOCK));
                (
                    Some(steps),
                    ExitCleanup {
                        cgroup: Some(cgroup.clone()),
                        lent,
                        owner: Some(self.files_owner()),
                        runtime: Some(paths.clone()),
                    },
                    Some((cgroup, oom)),
                )
            }
            None => (
                None,
                ExitCleanup {
                    runtime: Some(paths.clone()),
                    ..ExitCleanup::default()
                },
                None,
            ),
        };
        let conf = jail::spawn::Confinement {
            jail: steps,
            netns,
            tap: cfg
                .network
                .as_ref()
                .map(|n| (n.tap.clone(), jail::fds::TAP)),
            fds,
        };
        let prepared = begun.elapsed();
        let spawned = jail::spawn::spawn(&exe, &argv, conf).map_err(|source| {
            cleanup.run(&cfg.name);
            VmmError::Spawn {
                binary: binary.clone(),
                source,
            }
        })?;
        let pid = spawned.pid;
        let proc = Arc::new(
            ProcHandle::from_pidfd(pid, spawned.pidfd)
                .map_err(|e| VmmError::io(format!("watch pidfd of pid {pid}"), e))?,
        );
        let status_rx = spawn_reaper(cfg.name.clone(), proc.clone(), cleanup);
        // Until the gate opens the child runs nothing: record it first, so no VMM ever runs
        // unrecorded or outside its cgroup.
        let recorded = (|| {
            write_pidfile(&paths.pidfile, pid)?;
            if let Some((cgroup, score)) = &confined_by {
                cgroup
                    .add(pid)
                    .map_err(jail_err("moving the VMM into its cgroup"))?;
                let path = format!("/proc/{pid}/oom_score_adj");
                std::fs::write(&path, score.to_string())
                    .map_err(jail_err("setting the VMM's oom_score_adj"))?;
            }
            Ok::<_, VmmError>(())
        })();
        let gate = spawned.gate;
        let released = match recorded {
            Ok(()) => tokio::task::spawn_blocking(move || gate.release())
                .await
                .map_err(|e| VmmError::io("VMM start task", std::io::Error::other(e)))?,
            Err(e) => {
                // Dropping the gate makes the child exit without running anything.
                drop(gate);
                paths.remove_runtime_files();
                return Err(e);
            }
        };
        if let Err(failure) = released {
            // A child that has not reached execve is killed (the reaper cleans up).
            if let Err(e) = proc.signal(libc::SIGKILL) {
                tracing::warn!(vm = %cfg.name, pid, error = %e, "cannot kill a VMM that failed to start");
            }
            paths.remove_runtime_files();
            let step = failure.step.map_or("starting the VMM", |s| s.describe());
            return Err(VmmError::Jail {
                step: format!("{step} (item {})", failure.index),
                source: failure.error,
            });
        }
        tracing::debug!(
            vm = %cfg.name,
            pid,
            prepare_us = prepared.as_micros() as u64,
            exec_us = (begun.elapsed() - prepared).as_micros() as u64,
            "VMM executed"
        );
        Ok((proc, status_rx, uid))
    }

    /// Runs `program` (a host path) with `args` in exactly the jail [`Vmm::launch`] would
    /// build for `cfg`, the program bound read-only at `/probe` in place of QEMU. For tests
    /// that probe the jail's walls; the process is not a VM.
    pub async fn run_in_jail(
        &self,
        cfg: &VmConfig,
        program: &Path,
        args: &[std::ffi::OsString],
    ) -> Result<JailedProcess, VmmError> {
        config::validate(cfg)?;
        let paths = VmPaths::new(&cfg.run_dir);
        tokio::fs::create_dir_all(&paths.run_dir)
            .await
            .map_err(|e| VmmError::io(format!("create run dir {}", paths.run_dir.display()), e))?;
        let (proc, exit, uid) = self
            .spawn(
                cfg,
                &paths,
                None,
                Program::Other {
                    host: program,
                    args,
                },
            )
            .await?;
        Ok(JailedProcess { proc, exit, uid })
    }
}

/// Where [`QemuVmm::run_in_jail`] puts its program inside the jail.
const OTHER_PROGRAM: &str = "/probe";

/// What a jail runs.
#[derive(Clone, Copy)]
enum Program<'a> {
    /// QEMU, for the VM of the config.
    Vmm,
    /// Another program in the same jail (tests).
    Other {
        host: &'a Path,
        args: &'a [std::ffi::OsString],
    },
}

/// A program [`QemuVmm::run_in_jail`] started.
pub struct JailedProcess {
    proc: Arc<ProcHandle>,
    exit: watch::Receiver<Option<ProcessEnd>>,
    uid: Option<u32>,
}

impl JailedProcess {
    /// Its pid, as this process sees it.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The uid it runs as (`None` unjailed: this process's).
    pub fn uid(&self) -> Option<u32> {
        self.uid
    }

    /// Kills it.
    pub fn kill(&self) -> std::io::Result<bool> {
        self.proc.signal(libc::SIGKILL)
    }

    /// Waits for its end: `Ok(exit code)`, or `Err(signal)` when a signal ended it.
    pub async fn wait(&mut self) -> Result<i32, i32> {
        match self.exit.wait_for(Option::is_some).await.map(|e| *e) {
            Ok(Some(ProcessEnd::Code(code))) => Ok(code),
            Ok(Some(ProcessEnd::Signal(sig))) => Err(sig),
            _ => Err(0),
        }
    }
}

/// What to undo once a VMM has exited: its cgroup, the files lent to its uid (given back
/// to `owner`), and its sockets and pidfile (by its launcher: a sandbox manager attached to
/// a released VM may not write the run directory).
#[derive(Debug, Default)]
struct ExitCleanup {
    cgroup: Option<VmCgroup>,
    lent: Vec<std::fs::File>,
    owner: Option<jail::FileOwner>,
    runtime: Option<VmPaths>,
}

impl ExitCleanup {
    fn run(&self, vm: &str) {
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.remove() {
                tracing::warn!(vm = %vm, error = %e, "cannot remove the VMM's cgroup");
            }
        }
        if let Some(owner) = self.owner {
            for file in &self.lent {
                jail::prepare::give_back(file, owner);
            }
        }
        if let Some(paths) = &self.runtime {
            paths.remove_runtime_files();
        }
    }
}

/// An absolute path for `binary` (execve does not search PATH).
fn resolve_binary(binary: &Path) -> Result<PathBuf, VmmError> {
    if binary.is_absolute() {
        return Ok(binary.to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| p.is_file())
        .ok_or_else(|| VmmError::Spawn {
            binary: binary.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not found on PATH"),
        })
}

fn open_null() -> Result<OwnedFd, VmmError> {
    std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| VmmError::io("open /dev/null", e))
}

fn log_file(path: &Path) -> Result<OwnedFd, VmmError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|e| VmmError::io(format!("open {}", path.display()), e))
}

/// A listening socket for QEMU to serve on (QMP, console, channel), at a fresh path.
fn listen(path: &Path) -> Result<OwnedFd, VmmError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(VmmError::io(format!("remove {}", path.display()), e))
        }
        _ => {}
    }
    std::os::unix::net::UnixListener::bind(path)
        .map(OwnedFd::from)
        .map_err(|e| VmmError::io(format!("listen on {}", path.display()), e))
}

/// The pidfile, written whole or not at all.
fn write_pidfile(path: &Path, pid: u32) -> Result<(), VmmError> {
    let tmp = path.with_extension("pid.tmp");
    std::fs::write(&tmp, format!("{pid}\n"))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| VmmError::io(format!("write {}", path.display()), e))
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

        let begun = Instant::now();
        let (proc, mut status_rx, _) = self.spawn(cfg, &paths, tsc, Program::Vmm).await?;
        let pid = proc.pid();
        let spawned = begun.elapsed();
        // If the caller drops this future mid-start, nobody would ever `cont` or kill the
        // paused QEMU; the guard kills it (the reaper task still reaps it).
        let mut cancel_guard = KillOnCancel(Some(proc.clone()));

        let started = start(cfg, &paths, &proc, &status_rx).await;
        cancel_guard.0 = None;
        match started {
            Ok((qmp, qmp_state, tasks)) => {
                tracing::info!(
                    vm = %cfg.name,
                    pid,
                    spawn_ms = spawned.as_millis() as u64,
                    start_ms = (begun.elapsed() - spawned).as_millis() as u64,
                    "VM running"
                );
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

    fn remove_stale_confinement(&self) -> usize {
        match &self.jail {
            Some(j) => jail::remove_empty_cgroups(&j.config.cgroups, &j.config.cgroup_parent),
            None => 0,
        }
    }

    fn forget_memory_image(&self, image: &str) -> bool {
        self.images.forget(image)
    }

    async fn kill_strays(&self, name: &str, run_root: &Path) -> Result<usize, VmmError> {
        config::validate_name(name)?;
        let mut killed = 0;
        for pid in procfs::our_qemus(name, run_root) {
            let proc = match ProcHandle::open(pid) {
                Ok(p) => p,
                Err(_) => continue, // already gone
            };
            // The pidfd pins the process: check again that it is ours before the signal.
            if !matches!(procfs::verify_our_qemu(pid, name), Ok(Ok(())))
                || !procfs::started_under(pid, run_root)
            {
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
        let cgroup = self.vm_cgroup(name);
        adopt(name, run_dir, Adoption::Whole { cgroup }).await
    }
}

impl QemuVmm {
    /// Takes over what the launcher of a running VMM did besides controlling it, after that
    /// launcher died: copying its console into `console.log` and removing its cgroup when
    /// it ends. For a node manager restarted under VMMs it had released (the sandbox manager
    /// keeps their QMP, so this does not connect to it). The work runs on until the VMM
    /// exits; the files lent to it go to the next VMM of its sandbox.
    pub async fn take_over_orphan(&self, name: &str, run_dir: &Path) -> Result<u32, VmmError> {
        let paths = VmPaths::new(run_dir);
        let (pid, proc) = find_running(name, &paths)?;
        let mut tasks = Tasks::default();
        take_over(name, &paths, &proc, self.vm_cgroup(name), &mut tasks).await;
        tasks.detach();
        Ok(pid)
    }
}

/// Connects to a VM another process launched and [released](Vm::release) to this one: its
/// QMP socket, and its exit by pidfd, with `status` saying how it ended. The launcher keeps
/// its console and its reaping.
pub async fn attach(name: &str, run_dir: &Path, status: ExitStatus) -> Result<Vm, VmmError> {
    adopt(name, run_dir, Adoption::ControlOnly(status)).await
}

/// How much of a running VM a process takes over.
enum Adoption {
    /// Everything its dead launcher had: control, console, and (jailed) removing its cgroup
    /// when it ends.
    Whole { cgroup: Option<VmCgroup> },
    /// Control only ([`attach`]), the exit status from the launcher.
    ControlOnly(ExitStatus),
}

async fn adopt(name: &str, run_dir: &Path, adoption: Adoption) -> Result<Vm, VmmError> {
    let paths = VmPaths::new(run_dir);
    let (pid, proc) = find_running(name, &paths)?;

    let deadline = Instant::now() + ADOPT_TIMEOUT;
    let (qmp, events) = Qmp::connect(name, &paths.qmp, deadline, || procfs::is_alive(pid)).await?;
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
    let source = match adoption {
        Adoption::ControlOnly(status) => {
            tracing::debug!(vm = %name, pid, "attached to a released VM");
            ExitSource::Reported(status)
        }
        Adoption::Whole { cgroup } => {
            take_over(name, &paths, &proc, cgroup, &mut tasks).await;
            tracing::info!(vm = %name, pid, "adopted running VM");
            ExitSource::Pidfd
        }
    };
    Ok(Vm::new(
        name.to_owned(),
        paths,
        proc,
        qmp,
        qmp_state,
        source,
        tasks,
    ))
}

/// The running QEMU of VM `name` recorded in `paths`' pidfile, pinned by a pidfd: its pid
/// and handle, or `NotRunning`.
fn find_running(name: &str, paths: &VmPaths) -> Result<(u32, Arc<ProcHandle>), VmmError> {
    config::validate_name(name)?;
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
    Ok((pid, proc))
}

/// What an adoption takes over from a launcher that died: the console, and (jailed)
/// removing the VMM's cgroup when it ends.
async fn take_over(
    name: &str,
    paths: &VmPaths,
    proc: &Arc<ProcHandle>,
    cgroup: Option<VmCgroup>,
    tasks: &mut Tasks,
) {
    // Output the guest wrote while nobody was connected is lost; from now on it is kept.
    match attach_console(name, paths).await {
        Ok(copier) => tasks.push_console(copier),
        Err(e) => {
            tracing::warn!(vm = %name, error = %e, "cannot reattach console; console.log will not grow")
        }
    }
    if let Some(cgroup) = cgroup {
        // Its start's reaper died with the node that started it; remove its cgroup when
        // it ends (the files lent to it are given to the next VMM of the sandbox).
        let watched = proc.clone();
        let vm = name.to_owned();
        tokio::spawn(async move {
            watched.wait_exit().await;
            let _ = tokio::task::spawn_blocking(move || {
                ExitCleanup {
                    cgroup: Some(cgroup),
                    ..ExitCleanup::default()
                }
                .run(&vm)
            })
            .await;
        });
    }
}

/// QMP up, console attached, guest running (or, restoring, waiting for its state). On error
/// the caller kills QEMU.
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
    if cfg.restore.is_some() {
        // Waiting for its state (`Vm::load_state`); the guest starts when that is in.
        tracing::debug!(vm = %cfg.name, pid = proc.pid(), "VM waiting for its saved state");
        return Ok((qmp, qmp_state, tasks));
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

/// Reaps the child once it exits, undoes what its start lent it, and reports how it ended,
/// so no zombie or cgroup stays behind even if the `Vm` is dropped.
fn spawn_reaper(
    name: String,
    proc: Arc<ProcHandle>,
    cleanup: ExitCleanup,
) -> watch::Receiver<Option<ProcessEnd>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        proc.wait_exit().await;
        let end = proc.reap();
        tracing::debug!(vm = %name, ?end, "QEMU reaped");
        let vm = name.clone();
        let _ = tokio::task::spawn_blocking(move || cleanup.run(&vm)).await;
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

//! Boots real microVMs under QEMU (TCG here) from the Debian cloud kernel and a tiny busybox
//! initramfs built by the test, and checks launch, console capture, exit reporting, kill,
//! and re-adoption after a simulated node restart.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use space_vmm::{detect_accel, QemuVmm, Vm, VmConfig, VmStatus, Vmm, VmmError};

/// Generous bound for a TCG boot on a busy 2-core machine; only a hang reaches it.
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

const INIT_SCRIPT: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
echo "vmm-test: hello"
case " $(/bin/busybox cat /proc/cmdline) " in
  *" vmmtest=poweroff "*) /bin/busybox poweroff -f ;;
esac
i=0
while true; do
  i=$((i+1))
  echo "vmm-test: tick $i"
  /bin/busybox sleep 1
done
"#;

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "space_vmm=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// The newest Debian cloud kernel in /boot.
fn cloud_kernel() -> PathBuf {
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("vmlinuz-") && n.ends_with("-cloud-amd64")
        })
        .collect();
    kernels.sort();
    kernels
        .pop()
        .expect("no /boot/vmlinuz-*-cloud-amd64 (install linux-image-cloud-amd64)")
}

/// A newc initramfs: /bin/busybox, /dev/console, /proc and the test /init.
fn write_initramfs(path: &Path) {
    use cpio::newc::{trailer, Builder};
    let busybox = std::fs::read("/bin/busybox").expect("install busybox-static");
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut ino = 1;
    let mut entry = |out: std::io::BufWriter<std::fs::File>, b: Builder, data: &[u8]| {
        ino += 1;
        let mut w = b.ino(ino).nlink(1).write(out, data.len() as u32);
        w.write_all(data).unwrap();
        w.finish().unwrap()
    };
    out = entry(out, Builder::new("bin").mode(0o040755).nlink(2), b"");
    out = entry(out, Builder::new("bin/busybox").mode(0o100755), &busybox);
    out = entry(out, Builder::new("dev").mode(0o040755), b"");
    out = entry(
        out,
        Builder::new("dev/console")
            .mode(0o020600)
            .rdev_major(5)
            .rdev_minor(1),
        b"",
    );
    out = entry(out, Builder::new("proc").mode(0o040755), b"");
    out = entry(
        out,
        Builder::new("init").mode(0o100755),
        INIT_SCRIPT.as_bytes(),
    );
    let mut out = trailer(out).unwrap();
    out.flush().unwrap();
}

/// One test's files: its own temp dir with initramfs, blank disk and VM run dirs.
struct Fixture {
    dir: tempfile::TempDir,
    kernel: PathBuf,
    initrd: PathBuf,
    disk: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        init_tracing();
        let dir = tempfile::tempdir().unwrap();
        let initrd = dir.path().join("initrd.cpio");
        write_initramfs(&initrd);
        let disk = dir.path().join("disk.raw");
        std::fs::File::create(&disk)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        Fixture {
            kernel: cloud_kernel(),
            initrd,
            disk,
            dir,
        }
    }

    /// `mode` is "poweroff" (guest powers off after hello) or "tick" (prints a tick per second).
    fn config(&self, test: &str, mode: &str) -> VmConfig {
        VmConfig {
            // Unique across concurrently running test binaries too.
            name: format!("vmmtest-{test}-{}", std::process::id()),
            vcpus: 1,
            memory_mib: 256,
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            cmdline: format!("console=ttyS0 panic=-1 vmmtest={mode}"),
            root_disk: self.disk.clone(),
            run_dir: self.dir.path().join(test),
            accel: detect_accel(),
            tcg_tb_size_mib: Some(32),
            memory: space_vmm::GuestMemory::Anonymous,
            restore: None,
            network: None,
        }
    }
}

/// SIGKILLs the VM's QEMU when the test ends, however it ends (checks the pid is still ours).
struct KillOnDrop {
    pid: u32,
    name: String,
}

impl KillOnDrop {
    fn new(vm: &Vm) -> Self {
        KillOnDrop {
            pid: vm.pid(),
            name: vm.name().to_owned(),
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        let needle = format!("{},", self.name);
        if cmdline
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
        {
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
    }
}

async fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f()
}

fn console(vm: &Vm) -> String {
    std::fs::read_to_string(&vm.paths().console_log).unwrap_or_default()
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_console_status_kill() {
    let fx = Fixture::new();
    let cfg = fx.config("basic", "tick");
    let vmm = QemuVmm::new();
    eprintln!("command line: {}", vmm.command_line(&cfg).await);

    let started = Instant::now();
    let vm = vmm.launch(&cfg).await.unwrap();
    let launched = started.elapsed();
    let _guard = KillOnDrop::new(&vm);
    assert_eq!(vm.status().await.unwrap(), VmStatus::Running);
    assert!(vm.rss_bytes().unwrap() > 0);
    assert!(
        wait_until(BOOT_TIMEOUT, || console(&vm).contains("vmm-test: hello")).await,
        "no hello on the console; console.log:\n{}",
        space_vmm::console_tail(&vm.paths().console_log, 4096).unwrap_or_default()
    );
    eprintln!(
        "launch returned after {launched:?}; hello on console {:?} after launch started; RSS {} MiB",
        started.elapsed(),
        vm.rss_bytes().unwrap_or(0) >> 20
    );
    // The kernel's own messages are captured from the very start (attached before `cont`).
    assert!(console(&vm).contains("Linux version"));
    assert!(space_vmm::console_tail(&vm.paths().console_log, 64 * 1024)
        .unwrap()
        .contains("vmm-test: hello"));

    let pid = vm.pid();
    let paths = vm.paths().clone();
    vm.kill(Duration::from_secs(10)).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(10), vm.exited())
        .await
        .unwrap();
    assert!(exit.reason.contains("QMP quit"), "{}", exit.reason);
    assert!(
        !process_exists(pid),
        "QEMU pid {pid} still exists (zombie?)"
    );
    for f in [&paths.qmp, &paths.console, &paths.channel, &paths.pidfile] {
        assert!(!f.exists(), "{} left behind", f.display());
    }
    assert!(paths.console_log.exists());
    // Idempotent, and the handle now reports the exit.
    vm.kill(Duration::from_secs(1)).await.unwrap();
    assert!(matches!(vm.status().await, Err(VmmError::Exited(_))));
    assert_eq!(vm.rss_bytes(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_poweroff_is_reported() {
    let fx = Fixture::new();
    let cfg = fx.config("poweroff", "poweroff");
    let vm = QemuVmm::new().launch(&cfg).await.unwrap();
    let _guard = KillOnDrop::new(&vm);
    let pid = vm.pid();
    let exit = tokio::time::timeout(BOOT_TIMEOUT, vm.exited())
        .await
        .expect("guest did not power off");
    assert_eq!(exit.reason, "guest powered off");
    assert!(console(&vm).contains("vmm-test: hello"));
    assert!(!process_exists(pid));
    assert!(!vm.paths().qmp.exists());
    vm.kill(Duration::from_secs(1)).await.unwrap();
}

/// Env var through which `adopt_after_restart` hands its VM config to the helper process.
const CHILD_ENV: &str = "SPACE_VMM_TEST_CHILD_CONFIG";

/// Helper, run in a separate process by `adopt_after_restart`: launches a VM and exits without
/// stopping it, like a node process that dies or restarts.
#[tokio::test]
#[ignore = "helper process for adopt_after_restart"]
async fn launch_then_exit_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    init_tracing();
    let f: Vec<&str> = spec.split('\n').collect();
    let cfg = VmConfig {
        name: f[0].into(),
        run_dir: f[1].into(),
        kernel: f[2].into(),
        initrd: f[3].into(),
        root_disk: f[4].into(),
        cmdline: f[5].into(),
        vcpus: 1,
        memory_mib: 256,
        accel: detect_accel(),
        tcg_tb_size_mib: Some(32),
        memory: space_vmm::GuestMemory::Anonymous,
        restore: None,
        network: None,
    };
    let vm = QemuVmm::new().launch(&cfg).await.unwrap();
    assert!(wait_until(BOOT_TIMEOUT, || console(&vm).contains("vmm-test: tick 1")).await);
    println!("launched pid {}", vm.pid());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_after_restart() {
    let fx = Fixture::new();
    let cfg = fx.config("adopt", "tick");
    let vmm = QemuVmm::new();

    // Launch from another process that then exits: a real node restart.
    let spec = [
        cfg.name.clone(),
        cfg.run_dir.display().to_string(),
        cfg.kernel.display().to_string(),
        cfg.initrd.display().to_string(),
        cfg.root_disk.display().to_string(),
        cfg.cmdline.clone(),
    ]
    .join("\n");
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "launch_then_exit_process",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, spec)
        .output()
        .await
        .unwrap();
    let pidfile = cfg.run_dir.join("vmm.pid");
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0);
    let _guard = KillOnDrop {
        pid,
        name: cfg.name.clone(),
    };
    assert!(
        out.status.success() && pid != 0,
        "launcher process failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        process_exists(pid),
        "QEMU died with the process that launched it"
    );

    // A second launch in the same run dir must not steal the running VM's sockets.
    assert!(matches!(
        vmm.launch(&cfg).await,
        Err(VmmError::AlreadyRunning { pid: p, .. }) if p == pid
    ));
    // A QEMU that is ours but runs another VM is refused.
    match vmm.adopt("vmmtest-someone-else", &cfg.run_dir).await {
        Err(VmmError::NotOurVm { pid: p, .. }) => assert_eq!(p, pid),
        other => panic!("expected NotOurVm, got {other:?}"),
    }

    let vm = vmm.adopt(&cfg.name, &cfg.run_dir).await.unwrap();
    assert_eq!(vm.pid(), pid);
    assert_eq!(vm.status().await.unwrap(), VmStatus::Running);
    assert!(vm.rss_bytes().is_some());

    // The console was reattached: new ticks keep arriving in console.log.
    let ticks = |s: &str| s.matches("vmm-test: tick").count();
    let before = ticks(&console(&vm));
    assert!(
        wait_until(BOOT_TIMEOUT, || ticks(&console(&vm)) >= before + 2).await,
        "console did not grow after adopt"
    );

    vm.pause().await.unwrap();
    assert_eq!(vm.status().await.unwrap(), VmStatus::Paused);
    vm.resume().await.unwrap();
    assert_eq!(vm.status().await.unwrap(), VmStatus::Running);

    // Adopt again in the same process (handle dropped, QMP and console reconnect).
    drop(vm);
    let vm = vmm.adopt(&cfg.name, &cfg.run_dir).await.unwrap();
    assert_eq!(vm.status().await.unwrap(), VmStatus::Running);

    // A frozen QEMU cannot answer `quit`: kill must fall back to SIGKILL and still finish.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    vm.kill(Duration::from_millis(500)).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(10), vm.exited())
        .await
        .unwrap();
    assert!(exit.reason.contains("SIGKILL"), "{}", exit.reason);
    // QEMU's parent is now init (or a subreaper), which reaps it.
    assert!(
        wait_until(Duration::from_secs(10), || !process_exists(pid)).await,
        "pid {pid} not reaped by its new parent"
    );
    assert!(!vm.paths().qmp.exists());
    assert!(matches!(
        vmm.adopt(&cfg.name, &cfg.run_dir).await,
        Err(VmmError::NotRunning(_))
    ));
}

#[tokio::test]
async fn adopt_refuses_missing_dead_and_foreign_pids() {
    let fx = Fixture::new();
    let vmm = QemuVmm::new();
    let run_dir = fx.dir.path().join("nothing");
    std::fs::create_dir_all(&run_dir).unwrap();
    let pidfile = run_dir.join("vmm.pid");

    let err = vmm.adopt("sbx-x", &run_dir).await.unwrap_err();
    assert!(matches!(err, VmmError::NotRunning(_)), "{err}");
    eprintln!("missing pidfile: {err}");

    std::fs::write(&pidfile, "garbage\n").unwrap();
    assert!(matches!(
        vmm.adopt("sbx-x", &run_dir).await,
        Err(VmmError::NotRunning(_))
    ));

    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    std::fs::write(&pidfile, format!("{dead_pid}\n")).unwrap();
    let err = vmm.adopt("sbx-x", &run_dir).await.unwrap_err();
    assert!(matches!(err, VmmError::NotRunning(_)), "{err}");
    eprintln!("dead pid: {err}");

    // A live pid that is not QEMU (pid reuse): this test process.
    std::fs::write(&pidfile, format!("{}\n", std::process::id())).unwrap();
    let err = vmm.adopt("sbx-x", &run_dir).await.unwrap_err();
    assert!(matches!(err, VmmError::NotOurVm { .. }), "{err}");
    eprintln!("foreign pid: {err}");
}

#[tokio::test]
async fn start_failure_reports_qemu_output() {
    let fx = Fixture::new();
    let mut cfg = fx.config("badkernel", "poweroff");
    let bogus = fx.dir.path().join("not-a-kernel");
    std::fs::write(&bogus, b"this is not a kernel").unwrap();
    cfg.kernel = bogus;
    let err = QemuVmm::new().launch(&cfg).await.unwrap_err();
    eprintln!("bad kernel: {err}");
    match &err {
        VmmError::StartFailed { detail } => {
            assert!(!detail.contains("vmm.log is empty"), "{detail}")
        }
        other => panic!("expected StartFailed, got {other:?}"),
    }
    assert!(!cfg.run_dir.join("qmp.sock").exists());

    let missing = VmConfig {
        initrd: fx.dir.path().join("missing"),
        ..fx.config("missing", "poweroff")
    };
    assert!(matches!(
        QemuVmm::new().launch(&missing).await,
        Err(VmmError::InvalidConfig(_))
    ));
}

/// The highest "tick N" on the console.
fn last_tick(vm: &Vm) -> u32 {
    console(vm)
        .lines()
        .filter_map(|l| l.split("vmm-test: tick ").nth(1))
        .filter_map(|n| n.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

/// A memory image (shared memory file + device state saved with x-ignore-shared) starts a
/// clone that carries on where the original stopped; a live full save restores into
/// anonymous memory the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_and_restore_carry_on_where_the_guest_was() {
    let fx = Fixture::new();
    let vmm = QemuVmm::new();
    let memory = fx.dir.path().join("memory");
    let mut cfg = fx.config("image", "tick");
    cfg.memory = space_vmm::GuestMemory::File {
        path: memory.clone(),
        shared: true,
    };
    let vm = vmm.launch(&cfg).await.unwrap();
    let _guard = KillOnDrop::new(&vm);
    assert!(wait_until(BOOT_TIMEOUT, || last_tick(&vm) >= 2).await);
    let state = fx.dir.path().join("image.state");
    let report = vm
        .save_state(
            std::fs::File::create(&state).unwrap().as_fd(),
            space_vmm::SaveOptions {
                ignore_shared: true,
                live: false,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let saved_tick = last_tick(&vm);
    eprintln!("image save: {report:?}");
    assert!(
        report.bytes < 1 << 20,
        "RAM went into the state: {report:?}"
    );
    vm.kill(Duration::from_secs(5)).await.unwrap();

    // A clone maps the memory file copy-on-write and loads only the device state.
    let mut clone_cfg = fx.config("clone", "tick");
    clone_cfg.memory = space_vmm::GuestMemory::File {
        path: memory.clone(),
        shared: false,
    };
    clone_cfg.restore = Some(space_vmm::RestoreFrom {
        ignore_shared: true,
    });
    let started = Instant::now();
    let clone = restore(&vmm, &clone_cfg, &state).await.unwrap();
    let _clone_guard = KillOnDrop::new(&clone);
    eprintln!("clone running after {:?}", started.elapsed());
    assert_eq!(clone.status().await.unwrap(), VmStatus::Running);
    // It never booted: no kernel banner, and its ticks continue from the saved count.
    assert!(wait_until(BOOT_TIMEOUT, || last_tick(&clone) > saved_tick).await);
    assert!(!console(&clone).contains("Linux version"));

    // A live full save of the clone (its RAM is private), restored into anonymous memory.
    let full = fx.dir.path().join("full.state");
    let report = clone
        .save_state(
            std::fs::File::create(&full).unwrap().as_fd(),
            space_vmm::SaveOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        clone.status().await.unwrap(),
        VmStatus::Other("postmigrate".into())
    );
    clone.resume().await.unwrap();
    let pause = clone.last_pause().expect("STOP and RESUME events seen");
    eprintln!("live save: {report:?}, guest-visible pause {pause:?}");
    assert!(
        report.bytes > 1 << 20,
        "RAM missing from a full save: {report:?}"
    );
    let tick_at_save = last_tick(&clone);
    clone.kill(Duration::from_secs(5)).await.unwrap();
    let mut restored_cfg = fx.config("restored", "tick");
    restored_cfg.restore = Some(space_vmm::RestoreFrom {
        ignore_shared: false,
    });
    let restored = restore(&vmm, &restored_cfg, &full).await.unwrap();
    let _restored_guard = KillOnDrop::new(&restored);
    assert!(wait_until(BOOT_TIMEOUT, || last_tick(&restored) > tick_at_save).await);

    // A state file that is not one fails the start cleanly.
    let junk = fx.dir.path().join("junk.state");
    std::fs::write(&junk, b"not a migration stream").unwrap();
    let mut bad = fx.config("bad", "tick");
    bad.restore = Some(space_vmm::RestoreFrom {
        ignore_shared: false,
    });
    let err = restore(&vmm, &bad, &junk).await.unwrap_err();
    eprintln!("junk state: {err}");
}

/// Launches `cfg` (a restore), feeds it `state` and lets it run; a VM whose state does not
/// load is killed.
async fn restore(
    vmm: &QemuVmm,
    cfg: &space_vmm::VmConfig,
    state: &std::path::Path,
) -> Result<space_vmm::Vm, space_vmm::VmmError> {
    let ignore_shared = cfg.restore.expect("a restore").ignore_shared;
    let vm = vmm.launch(cfg).await?;
    let file = std::fs::File::open(state).unwrap();
    let loaded = async {
        vm.load_state(file.as_fd(), ignore_shared, Duration::from_secs(60))
            .await?;
        vm.resume().await
    }
    .await;
    match loaded {
        Ok(()) => Ok(vm),
        Err(e) => {
            let _ = vm.kill(Duration::from_secs(5)).await;
            Err(e)
        }
    }
}

/// Runs `ip` with `args`, panicking with its stderr on failure.
fn ip(args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deletes the namespace when the test ends, however it ends.
struct NetnsGuard(String);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_card_attaches_to_the_tap_inside_its_namespace() {
    let f = Fixture::new();
    let ns = format!("vmmtest-net-{}", std::process::id());
    ip(&["netns", "add", &ns]);
    let _guard = NetnsGuard(ns.clone());
    ip(&[
        "-n", &ns, "tuntap", "add", "dev", "tap0", "mode", "tap", "vnet_hdr",
    ]);
    ip(&["-n", &ns, "link", "set", "tap0", "up"]);
    // Nobody has the TAP open yet: no carrier.
    assert!(ip(&["-n", &ns, "link", "show", "tap0"]).contains("NO-CARRIER"));

    let mut cfg = f.config("net", "tick");
    cfg.network = Some(space_vmm::VmNetwork {
        netns: PathBuf::from("/run/netns").join(&ns),
        tap: "tap0".into(),
        mac: [0x02, 0x53, 0x50, 0x00, 0x02, 0x0f],
    });
    let vm = QemuVmm::new().launch(&cfg).await.expect("launch");
    let _kill = KillOnDrop::new(&vm);

    // QEMU runs in the namespace, and holds the TAP there (the carrier is up).
    let ours = std::fs::metadata(format!("/run/netns/{ns}"))
        .expect("netns")
        .ino();
    let qemu = std::fs::metadata(format!("/proc/{}/ns/net", vm.pid()))
        .expect("qemu netns")
        .ino();
    assert_eq!(ours, qemu, "QEMU must run inside the sandbox namespace");
    let link = ip(&["-n", &ns, "link", "show", "tap0"]);
    assert!(!link.contains("NO-CARRIER"), "{link}");

    // A namespace that does not exist is refused before QEMU starts.
    let mut bad = f.config("net-missing", "tick");
    bad.network = Some(space_vmm::VmNetwork {
        netns: PathBuf::from("/run/netns/vmmtest-no-such-namespace"),
        tap: "tap0".into(),
        mac: [0x02, 0, 0, 0, 0, 1],
    });
    let err = QemuVmm::new()
        .launch(&bad)
        .await
        .expect_err("missing netns");
    assert!(err.to_string().contains("does not exist"), "{err}");

    vm.kill(Duration::from_secs(5)).await.expect("kill");
}

/// A field of /proc/<pid>/status (`Uid`, `Seccomp`, `NoNewPrivs`, …).
fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

/// Asks QEMU over a raw QMP connection (the node's own has been closed) to migrate to an
/// `exec:` URI, i.e. to spawn a shell command.
async fn qmp_migrate_exec(sock: &Path, command: &str) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let stream = tokio::net::UnixStream::connect(sock).await.expect("QMP");
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let _greeting = lines.next_line().await;
    write
        .write_all(b"{\"execute\":\"qmp_capabilities\"}\n")
        .await
        .unwrap();
    let _ = lines.next_line().await;
    let cmd = format!("{{\"execute\":\"migrate\",\"arguments\":{{\"uri\":\"exec:{command}\"}}}}\n");
    let _ = write.write_all(cmd.as_bytes()).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jailed_vmm_is_confined_and_its_seccomp_filter_refuses_to_spawn() {
    let fx = Fixture::new();
    let marker = fx.dir.path().join("spawned");
    let command = format!("/usr/bin/touch {}", marker.display());

    // Unjailed, QEMU runs the command: the migration target is a program.
    let cfg = fx.config("unjailed", "tick");
    let vm = QemuVmm::unjailed("qemu-system-x86_64")
        .launch(&cfg)
        .await
        .unwrap();
    let _guard = KillOnDrop::new(&vm);
    let sock = vm.paths().qmp.clone();
    drop(vm);
    qmp_migrate_exec(&sock, &command).await;
    assert!(
        wait_until(Duration::from_secs(10), || marker.exists()).await,
        "unjailed QEMU did not run the exec: migration command"
    );
    std::fs::remove_file(&marker).unwrap();

    // Jailed: its own uid, no capabilities, seccomp, its own namespaces.
    let mut cfg = fx.config("jailed", "tick");
    cfg.root_disk = fx.dir.path().join("disk-jailed.raw");
    std::fs::File::create(&cfg.root_disk)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let vm = QemuVmm::new().launch(&cfg).await.unwrap();
    let _guard = KillOnDrop::new(&vm);
    let pid = vm.pid();
    let uids = status_field(pid, "Uid");
    assert!(
        uids.split_whitespace().all(|u| u != "0"),
        "jailed QEMU runs as uid {uids}"
    );
    assert_eq!(status_field(pid, "Seccomp"), "2");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(status_field(pid, "CapBnd"), "0000000000000000");
    for ns in ["pid", "mnt", "ipc", "uts", "net"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        assert_ne!(ours, its, "jailed QEMU shares our {ns} namespace");
    }
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(environ.is_empty(), "jailed QEMU has an environment");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroups.contains(&format!("/space/vmm/{}", cfg.name)),
        "{cgroups}"
    );
    // The guest still runs.
    let ticks = last_tick(&vm);
    assert!(
        wait_until(BOOT_TIMEOUT, || last_tick(&vm) > ticks + 1).await,
        "jailed guest does not run"
    );
    // Asked to spawn, QEMU is killed by its filter, and nothing runs.
    let sock = vm.paths().qmp.clone();
    drop(vm);
    qmp_migrate_exec(&sock, &command).await;
    assert!(
        wait_until(Duration::from_secs(10), || !process_exists(pid)).await,
        "jailed QEMU survived an exec: migration"
    );
    assert!(!marker.exists(), "jailed QEMU ran a program");
}

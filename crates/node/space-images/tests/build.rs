//! Integration tests: the kernel bundle and the busybox template built for real into a
//! loop-mounted btrfs store, checked with e2fsck/debugfs, and the bundle booted under QEMU
//! (TCG) as far as the initramfs's switch_root. Needs root, btrfs-progs, e2fsprogs,
//! busybox-static, linux-image-cloud-amd64 and qemu-system-x86.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use space_core::SandboxId;
use space_images::{
    build_kernel_bundle, build_template, initramfs, kernel_cmdline, BuildOpts, KernelBundleInfo,
    KernelOpts,
};
use space_storage::Store;

/// Owns a temp dir with a loop-mounted store; unmounts and detaches on drop, even on failure.
struct Guard {
    store: Option<Store>,
    dir: tempfile::TempDir,
}

impl Guard {
    fn new() -> Guard {
        let mut g = Guard {
            store: None,
            dir: tempfile::tempdir().unwrap(),
        };
        g.store = Some(Store::open(&g.dir.path().join("data"), 2 << 30).unwrap());
        g
    }

    fn store(&self) -> &Store {
        self.store.as_ref().unwrap()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(s) = &self.store {
            if let Err(e) = s.unmount() {
                eprintln!("guard: unmount of {} failed: {e}", s.root().display());
            }
        }
        space_storage::mountinfo::release_all_under(self.dir.path());
    }
}

/// Kills a child process on drop.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn progress(line: &str) {
    eprintln!("progress: {line}");
}

/// A stand-in for spaced: any static binary will do for the initramfs.
fn dummy_spaced(dir: &Path) -> PathBuf {
    let p = dir.join("spaced");
    std::fs::copy("/bin/busybox", &p).unwrap();
    p
}

fn bundle(g: &Guard) -> KernelBundleInfo {
    build_kernel_bundle(
        g.store(),
        &KernelOpts::new(dummy_spaced(g.dir.path())),
        &progress,
    )
    .unwrap()
}

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kernel_bundle_contents_and_cache() {
    let g = Guard::new();
    let k = bundle(&g);
    assert!(k.vmlinuz.is_file() && k.initramfs.is_file());
    assert_eq!(
        g.store().kernels().get(&k.digest).unwrap().as_ref(),
        Some(&k)
    );
    let names: Vec<String> = initramfs::list(&k.initramfs)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for must in [
        "init",
        "spaced",
        "bin/busybox",
        "bin/sh",
        "bin/switch_root",
        "dev/console",
        "modules.order",
    ] {
        assert!(
            names.iter().any(|n| n == must),
            "{must} missing from initramfs"
        );
    }
    // Modules are in the archive in load order, dependencies first.
    let in_archive: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix("lib/modules/"))
        .filter(|n| n.ends_with(".ko"))
        .collect();
    assert_eq!(
        in_archive,
        k.modules.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let pos = |m: &str| {
        k.modules
            .iter()
            .position(|x| x == m)
            .unwrap_or_else(|| panic!("{m} not bundled"))
    };
    assert!(pos("virtio_ring.ko") < pos("virtio.ko"));
    assert!(pos("virtio.ko") < pos("virtio_mmio.ko"));
    assert!(
        pos("failover.ko") < pos("net_failover.ko")
            && pos("net_failover.ko") < pos("virtio_net.ko")
    );
    for m in [
        "virtio_blk.ko",
        "virtio_console.ko",
        "virtio-rng.ko",
        "vmw_vsock_virtio_transport.ko",
    ] {
        pos(m);
    }
    // Same inputs: the cached bundle, not a rebuild.
    let again = bundle(&g);
    assert_eq!(again, k);
}

#[test]
fn busybox_template_image() {
    let g = Guard::new();
    let k = bundle(&g);
    let t = build_template(
        g.store(),
        "busybox",
        &k.digest,
        &BuildOpts::default(),
        &progress,
    )
    .unwrap();
    assert_eq!(t.name, "busybox");
    assert_eq!(t.kernel_digest, k.digest);
    assert_eq!(t.image_size_mib, 64);
    assert_eq!(t.default_resources.disk_mib, 256);
    let image = g.store().templates().image_path(&t);
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20);
    sh(Command::new("e2fsck").arg("-fn").arg(&image));
    let home = sh(Command::new("debugfs")
        .arg("-R")
        .arg("ls -l /home")
        .arg(&image));
    let user_line = home
        .lines()
        .find(|l| l.trim_end().ends_with(" user"))
        .unwrap_or_else(|| panic!("no /home/user: {home}"));
    assert!(
        user_line.contains(" 1000 ") && user_line.contains("40755"),
        "{user_line}"
    );
    let tmp = sh(Command::new("debugfs")
        .arg("-R")
        .arg("stat /tmp")
        .arg(&image));
    assert!(tmp.contains("Mode:  01777"), "{tmp}");
    let passwd = sh(Command::new("debugfs")
        .arg("-R")
        .arg("cat /etc/passwd")
        .arg(&image));
    assert!(passwd.contains("user:x:1000:1000:user:/home/user:/bin/sh"));
    let bin = sh(Command::new("debugfs")
        .arg("-R")
        .arg("stat /bin/sh")
        .arg(&image));
    assert!(bin.contains("Fast link dest: \"/bin/busybox\""), "{bin}");
    // Debian's bash (what the E2B SDKs run commands with), a program, not an applet link.
    let bash = sh(Command::new("debugfs")
        .arg("-R")
        .arg("stat /bin/bash")
        .arg(&image));
    assert!(
        bash.contains("Type: regular") && bash.contains("Mode:  0755"),
        "{bash}"
    );
    // Debian's curl and openssl, their libraries (glibc too) and the CA bundle they use.
    let usr_bin = sh(Command::new("debugfs")
        .arg("-R")
        .arg("ls -l /usr/bin")
        .arg(&image));
    for exe in [" curl", " openssl"] {
        let line = usr_bin
            .lines()
            .find(|l| l.trim_end().ends_with(exe))
            .unwrap_or_else(|| panic!("no{exe} in /usr/bin: {usr_bin}"));
        assert!(line.contains("100755"), "{line}");
    }
    let libs = sh(Command::new("debugfs")
        .arg("-R")
        .arg("ls /lib/x86_64-linux-gnu")
        .arg(&image));
    for lib in [
        "libc.so.6",
        "libtinfo.so.6",
        "libcurl.so.4",
        "libssl.so.3",
        "libcrypto.so.3",
        "libnghttp2.so.14",
    ] {
        assert!(libs.contains(lib), "no {lib}: {libs}");
    }
    let loader = sh(Command::new("debugfs")
        .arg("-R")
        .arg("stat /lib64/ld-linux-x86-64.so.2")
        .arg(&image));
    assert!(loader.contains("Type: regular"), "{loader}");
    let bundle = sh(Command::new("debugfs")
        .arg("-R")
        .arg("stat /usr/lib/ssl/cert.pem")
        .arg(&image));
    assert!(
        bundle.contains("Fast link dest: \"/etc/ssl/certs/ca-certificates.crt\""),
        "{bundle}"
    );
    let ca_dir = sh(Command::new("debugfs")
        .arg("-R")
        .arg("stat /usr/local/share/ca-certificates")
        .arg(&image));
    assert!(ca_dir.contains("Type: directory"), "{ca_dir}");
    assert_eq!(g.store().templates().list().unwrap(), vec![t.clone()]);

    // Cached on the second call.
    let again = build_template(
        g.store(),
        "busybox",
        &k.digest,
        &BuildOpts::default(),
        &progress,
    )
    .unwrap();
    assert_eq!(again, t);
    // Unknown templates and missing kernels are clear errors.
    let err = build_template(
        g.store(),
        "nope",
        &k.digest,
        &BuildOpts::default(),
        &progress,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("known templates: base, busybox"),
        "{err}"
    );
    let err = build_template(
        g.store(),
        "busybox",
        "ffffffffffffffff",
        &BuildOpts::default(),
        &progress,
    )
    .unwrap_err();
    assert!(err.to_string().contains("not in the store"), "{err}");
}

/// Boots the bundle under QEMU microvm (TCG) and returns the console log once `done` says
/// so, QEMU exits, or 90 s pass.
fn boot(
    k: &KernelBundleInfo,
    disk: Option<&Path>,
    log: &Path,
    done: impl Fn(&str) -> bool,
) -> (String, bool) {
    let mut cmd = Command::new("qemu-system-x86_64");
    // As space-vmm does under TCG: a PIT and a known TSC rate, or a loaded host makes the
    // guest hang in early boot (TSC calibration).
    cmd.args([
        "-M",
        "microvm,pit=on",
        "-accel",
        "tcg",
        "-m",
        "256",
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
    ])
    .arg("-kernel")
    .arg(&k.vmlinuz)
    .arg("-initrd")
    .arg(&k.initramfs)
    .arg("-append")
    .arg(format!("{} {}", kernel_cmdline(), tsc_param()))
    .arg("-serial")
    .arg(format!("file:{}", log.display()));
    if let Some(disk) = disk {
        cmd.arg("-drive")
            .arg(format!(
                "id=root,file={},format=raw,if=none",
                disk.display()
            ))
            .args(["-device", "virtio-blk-device,drive=root"]);
    }
    let mut vm = Kill(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut exited = false;
    while Instant::now() < deadline {
        if vm.0.try_wait().unwrap().is_some() {
            exited = true;
            break;
        }
        if done(&std::fs::read_to_string(log).unwrap_or_default()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(vm);
    let console = std::fs::read_to_string(log).unwrap_or_default();
    eprintln!(
        "console ({} s, exited: {exited}):\n{console}",
        (Instant::now() + Duration::from_secs(90) - deadline).as_secs_f32()
    );
    (console, exited)
}

/// `tsc_early_khz=` from the host's CPU clock (`cpu MHz` in /proc/cpuinfo), or nothing.
fn tsc_param() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mhz = info.lines().find_map(|l| {
        l.strip_prefix("cpu MHz")?
            .split(':')
            .nth(1)?
            .trim()
            .parse::<f64>()
            .ok()
    });
    mhz.map(|m| format!("tsc_early_khz={}", (m * 1000.0) as u64))
        .unwrap_or_default()
}

#[test]
fn bundle_boots_to_switch_root() {
    let g = Guard::new();
    let k = bundle(&g);
    let t = build_template(
        g.store(),
        "busybox",
        &k.digest,
        &BuildOpts::default(),
        &progress,
    )
    .unwrap();
    let disk = g
        .store()
        .create_sandbox_disk(
            &SandboxId::generate(),
            &g.store().templates().image_path(&t),
            64,
        )
        .unwrap();
    let log = g.dir.path().join("console.log");
    let (console, _) = boot(&k, Some(&disk), &log, |c| {
        c.contains("space-initramfs: switching root")
    });
    assert!(
        console.contains("space-initramfs: switching root"),
        "console:\n{console}"
    );
    assert!(
        !console.contains("insmod"),
        "a module failed to load:\n{console}"
    );
}

#[test]
fn initramfs_failure_is_reported_and_powers_off() {
    let g = Guard::new();
    let k = bundle(&g);
    let log = g.dir.path().join("console.log");
    // No disk: /init must say so and end the VM by itself.
    let (console, exited) = boot(&k, None, &log, |_| false);
    assert!(
        console.contains("space-initramfs: no root disk"),
        "console:\n{console}"
    );
    assert!(exited, "VM did not power off; console:\n{console}");
}

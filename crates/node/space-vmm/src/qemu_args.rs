//! The QEMU microvm command line, built as a pure function of the config so it can be tested
//! and reported exactly.
//!
//! Choices verified on QEMU 7.2 with the Debian cloud kernel:
//! - `pit=on` under TCG: microvm's `pit=auto` means "only with in-kernel KVM PIT", and without a
//!   PIT a TCG guest cannot calibrate its TSC and hangs early in boot.
//! - ACPI stays on (the default): the guest finds the virtio-mmio devices through it and
//!   `poweroff` works (with `acpi=off` the guest only halts).
//! - The disk uses QEMU's default cache mode (writeback through the host page cache) rather
//!   than `cache=none`: O_DIRECT on btrfs can record wrong checksums when the guest changes a
//!   buffer while it is being written, and reflink snapshots flush the page cache anyway.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::accel::Accel;
use crate::config::{GuestMemory, VmConfig};
use crate::jail::{fds, DiskLimits, JailedFiles};

/// Name of the virtio-serial port the guest daemon opens (`/sys/class/virtio-ports/*/name`).
pub const AGENT_PORT_NAME: &str = "space.agent";
/// QEMU object id of guest RAM. The RAM block is named after it, and restores match blocks by
/// name, so it must never change.
pub(crate) const RAM_ID: &str = "mem";
/// QEMU drive id of the root disk (used by `block_resize`).
pub(crate) const ROOT_DRIVE: &str = "root";
/// QEMU chardev id of the serial console (matched in `query-chardev`).
pub(crate) const CONSOLE_CHARDEV: &str = "console";
/// Id of the object whose data is the VM's run directory (see `qemu_args`).
pub(crate) const RUN_DIR_MARKER: &str = "space-run-dir";

/// The kernel command line QEMU gets: the config's, plus under TCG a fixed TSC frequency so the
/// guest never has to calibrate against the emulated PIT (which fails under host load and then
/// hangs the boot). A `tsc_early_khz=` already in the config wins.
pub(crate) fn kernel_cmdline(cfg: &VmConfig, host_tsc_khz: Option<u64>) -> String {
    let mut cmdline = cfg.cmdline.trim().to_owned();
    if let (Accel::Tcg, Some(khz)) = (cfg.accel, host_tsc_khz) {
        if !cmdline
            .split_whitespace()
            .any(|w| w.starts_with("tsc_early_khz="))
        {
            if !cmdline.is_empty() {
                cmdline.push(' ');
            }
            cmdline.push_str(&format!("tsc_early_khz={khz}"));
        }
    }
    cmdline
}

/// Arguments after the binary name. The VM starts paused (`-S`): the caller attaches QMP and the
/// console first and then sends `cont`, so no console output is lost.
pub(crate) fn qemu_args(
    cfg: &VmConfig,
    files: &JailedFiles,
    confined: Option<&DiskLimits>,
    host_tsc_khz: Option<u64>,
) -> Vec<OsString> {
    let mut a = Args::default();
    a.flag("-name")
        .arg(format!("{},debug-threads=off", cfg.name));
    // QEMU ignores this object; it ties the process to its node's run directory in
    // /proc/<pid>/cmdline (see `procfs::qemu_names_under`), since a jailed QEMU names no
    // host path of its own.
    let mut marker = OsString::from(format!("secret,id={RUN_DIR_MARKER},data="));
    marker.push(escape_opt(cfg.run_dir.as_os_str()));
    a.flag("-object").arg(marker);
    match cfg.accel {
        Accel::Tcg => {
            a.flag("-M").arg(format!(
                "microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=on,memory-backend={RAM_ID}"
            ));
            let accel = match cfg.tcg_tb_size_mib {
                Some(mib) => format!("tcg,tb-size={mib}"),
                None => "tcg".to_owned(),
            };
            a.flag("-accel").arg(accel);
            a.flag("-cpu").arg("max");
        }
        Accel::Kvm => {
            a.flag("-M").arg(format!(
                "microvm,x-option-roms=off,isa-serial=on,rtc=on,memory-backend={RAM_ID}"
            ));
            a.flag("-accel").arg("kvm");
            a.flag("-cpu").arg("host");
        }
    }
    a.flag("-smp").arg(cfg.vcpus.to_string());
    a.flag("-m").arg(cfg.memory_mib.to_string());
    a.flag("-object").arg(memory_object(cfg, files));
    a.flag("-nodefaults")
        .flag("-no-user-config")
        .flag("-nographic")
        .flag("-no-reboot");
    a.flag("-msg").arg("timestamp=on");
    // -kernel/-initrd/-append take their value verbatim (no option parsing, no escaping).
    a.flag("-kernel").arg(files.kernel.as_os_str());
    a.flag("-initrd").arg(files.initrd.as_os_str());
    a.flag("-append").arg(kernel_cmdline(cfg, host_tsc_khz));
    // The sockets are the node's, listening already, passed as descriptors: QEMU creates
    // no file, and its pid (written by the node) needs no -pidfile.
    a.flag("-chardev").arg(socket_chardev("qmp", fds::QMP));
    a.flag("-mon").arg("chardev=qmp,mode=control");
    a.flag("-chardev")
        .arg(socket_chardev(CONSOLE_CHARDEV, fds::CONSOLE));
    a.flag("-serial").arg(format!("chardev:{CONSOLE_CHARDEV}"));
    let mut drive = OsString::from(format!("id={ROOT_DRIVE},file="));
    drive.push(escape_opt(files.disk.as_os_str()));
    drive.push(",format=raw,if=none,discard=unmap");
    if let Some(limits) = confined {
        drive.push(format!(
            ",throttling.bps-total={},throttling.iops-total={}",
            limits.bytes_per_sec, limits.iops
        ));
    }
    a.flag("-drive").arg(drive);
    a.flag("-device").arg("virtio-blk-device,drive=root");
    a.flag("-device").arg("virtio-serial-device");
    a.flag("-chardev")
        .arg(socket_chardev("channel", fds::CHANNEL));
    a.flag("-device").arg(format!(
        "virtserialport,chardev=channel,name={AGENT_PORT_NAME}"
    ));
    a.flag("-device").arg("virtio-rng-device");
    if let Some(net) = &cfg.network {
        // The TAP exists already (persistent, with a virtio-net header) in the namespace
        // QEMU runs in; no scripts, QEMU never configures the host.
        // The TAP is opened by the node inside the namespace (with a virtio-net header,
        // which QEMU finds on the descriptor) and passed as a descriptor.
        a.flag("-netdev")
            .arg(format!("tap,id=net0,fd={}", fds::TAP));
        a.flag("-device").arg(format!(
            "virtio-net-device,netdev=net0,mac={}",
            net.mac_text()
        ));
    }
    if cfg.restore.is_some() {
        // The launcher feeds the state in over QMP (`migrate-incoming`, `Vm::load_state`).
        a.flag("-incoming").arg("defer");
    }
    if confined.is_some() {
        // QEMU's own seccomp filter: no exec or fork (state moves over passed descriptors,
        // never `exec:`), no privilege changes, no scheduler or resource changes, no
        // obsolete system calls.
        a.flag("-sandbox")
            .arg("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
    }
    a.flag("-S");
    a.0
}

/// The `-object` that backs guest RAM.
fn memory_object(cfg: &VmConfig, files: &JailedFiles) -> OsString {
    match (&cfg.memory, &files.memory) {
        (GuestMemory::File { shared, .. }, Some(path)) => {
            let mut s = OsString::from(format!(
                "memory-backend-file,id={RAM_ID},size={}M,share={},mem-path=",
                cfg.memory_mib,
                if *shared { "on" } else { "off" }
            ));
            s.push(escape_opt(path.as_os_str()));
            s
        }
        _ => OsString::from(format!(
            "memory-backend-ram,id={RAM_ID},size={}M",
            cfg.memory_mib
        )),
    }
}

/// A chardev on a listening Unix socket passed as descriptor `fd`, not waiting for a client.
fn socket_chardev(id: &str, fd: std::os::fd::RawFd) -> String {
    format!("socket,id={id},fd={fd},server=on,wait=off")
}

/// QEMU option values escape a literal comma by doubling it.
fn escape_opt(value: &OsStr) -> OsString {
    let mut out = Vec::with_capacity(value.len());
    for &b in value.as_bytes() {
        out.push(b);
        if b == b',' {
            out.push(b',');
        }
    }
    OsString::from_vec(out)
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn flag(&mut self, f: &str) -> &mut Self {
        self.0.push(f.into());
        self
    }
    fn arg(&mut self, v: impl Into<OsString>) -> &mut Self {
        self.0.push(v.into());
        self
    }
}

/// Renders arguments as one shell-like line for logs and reports (not for execution).
pub(crate) fn display_command(binary: &OsStr, args: &[OsString]) -> String {
    std::iter::once(binary)
        .chain(args.iter().map(OsString::as_os_str))
        .map(|a| {
            let s = a.to_string_lossy();
            if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '"') {
                format!("{s:?}")
            } else {
                s.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn args_of(c: &VmConfig, tsc: Option<u64>) -> Vec<OsString> {
        qemu_args(c, &JailedFiles::host(c), None, tsc)
    }

    fn cfg(accel: Accel) -> VmConfig {
        VmConfig {
            name: "sbx-1".into(),
            vcpus: 2,
            memory_mib: 256,
            kernel: PathBuf::from("/boot/vmlinuz"),
            initrd: PathBuf::from("/img/initrd"),
            cmdline: "console=ttyS0 quiet".into(),
            root_disk: PathBuf::from("/data/a,b.raw"),
            run_dir: PathBuf::from("/run/sbx-1"),
            accel,
            tcg_tb_size_mib: Some(64),
            memory: GuestMemory::Anonymous,
            restore: None,
            network: None,
        }
    }

    #[test]
    fn network_card_on_a_tap() {
        let mut c = cfg(Accel::Tcg);
        let none = strings(&args_of(&c, None));
        assert!(!none.iter().any(|a| a.contains("virtio-net")));
        c.network = Some(crate::VmNetwork {
            netns: PathBuf::from("/run/netns/x"),
            tap: "tap0".into(),
            mac: [2, 0x53, 0x50, 0, 2, 0x0f],
        });
        let args = strings(&args_of(&c, None));
        assert!(args.contains(&"tap,id=net0,fd=6".to_owned()));
        assert!(args.contains(&"virtio-net-device,netdev=net0,mac=02:53:50:00:02:0f".to_owned()));
    }

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn value_of<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn tcg_command_line() {
        let c = cfg(Accel::Tcg);
        let args = strings(&args_of(&c, Some(2_596_134)));
        assert_eq!(value_of(&args, "-name"), ["sbx-1,debug-threads=off"]);
        assert_eq!(
            value_of(&args, "-M"),
            ["microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=on,memory-backend=mem"]
        );
        assert_eq!(
            value_of(&args, "-object"),
            [
                "secret,id=space-run-dir,data=/run/sbx-1",
                "memory-backend-ram,id=mem,size=256M"
            ]
        );
        assert!(!args.iter().any(|a| a == "-incoming"));
        assert!(!args.iter().any(|a| a == "-sandbox" || a == "-pidfile"));
        assert_eq!(value_of(&args, "-accel"), ["tcg,tb-size=64"]);
        assert_eq!(value_of(&args, "-cpu"), ["max"]);
        assert_eq!(
            value_of(&args, "-append"),
            ["console=ttyS0 quiet tsc_early_khz=2596134"]
        );
        assert_eq!(
            value_of(&args, "-drive"),
            ["id=root,file=/data/a,,b.raw,format=raw,if=none,discard=unmap"]
        );
        assert!(value_of(&args, "-chardev").contains(&"socket,id=qmp,fd=3,server=on,wait=off"));
        assert!(
            value_of(&args, "-device").contains(&"virtserialport,chardev=channel,name=space.agent")
        );
        assert_eq!(args.last().map(String::as_str), Some("-S"));
    }

    #[test]
    fn restore_from_shared_memory_file() {
        let mut c = cfg(Accel::Tcg);
        c.memory = GuestMemory::File {
            path: PathBuf::from("/img/a,b/memory"),
            shared: false,
        };
        c.restore = Some(crate::RestoreFrom {
            ignore_shared: true,
        });
        let args = strings(&args_of(&c, None));
        assert_eq!(
            value_of(&args, "-object")[1],
            "memory-backend-file,id=mem,size=256M,share=off,mem-path=/img/a,,b/memory"
        );
        assert_eq!(value_of(&args, "-incoming"), ["defer"]);
        assert_eq!(args.last().map(String::as_str), Some("-S"));
    }

    #[test]
    fn kvm_command_line() {
        let c = cfg(Accel::Kvm);
        let args = strings(&args_of(&c, Some(1)));
        assert_eq!(value_of(&args, "-accel"), ["kvm"]);
        assert_eq!(value_of(&args, "-cpu"), ["host"]);
        // KVM guests use kvmclock; no TSC override.
        assert_eq!(value_of(&args, "-append"), ["console=ttyS0 quiet"]);
    }

    #[test]
    fn a_jailed_vmm_sees_jail_paths_a_seccomp_filter_and_disk_throttling() {
        let c = cfg(Accel::Tcg);
        let files = JailedFiles {
            kernel: "/kernel/vmlinuz".into(),
            initrd: "/kernel/initrd".into(),
            disk: "/disk.raw".into(),
            memory: None,
        };
        let limits = DiskLimits {
            bytes_per_sec: 100,
            iops: 7,
        };
        let args = strings(&qemu_args(&c, &files, Some(&limits), None));
        assert_eq!(value_of(&args, "-kernel"), ["/kernel/vmlinuz"]);
        assert_eq!(
            value_of(&args, "-drive"),
            ["id=root,file=/disk.raw,format=raw,if=none,discard=unmap,throttling.bps-total=100,throttling.iops-total=7"]
        );
        assert_eq!(
            value_of(&args, "-sandbox"),
            ["on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]
        );
        // Nothing of the host's file system is named but the run-dir marker.
        let host = args
            .iter()
            .filter(|a| a.contains("/data/") || a.contains("/boot/") || a.contains("/img/"))
            .count();
        assert_eq!(host, 0, "{args:?}");
    }

    #[test]
    fn explicit_tsc_khz_wins() {
        let mut c = cfg(Accel::Tcg);
        c.cmdline = "tsc_early_khz=1000 console=ttyS0".into();
        assert_eq!(
            kernel_cmdline(&c, Some(5)),
            "tsc_early_khz=1000 console=ttyS0"
        );
        c.cmdline = String::new();
        assert_eq!(kernel_cmdline(&c, Some(5)), "tsc_early_khz=5");
        assert_eq!(kernel_cmdline(&c, None), "");
    }

    #[test]
    fn display_quotes_spaces() {
        let line = display_command(OsStr::new("qemu"), &["-append".into(), "a b".into()]);
        assert_eq!(line, "qemu -append \"a b\"");
    }
}

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
use crate::config::{GuestMemory, VmConfig, VmPaths};

/// Name of the virtio-serial port the guest daemon opens (`/sys/class/virtio-ports/*/name`).
pub const AGENT_PORT_NAME: &str = "space.agent";
/// QEMU object id of guest RAM. The RAM block is named after it, and restores match blocks by
/// name, so it must never change.
pub(crate) const RAM_ID: &str = "mem";
/// QEMU drive id of the root disk (used by `block_resize`).
pub(crate) const ROOT_DRIVE: &str = "root";
/// QEMU chardev id of the serial console (matched in `query-chardev`).
pub(crate) const CONSOLE_CHARDEV: &str = "console";

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
    paths: &VmPaths,
    host_tsc_khz: Option<u64>,
) -> Vec<OsString> {
    let mut a = Args::default();
    a.flag("-name")
        .arg(format!("{},debug-threads=off", cfg.name));
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
    a.flag("-object").arg(memory_object(cfg));
    a.flag("-nodefaults")
        .flag("-no-user-config")
        .flag("-nographic")
        .flag("-no-reboot");
    a.flag("-msg").arg("timestamp=on");
    // -kernel/-initrd/-append/-pidfile take their value verbatim (no option parsing, no escaping).
    a.flag("-kernel").arg(cfg.kernel.as_os_str());
    a.flag("-initrd").arg(cfg.initrd.as_os_str());
    a.flag("-append").arg(kernel_cmdline(cfg, host_tsc_khz));
    a.flag("-pidfile").arg(paths.pidfile.as_os_str());
    // QMP on a chardev (not -qmp unix:…) so the path goes through the same escaping as the others.
    a.flag("-chardev")
        .arg(socket_chardev("qmp", paths.qmp.as_os_str()));
    a.flag("-mon").arg("chardev=qmp,mode=control");
    a.flag("-chardev")
        .arg(socket_chardev(CONSOLE_CHARDEV, paths.console.as_os_str()));
    a.flag("-serial").arg(format!("chardev:{CONSOLE_CHARDEV}"));
    let mut drive = OsString::from(format!("id={ROOT_DRIVE},file="));
    drive.push(escape_opt(cfg.root_disk.as_os_str()));
    drive.push(",format=raw,if=none,discard=unmap");
    a.flag("-drive").arg(drive);
    a.flag("-device").arg("virtio-blk-device,drive=root");
    a.flag("-device").arg("virtio-serial-device");
    a.flag("-chardev")
        .arg(socket_chardev("channel", paths.channel.as_os_str()));
    a.flag("-device").arg(format!(
        "virtserialport,chardev=channel,name={AGENT_PORT_NAME}"
    ));
    a.flag("-device").arg("virtio-rng-device");
    if let Some(net) = &cfg.network {
        // The TAP exists already (persistent, with a virtio-net header) in the namespace
        // QEMU runs in; no scripts, QEMU never configures the host.
        a.flag("-netdev").arg(format!(
            "tap,id=net0,ifname={},script=no,downscript=no,vnet_hdr=on",
            net.tap
        ));
        a.flag("-device").arg(format!(
            "virtio-net-device,netdev=net0,mac={}",
            net.mac_text()
        ));
    }
    if cfg.restore.is_some() {
        // The state is fed in over QMP (`migrate-incoming`) once QMP and the console are up.
        a.flag("-incoming").arg("defer");
    }
    a.flag("-S");
    a.0
}

/// The `-object` that backs guest RAM.
fn memory_object(cfg: &VmConfig) -> OsString {
    match &cfg.memory {
        GuestMemory::Anonymous => OsString::from(format!(
            "memory-backend-ram,id={RAM_ID},size={}M",
            cfg.memory_mib
        )),
        GuestMemory::File { path, shared } => {
            let mut s = OsString::from(format!(
                "memory-backend-file,id={RAM_ID},size={}M,share={},mem-path=",
                cfg.memory_mib,
                if *shared { "on" } else { "off" }
            ));
            s.push(escape_opt(path.as_os_str()));
            s
        }
    }
}

/// A listening Unix socket chardev that does not wait for a client.
fn socket_chardev(id: &str, path: &OsStr) -> OsString {
    let mut s = OsString::from(format!("socket,id={id},path="));
    s.push(escape_opt(path));
    s.push(",server=on,wait=off");
    s
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
    use std::path::{Path, PathBuf};

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
        let none = strings(&qemu_args(&c, &VmPaths::new(&c.run_dir), None));
        assert!(!none.iter().any(|a| a.contains("virtio-net")));
        c.network = Some(crate::VmNetwork {
            netns: PathBuf::from("/run/netns/x"),
            tap: "tap0".into(),
            mac: [2, 0x53, 0x50, 0, 2, 0x0f],
        });
        let args = strings(&qemu_args(&c, &VmPaths::new(&c.run_dir), None));
        assert!(args
            .contains(&"tap,id=net0,ifname=tap0,script=no,downscript=no,vnet_hdr=on".to_owned()));
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
        let args = strings(&qemu_args(&c, &VmPaths::new(&c.run_dir), Some(2_596_134)));
        assert_eq!(value_of(&args, "-name"), ["sbx-1,debug-threads=off"]);
        assert_eq!(
            value_of(&args, "-M"),
            ["microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=on,memory-backend=mem"]
        );
        assert_eq!(
            value_of(&args, "-object"),
            ["memory-backend-ram,id=mem,size=256M"]
        );
        assert!(!args.iter().any(|a| a == "-incoming"));
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
        assert!(value_of(&args, "-chardev")
            .contains(&"socket,id=qmp,path=/run/sbx-1/qmp.sock,server=on,wait=off"));
        assert!(
            value_of(&args, "-device").contains(&"virtserialport,chardev=channel,name=space.agent")
        );
        assert_eq!(value_of(&args, "-pidfile"), ["/run/sbx-1/vmm.pid"]);
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
            state: PathBuf::from("/img/state"),
            ignore_shared: true,
            paused: false,
        });
        let args = strings(&qemu_args(&c, &VmPaths::new(&c.run_dir), None));
        assert_eq!(
            value_of(&args, "-object"),
            ["memory-backend-file,id=mem,size=256M,share=off,mem-path=/img/a,,b/memory"]
        );
        assert_eq!(value_of(&args, "-incoming"), ["defer"]);
        assert_eq!(args.last().map(String::as_str), Some("-S"));
    }

    #[test]
    fn kvm_command_line() {
        let c = cfg(Accel::Kvm);
        let args = strings(&qemu_args(&c, &VmPaths::new(Path::new("/r")), Some(1)));
        assert_eq!(value_of(&args, "-accel"), ["kvm"]);
        assert_eq!(value_of(&args, "-cpu"), ["host"]);
        // KVM guests use kvmclock; no TSC override.
        assert_eq!(value_of(&args, "-append"), ["console=ttyS0 quiet"]);
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

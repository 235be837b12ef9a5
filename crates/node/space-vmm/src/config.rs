//! What a VM is started with ([`VmConfig`]), where its runtime files live ([`VmPaths`]),
//! and the checks that reject a bad config before any process is spawned.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::accel::Accel;
use crate::error::VmmError;

/// Longest VM name we accept (it is a sandbox id, e.g. `sbx-…`).
pub const MAX_NAME_LEN: usize = 64;
/// Longest kernel command line we accept; x86 Linux truncates at 2048 bytes and we may append
/// `tsc_early_khz=…`.
pub const MAX_KERNEL_CMDLINE_LEN: usize = 1900;
/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH_LEN: usize = 107;

/// Everything needed to start one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// Sandbox id, e.g. `sbx-…`; goes into `-name` so our QEMU processes can be recognised.
    pub name: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// Kernel command line. Under TCG, `tsc_early_khz=<host TSC kHz>` is appended unless present.
    pub cmdline: String,
    /// Raw disk image (ext4); the guest sees it as /dev/vda.
    pub root_disk: PathBuf,
    /// Per-VM directory for the sockets, logs and pidfile (see [`VmPaths`]).
    pub run_dir: PathBuf,
    pub accel: Accel,
    /// Under TCG, bounds the translation cache (`-accel tcg,tb-size=N`), which dominates RSS.
    pub tcg_tb_size_mib: Option<u32>,
    /// What backs guest RAM.
    pub memory: GuestMemory,
    /// Start from saved state instead of booting the kernel (see [`RestoreFrom`]).
    pub restore: Option<RestoreFrom>,
    /// The guest's network card, if it has one.
    pub network: Option<VmNetwork>,
}

/// The guest's NIC (virtio-net), attached to a TAP device inside a network namespace. The
/// VMM process itself runs in that namespace: it opens the TAP there, and a VMM compromised
/// by its guest finds nothing else to reach. A VM's device set is part of its saved state,
/// so a VM restored from state must have a network exactly when the saved one had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmNetwork {
    /// The namespace (a `/run/netns/<name>` file).
    pub netns: PathBuf,
    /// The TAP device inside it (made beforehand, persistent).
    pub tap: String,
    /// The guest's MAC address.
    pub mac: [u8; 6],
}

impl VmNetwork {
    /// The MAC as `aa:bb:cc:dd:ee:ff`.
    pub fn mac_text(&self) -> String {
        space_core::mac::format(&self.mac)
    }
}

/// What backs guest RAM. Whatever the backing, the RAM block has the same name, so state
/// saved from one kind of VM restores into another.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GuestMemory {
    /// Private anonymous memory.
    #[default]
    Anonymous,
    /// A file mapped as guest RAM (`memory-backend-file`). With `shared`, guest writes go to
    /// the file (a VM whose memory becomes a memory image); without, the file is mapped
    /// copy-on-write, so every VM started from one image shares its unmodified pages.
    File { path: PathBuf, shared: bool },
    /// A memory image that exists in memory only (a fork's), held by the VMM driver under
    /// `image` until [`crate::Vmm::forget_memory_image`]. With `shared`, this VM fills a new
    /// one (guest writes reach it); without, it maps a filled one copy-on-write, which first
    /// seals it: that needs the VM that filled it to be gone.
    InMemory { image: String, shared: bool },
}

/// A VM that starts from saved state instead of booting its kernel: QEMU waits for the state
/// (`-incoming defer`), which whoever launched it feeds in with [`crate::Vm::load_state`]
/// over a descriptor. The launcher never opens a state file: a saved state may be sealed
/// under a tenant's key, which only the sandbox manager holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreFrom {
    /// The state was saved with `x-ignore-shared`: guest RAM comes from the memory image of
    /// [`GuestMemory::File`] or [`GuestMemory::InMemory`], not from the state.
    pub ignore_shared: bool,
}

/// The runtime files of one VM, all inside its run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmPaths {
    pub run_dir: PathBuf,
    /// QMP control socket (QEMU listens).
    pub qmp: PathBuf,
    /// Host end of the `space.agent` virtio-serial port (QEMU listens; the guest client connects).
    pub channel: PathBuf,
    /// Serial console socket (QEMU listens; this crate copies it into `console_log`).
    pub console: PathBuf,
    /// Guest serial console output, at most [`crate::CONSOLE_LOG_MAX_BYTES`], older output in `console.log.1`.
    pub console_log: PathBuf,
    /// QEMU's stdout/stderr.
    pub vmm_log: PathBuf,
    /// QEMU writes its pid here (`-pidfile`); used to re-adopt the VM after a restart.
    pub pidfile: PathBuf,
}

impl VmPaths {
    /// The fixed file names inside `run_dir`.
    pub fn new(run_dir: &Path) -> Self {
        VmPaths {
            run_dir: run_dir.to_path_buf(),
            qmp: run_dir.join("qmp.sock"),
            channel: run_dir.join("channel.sock"),
            console: run_dir.join("console.sock"),
            console_log: run_dir.join("console.log"),
            vmm_log: run_dir.join("vmm.log"),
            pidfile: run_dir.join("vmm.pid"),
        }
    }

    /// Files that only mean something while QEMU runs; stale after it died by SIGKILL.
    pub(crate) fn runtime_files(&self) -> [&Path; 4] {
        [&self.qmp, &self.channel, &self.console, &self.pidfile]
    }

    /// Removes stale runtime files; missing files are fine.
    pub(crate) fn remove_runtime_files(&self) {
        for path in self.runtime_files() {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove stale VM file")
                }
            }
        }
    }
}

/// A VM name must be safe inside QEMU's `-name` option and recognisable in /proc/<pid>/cmdline.
pub fn validate_name(name: &str) -> Result<(), VmmError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(VmmError::InvalidConfig(format!(
            "VM name must be 1..={MAX_NAME_LEN} bytes, got {}",
            name.len()
        )));
    }
    if name.starts_with('-')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(VmmError::InvalidConfig(format!(
            "VM name {name:?} may only contain ASCII letters, digits, '-', '_' and '.' and must not start with '-'"
        )));
    }
    Ok(())
}

/// Checks a config without touching the file system beyond `stat`.
pub(crate) fn validate(cfg: &VmConfig) -> Result<(), VmmError> {
    validate_name(&cfg.name)?;
    if cfg.vcpus == 0 || cfg.vcpus > 255 {
        return Err(VmmError::InvalidConfig(format!(
            "vcpus must be 1..=255, got {}",
            cfg.vcpus
        )));
    }
    if cfg.memory_mib < 16 {
        return Err(VmmError::InvalidConfig(format!(
            "memory_mib must be at least 16, got {}",
            cfg.memory_mib
        )));
    }
    if cfg.tcg_tb_size_mib == Some(0) {
        return Err(VmmError::InvalidConfig(
            "tcg_tb_size_mib must be positive".into(),
        ));
    }
    if cfg.cmdline.len() > MAX_KERNEL_CMDLINE_LEN || cfg.cmdline.contains('\0') {
        return Err(VmmError::InvalidConfig(format!(
            "kernel command line must be at most {MAX_KERNEL_CMDLINE_LEN} bytes without NUL"
        )));
    }
    for (what, path) in [
        ("kernel", &cfg.kernel),
        ("initrd", &cfg.initrd),
        ("root_disk", &cfg.root_disk),
    ] {
        if path.as_os_str().as_bytes().contains(&0) {
            return Err(VmmError::InvalidConfig(format!("{what} path contains NUL")));
        }
        if !path.is_file() {
            return Err(VmmError::InvalidConfig(format!(
                "{what} {} is not a file",
                path.display()
            )));
        }
    }
    match &cfg.memory {
        GuestMemory::File { path, .. } => check_plain_path("memory file", path)?,
        // Named like a VM (it is a fork's), so the same rule keeps it plain.
        GuestMemory::InMemory { image, .. } => validate_name(image)?,
        GuestMemory::Anonymous => {}
    }
    if let Some(net) = &cfg.network {
        // IFNAMSIZ is 16 with the NUL; the name goes into a QEMU option string.
        let plain_tap = !net.tap.is_empty()
            && net.tap.len() < 16
            && net
                .tap
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
        if !plain_tap {
            return Err(VmmError::InvalidConfig(format!(
                "TAP name {:?} must be 1..=15 ASCII letters, digits, '-' or '_'",
                net.tap
            )));
        }
        if net.mac[0] & 1 == 1 {
            return Err(VmmError::InvalidConfig(
                "the guest MAC must be unicast".into(),
            ));
        }
        if !net.netns.is_file() {
            return Err(VmmError::InvalidConfig(format!(
                "network namespace {} does not exist",
                net.netns.display()
            )));
        }
    }
    if let Some(restore) = &cfg.restore {
        match (&cfg.memory, restore.ignore_shared) {
            (
                GuestMemory::File {
                    path,
                    shared: false,
                },
                true,
            ) if path.is_file() => {}
            (GuestMemory::InMemory { shared: false, .. }, true) => {}
            (_, true) => return Err(VmmError::InvalidConfig(
                "state saved without its memory needs an existing memory image mapped copy-on-write"
                    .into(),
            )),
            _ => {}
        }
    }
    if !cfg.run_dir.is_absolute() {
        return Err(VmmError::InvalidConfig(format!(
            "run_dir {} must be absolute (QEMU resolves socket paths itself)",
            cfg.run_dir.display()
        )));
    }
    validate_socket_paths(&VmPaths::new(&cfg.run_dir))
}

/// State and memory paths name files the node opens (and, unjailed, QEMU options); only
/// absolute paths without quotes or control characters are accepted, so they also read
/// unambiguously in logs and command lines.
pub(crate) fn check_plain_path(what: &str, path: &Path) -> Result<(), VmmError> {
    let bytes = path.as_os_str().as_bytes();
    if !path.is_absolute() || bytes.iter().any(|&b| b == b'\'' || b < 0x20 || b == 0x7f) {
        return Err(VmmError::InvalidConfig(format!(
            "{what} path {} must be absolute and free of quotes and control characters",
            path.display()
        )));
    }
    Ok(())
}

/// Unix socket paths longer than `sun_path` cannot be bound; say so before QEMU does cryptically.
pub(crate) fn validate_socket_paths(paths: &VmPaths) -> Result<(), VmmError> {
    for sock in [&paths.qmp, &paths.channel, &paths.console] {
        let len = sock.as_os_str().len();
        if len > MAX_SOCKET_PATH_LEN {
            return Err(VmmError::InvalidConfig(format!(
                "socket path {} is {len} bytes; Unix sockets allow at most {MAX_SOCKET_PATH_LEN}: use a shorter run_dir",
                sock.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("sbx-01HXYZ_a.b").is_ok());
        for bad in ["", "-rf", "a,b", "a=b", "a b", "ü", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn paths_live_in_run_dir() {
        let p = VmPaths::new(Path::new("/run/space/sbx-1"));
        assert_eq!(p.qmp, Path::new("/run/space/sbx-1/qmp.sock"));
        assert_eq!(p.pidfile, Path::new("/run/space/sbx-1/vmm.pid"));
        assert_eq!(p.console_log, Path::new("/run/space/sbx-1/console.log"));
        assert!(validate_socket_paths(&p).is_ok());
        let long = VmPaths::new(&Path::new("/").join("d".repeat(100)));
        assert!(validate_socket_paths(&long).is_err());
    }
}

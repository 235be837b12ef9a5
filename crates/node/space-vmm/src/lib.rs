//! The `Vmm` backend trait and its QEMU microvm implementation.
//!
//! A [`Vmm`] starts VMs ([`Vmm::launch`]) and re-attaches to VMs an earlier node process
//! started ([`Vmm::adopt`]); both give a [`Vm`] handle for status, exit notification and
//! killing. [`QemuVmm`] runs `qemu-system-x86_64 -M microvm` with virtio-mmio devices, driven
//! over QMP. QEMU runs in its own session, so VMs outlive a restart of the node, and in a jail
//! of its own ([`jail`]): its own uid, namespaces, root directory, cgroup and seccomp filter.

mod accel;
mod config;
mod console;
mod error;
mod exit;
pub mod jail;
mod process;
mod procfs;
mod qemu;
mod qemu_args;
mod qmp;
mod state;
mod tsc;
mod vm;

use std::path::Path;

pub use accel::{accel_for, detect_accel, Accel, ParseAccelError};
pub use config::{
    validate_name, GuestMemory, RestoreFrom, VmConfig, VmNetwork, VmPaths, MAX_KERNEL_CMDLINE_LEN,
    MAX_NAME_LEN,
};
pub use console::{console_tail, CONSOLE_LOG_MAX_BYTES};
pub use error::VmmError;
pub use exit::{ProcessEnd, VmExit};
pub use jail::{CgroupLayout, DiskLimits, FileOwner, InMemoryImageError, JailConfig, UidRange};
pub use qemu::{attach, JailedProcess, QemuVmm};
pub use qemu_args::AGENT_PORT_NAME;
pub use state::{SaveOptions, SaveReport};
pub use vm::ExitStatus;
pub use vm::{ReleasedVm, Vm, VmStatus};

/// A VMM backend (QEMU today; Firecracker could be another).
#[async_trait::async_trait]
pub trait Vmm: Send + Sync + 'static {
    /// Short backend name, e.g. "qemu".
    fn kind(&self) -> &'static str;

    /// Starts the VMM and returns once it answers on its control socket and the guest runs.
    async fn launch(&self, cfg: &VmConfig) -> Result<Vm, VmmError>;

    /// Re-attaches to a VM started by an earlier process (after `space server` restarts): reads
    /// the pidfile, checks the pid is alive and really is our VMM for `name` (guarding against
    /// pid reuse), and reconnects the control socket and the console.
    async fn adopt(&self, name: &str, run_dir: &Path) -> Result<Vm, VmmError>;

    /// Kills every VMM of ours started for `name` with its runtime files under `run_root`
    /// that no `Vm` handle covers (found by its command line, e.g. one whose starter died
    /// before its pidfile or control socket was usable). Returns how many were killed. A
    /// VMM of the same name under another run directory (another node's on this machine,
    /// say a sandbox that moved there) is not ours.
    async fn kill_strays(&self, name: &str, run_root: &Path) -> Result<usize, VmmError>;

    /// Names of every live VMM of this backend whose runtime files lie under `run_root`.
    fn names_under(&self, run_root: &Path) -> Vec<String>;

    /// Removes what VMMs that ended unwatched (their node crashed) left behind, such as empty
    /// cgroups; returns how many were removed.
    fn remove_stale_confinement(&self) -> usize;

    /// Drops the in-memory image `image` ([`GuestMemory::InMemory`]); VMs that map it keep
    /// their pages. Returns whether it existed.
    fn forget_memory_image(&self, image: &str) -> bool;
}

//! The VMM jail: the second wall around a sandbox, after the VM itself.
//!
//! Every QEMU starts, in the spirit of Firecracker's jailer, as PID 1 of its own pid, mount,
//! ipc and uts namespaces, inside the sandbox's network namespace, after `pivot_root` into a
//! per-VM directory (`<run_dir>/root`) that holds only what it needs: `/usr` (QEMU, its
//! libraries and firmware) read-only, the kernel bundle read-only, its own disk, and `/proc`
//! showing only itself. Its sockets, TAP device, memory image and state files arrive as
//! descriptors; it never sees a path of the host. It runs as a uid and gid of its own from a
//! reserved range ([`UidRange`]), with no capabilities (the bounding set emptied too),
//! `no_new_privs`, a seccomp filter of the jail's own (no namespaces, mounts, tracing, kernel
//! modules, BPF or keyrings), an empty environment, no core dumps and bounded descriptors,
//! in a network namespace of its own when the sandbox has none, in a cgroup
//! of its own limiting CPU, memory, pids and disk I/O, with an `oom_score_adj` that makes it
//! the kernel's first choice under memory pressure, and under QEMU's own seccomp filter
//! (`-sandbox on,…,spawn=deny,…`), so it can neither run a program nor gain privileges.
//!
//! [`plan`] derives every path and mount from a [`VmConfig`] (pure, unit-tested); [`spawn`]
//! carries the plan out in a child between `clone3` and `execve`.

mod block_device;
mod cgroup;
mod memory_image;
mod plan;
pub(crate) mod prepare;
mod seccomp;
pub(crate) mod spawn;
mod uids;

use std::path::{Path, PathBuf};

pub(crate) use block_device::BlockDevices;
pub use cgroup::CgroupLayout;
pub(crate) use cgroup::{remove_empty as remove_empty_cgroups, VmCgroup};
pub use memory_image::InMemoryImageError;
pub(crate) use memory_image::MemoryImages;
pub(crate) use plan::{fds, passed_memory, plan, Bind, JailedFiles, PassedMemory};
pub(crate) use uids::lease as lease_uid;
pub use uids::UidRange;

/// How a node jails its VMMs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailConfig {
    /// Uids (and gids) handed to VMMs, one per live VMM.
    pub uids: UidRange,
    /// Lock files of the uids in use, shared by every node on the machine.
    pub uid_lock_dir: PathBuf,
    /// Where cgroups live on this host.
    pub cgroups: CgroupLayout,
    /// The node's cgroup directory, relative to the hierarchy root (`space/<node>`); each VMM
    /// gets `<cgroup_parent>/<vm name>`.
    pub cgroup_parent: PathBuf,
    /// Memory a VMM may use beyond guest RAM (device emulation, I/O buffers, page cache of
    /// its disk), on top of the TCG translation cache when there is one.
    pub vmm_overhead_mib: u64,
    /// Processes and threads a VMM may have (QEMU: vCPU threads, I/O workers).
    pub max_pids: u32,
    /// Descriptors a VMM may hold.
    pub max_open_files: u64,
    /// `oom_score_adj` of every VMM: under memory pressure the kernel kills a VMM (one
    /// sandbox) before anything else of the node.
    pub oom_score_adj: i32,
    /// Disk I/O each VMM may do per vCPU, enforced by QEMU on its disk and by the cgroup on
    /// the block device under the disk's file system (when it has one).
    pub disk_per_vcpu: DiskLimits,
    /// Who a VM's files belong to while no VMM holds them: its three sockets (mode 0600, so
    /// only that uid may connect), and the disk and RAM file lent to a VMM, given back when
    /// it exits. The sandbox manager's uid, which may be another process's.
    pub files_owner: FileOwner,
}

/// A uid and gid that files are handed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOwner {
    pub uid: u32,
    pub gid: u32,
}

impl FileOwner {
    /// This process's effective uid and gid.
    pub fn current() -> FileOwner {
        FileOwner {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        }
    }

    /// Runs `f` on this thread with this owner's file-system identity: its uid and gid for
    /// every permission check and every file `f` creates, and no supplementary groups. The
    /// node manager opens and makes files in directories the sandbox manager may write
    /// this way, so that a symlink swapped in there can lead it only where the sandbox
    /// manager itself may go. File-system identity is per thread (`setfsuid`), and `f` is
    /// synchronous: nothing else runs on the thread meanwhile. When this process already is
    /// this owner, `f` just runs.
    pub fn act_as<T>(&self, f: impl FnOnce() -> T) -> std::io::Result<T> {
        let us = FileOwner::current();
        if *self == us {
            return Ok(f());
        }
        let _identity = FsIdentity::enter(*self, us)?;
        Ok(f())
    }

    /// Gives `path` to this owner with `mode`, through a descriptor opened without following
    /// a symlink: a name in a directory the sandbox manager may write can be swapped for a
    /// link at any moment, and root's `chown` must never follow it. A symlink is refused.
    pub fn give(&self, path: &Path, mode: u32) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        if f.metadata()?.file_type().is_symlink() {
            return Err(std::io::Error::other(format!(
                "{} is a symlink",
                path.display()
            )));
        }
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        std::os::unix::fs::chown(&by_fd, Some(self.uid), Some(self.gid))?;
        std::fs::set_permissions(&by_fd, std::fs::Permissions::from_mode(mode))
    }
}

/// Disk I/O bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskLimits {
    pub bytes_per_sec: u64,
    pub iops: u64,
}

impl JailConfig {
    /// Defaults for a node whose VMM cgroups go under `space/<node>`.
    pub fn new(node: &str) -> JailConfig {
        JailConfig {
            uids: UidRange::DEFAULT,
            uid_lock_dir: PathBuf::from("/run/space/vmm-uids"),
            cgroups: CgroupLayout::detect(),
            cgroup_parent: PathBuf::from("space").join(node),
            vmm_overhead_mib: 256,
            max_pids: 128,
            max_open_files: 1024,
            oom_score_adj: 800,
            disk_per_vcpu: DiskLimits {
                bytes_per_sec: 256 << 20,
                iops: 20_000,
            },
            files_owner: FileOwner::current(),
        }
    }
}

/// A thread's file-system identity switched to another owner, switched back when dropped.
struct FsIdentity {
    back: FileOwner,
    groups: Vec<libc::gid_t>,
}

impl FsIdentity {
    fn enter(to: FileOwner, back: FileOwner) -> std::io::Result<FsIdentity> {
        let groups = nix::unistd::getgroups()
            .map_err(std::io::Error::from)?
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        let identity = FsIdentity { back, groups };
        // The raw system calls: glibc's setgroups changes every thread of the process.
        // SAFETY: setgroups with an empty list; setfsgid/setfsuid take plain integers.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::setfsgid(to.gid);
            libc::setfsuid(to.uid);
        }
        // setfsuid reports nothing but the previous value: ask again to know it took.
        // SAFETY: as above.
        let (uid, gid) = unsafe { (libc::setfsuid(to.uid), libc::setfsgid(to.gid)) };
        if uid as u32 != to.uid || gid as u32 != to.gid {
            return Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        }
        Ok(identity)
    }
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        // SAFETY: restores this thread's identity and groups as they were.
        unsafe {
            libc::setfsuid(self.back.uid);
            libc::setfsgid(self.back.gid);
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr());
        }
    }
}

//! A cgroup per jailed VMM: CPU (its vCPUs), memory (guest RAM plus a bounded VMM overhead),
//! pids and disk I/O, on cgroup v2 where the host has it and on the v1 controllers where it
//! does not (these machines: `cpu`, `memory`, `pids`, `blkio` under `/sys/fs/cgroup`).
//!
//! The files each version wants are computed by pure functions ([`v1_files`], [`v2_files`],
//! [`parent_files`]), so both are unit-tested even on a host that has only one of them.
//!
//! CPU under contention: unjailed, every VMM thread competed with the host's threads on its
//! own. In one cgroup tree, the kernel shares CPU between siblings by weight, so with
//! default weights all the node's VMMs together would weigh as much as one host thread, and a
//! busy host (a pool refill, the gateways) would starve them. The tree's parents therefore
//! weigh as much as one thread per host CPU, and each VMM as much as its vCPUs: among
//! themselves VMMs share by size, and as a whole they weigh what their threads did. Measured
//! in BENCHMARKS.md ("VMM jail").

use std::io;
use std::path::{Path, PathBuf};

/// Where cgroups live on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// The unified hierarchy (`cgroup2` mounted at `root`, with controllers).
    V2 { root: PathBuf },
    /// One hierarchy per controller, `root/<controller>`.
    V1 { root: PathBuf },
}

/// The v1 controllers a VMM is limited by.
const V1_CONTROLLERS: [&str; 4] = ["cpu", "memory", "pids", "blkio"];
/// CFS period; the quota is a multiple of it.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;
/// The weight of one thread (one vCPU, one host CPU): v1's default `cpu.shares`.
const V1_SHARES_PER_CPU: u64 = 1024;
/// The same in v2's `cpu.weight` (default 100, at most 10 000).
const V2_WEIGHT_PER_CPU: u64 = 100;
const V2_MAX_WEIGHT: u64 = 10_000;

impl CgroupLayout {
    /// The host's layout under `/sys/fs/cgroup`: v2 when the unified hierarchy is mounted
    /// there with controllers, else v1.
    pub fn detect() -> CgroupLayout {
        let root = PathBuf::from("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() {
            CgroupLayout::V2 { root }
        } else {
            CgroupLayout::V1 { root }
        }
    }
}

/// What one VMM may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limits {
    /// CPU time per [`CPU_PERIOD_US`], in microseconds (100 000 = one core).
    pub(crate) cpu_quota_us: u64,
    /// Its weight under contention, in threads (its vCPUs).
    pub(crate) cpu_weight: u32,
    pub(crate) memory_bytes: u64,
    pub(crate) pids: u32,
    /// Disk I/O bounds on one block device, when it is known.
    pub(crate) io: Option<IoLimit>,
}

/// Disk I/O bounds on one block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IoLimit {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) bytes_per_sec: u64,
    pub(crate) iops: u64,
}

/// The files to write, in order, relative to the VMM's v1 cgroup of each controller.
pub(crate) fn v1_files(limits: &Limits) -> Vec<(&'static str, &'static str, String)> {
    let mut files = vec![
        ("cpu", "cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
        ("cpu", "cpu.cfs_quota_us", limits.cpu_quota_us.to_string()),
        ("cpu", "cpu.shares", v1_shares(limits.cpu_weight)),
        (
            "memory",
            "memory.limit_in_bytes",
            limits.memory_bytes.to_string(),
        ),
        ("pids", "pids.max", limits.pids.to_string()),
    ];
    if let Some(io) = limits.io {
        let dev = format!("{}:{}", io.major, io.minor);
        for (file, value) in [
            ("blkio.throttle.read_bps_device", io.bytes_per_sec),
            ("blkio.throttle.write_bps_device", io.bytes_per_sec),
            ("blkio.throttle.read_iops_device", io.iops),
            ("blkio.throttle.write_iops_device", io.iops),
        ] {
            files.push(("blkio", file, format!("{dev} {value}")));
        }
    }
    files
}

/// The files to write, in order, in the VMM's v2 cgroup.
pub(crate) fn v2_files(limits: &Limits) -> Vec<(&'static str, String)> {
    let mut files = vec![
        (
            "cpu.max",
            format!("{} {CPU_PERIOD_US}", limits.cpu_quota_us),
        ),
        ("cpu.weight", v2_weight(limits.cpu_weight)),
        ("memory.max", limits.memory_bytes.to_string()),
        // Guest memory must not escape the limit into swap.
        ("memory.swap.max", "0".to_owned()),
        ("pids.max", limits.pids.to_string()),
    ];
    if let Some(io) = limits.io {
        files.push((
            "io.max",
            format!(
                "{}:{} rbps={bps} wbps={bps} riops={iops} wiops={iops}",
                io.major,
                io.minor,
                bps = io.bytes_per_sec,
                iops = io.iops
            ),
        ));
    }
    files
}

/// What every parent of the VMMs' cgroups (`space`, `space/<node>`) is given on a host of
/// `host_cpus` CPUs, per layout: (controller, file, value) for v1, controller `""` for v2.
pub(crate) fn parent_files(
    layout: &CgroupLayout,
    host_cpus: u32,
) -> Vec<(&'static str, &'static str, String)> {
    match layout {
        CgroupLayout::V1 { .. } => vec![("cpu", "cpu.shares", v1_shares(host_cpus))],
        CgroupLayout::V2 { .. } => vec![("", "cpu.weight", v2_weight(host_cpus))],
    }
}

fn v1_shares(threads: u32) -> String {
    (u64::from(threads.max(1)) * V1_SHARES_PER_CPU).to_string()
}

fn v2_weight(threads: u32) -> String {
    (u64::from(threads.max(1)) * V2_WEIGHT_PER_CPU)
        .min(V2_MAX_WEIGHT)
        .to_string()
}

/// The host's CPUs this process may run on.
fn host_cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// Gives every parent of the VMMs' cgroups under `parent` its weight ([`parent_files`]).
fn weigh_parents(layout: &CgroupLayout, parent: &Path) -> io::Result<()> {
    let root = match layout {
        CgroupLayout::V1 { root } | CgroupLayout::V2 { root } => root,
    };
    let files = parent_files(layout, host_cpus());
    let mut prefix = PathBuf::new();
    for part in parent.components() {
        prefix.push(part);
        for (controller, file, value) in &files {
            let path = root.join(controller).join(&prefix).join(file);
            std::fs::write(&path, value).map_err(|e| context(e, "write", &path))?;
        }
    }
    Ok(())
}

/// The cgroup (one directory per v1 controller, or one v2 directory) of one VMM.
#[derive(Debug, Clone)]
pub(crate) struct VmCgroup {
    dirs: Vec<PathBuf>,
}

impl VmCgroup {
    /// The cgroup of VM `name` under the node's `parent` (relative, e.g. `space/spc1234`).
    pub(crate) fn of(layout: &CgroupLayout, parent: &Path, name: &str) -> VmCgroup {
        let dirs = match layout {
            CgroupLayout::V2 { root } => vec![root.join(parent).join(name)],
            CgroupLayout::V1 { root } => V1_CONTROLLERS
                .iter()
                .map(|c| root.join(c).join(parent).join(name))
                .collect(),
        };
        VmCgroup { dirs }
    }

    /// Makes the cgroup with `limits` (replacing an empty leftover of the same name).
    pub(crate) fn create(
        layout: &CgroupLayout,
        parent: &Path,
        name: &str,
        limits: &Limits,
    ) -> io::Result<VmCgroup> {
        let cg = VmCgroup::of(layout, parent, name);
        cg.remove()?;
        let made = cg.make(layout, parent, name, limits);
        // The parents exist now; weigh them on every creation, so a weight someone reset
        // is put back.
        made.and_then(|()| weigh_parents(layout, parent))?;
        Ok(cg)
    }

    /// Makes the directories and writes the limits.
    fn make(
        &self,
        layout: &CgroupLayout,
        parent: &Path,
        name: &str,
        limits: &Limits,
    ) -> io::Result<()> {
        match layout {
            CgroupLayout::V2 { root } => {
                enable_v2_controllers(root, parent)?;
                let dir = &self.dirs[0];
                std::fs::create_dir_all(dir).map_err(|e| context(e, "create", dir))?;
                for (file, value) in v2_files(limits) {
                    let path = dir.join(file);
                    match std::fs::write(&path, &value) {
                        // memory.swap.max is absent without swap accounting.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        r => r.map_err(|e| context(e, "write", &path))?,
                    }
                }
            }
            CgroupLayout::V1 { root } => {
                for dir in &self.dirs {
                    std::fs::create_dir_all(dir).map_err(|e| context(e, "create", dir))?;
                }
                for (controller, file, value) in v1_files(limits) {
                    let path = root.join(controller).join(parent).join(name).join(file);
                    match std::fs::write(&path, &value) {
                        // blk-throttle refuses some devices; QEMU's own throttling still holds.
                        Err(e) if controller == "blkio" => {
                            tracing::warn!(file = %path.display(), error = %e, "cannot limit the VMM's disk I/O in its cgroup")
                        }
                        r => r.map_err(|e| context(e, "write", &path))?,
                    }
                }
                // With swap accounting, guest memory must not escape the limit into swap.
                let memsw = root
                    .join("memory")
                    .join(parent)
                    .join(name)
                    .join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    std::fs::write(&memsw, limits.memory_bytes.to_string())
                        .map_err(|e| context(e, "write", &memsw))?;
                }
            }
        }
        Ok(())
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub(crate) fn add(&self, pid: u32) -> io::Result<()> {
        for dir in &self.dirs {
            let procs = dir.join("cgroup.procs");
            std::fs::write(&procs, pid.to_string()).map_err(|e| context(e, "write", &procs))?;
        }
        Ok(())
    }

    /// Removes the cgroup once its processes are gone; missing directories are fine.
    pub(crate) fn remove(&self) -> io::Result<()> {
        for dir in &self.dirs {
            // A cgroup stays busy for a moment after its last task was reaped.
            let mut tries = 0;
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 50 => {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    Err(e) => return Err(context(e, "remove", dir)),
                }
            }
        }
        Ok(())
    }

    /// The cgroup directories.
    #[cfg(test)]
    pub(crate) fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

/// Removes the empty cgroups a crashed node left under `parent` (busy ones are kept).
pub(crate) fn remove_empty(layout: &CgroupLayout, parent: &Path) -> usize {
    let parents: Vec<PathBuf> = match layout {
        CgroupLayout::V2 { root } => vec![root.join(parent)],
        CgroupLayout::V1 { root } => V1_CONTROLLERS
            .iter()
            .map(|c| root.join(c).join(parent))
            .collect(),
    };
    let mut removed = 0;
    for p in parents {
        let Ok(entries) = std::fs::read_dir(&p) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) && std::fs::remove_dir(e.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// v2 distributes a controller to a child only when every ancestor enables it for its
/// children.
fn enable_v2_controllers(root: &Path, parent: &Path) -> io::Result<()> {
    let mut dir = root.to_path_buf();
    for part in std::iter::once(None).chain(parent.components().map(Some)) {
        if let Some(part) = part {
            dir.push(part);
            std::fs::create_dir_all(&dir).map_err(|e| context(e, "create", &dir))?;
        }
        let control = dir.join("cgroup.subtree_control");
        std::fs::write(&control, "+cpu +memory +pids +io")
            .map_err(|e| context(e, "write", &control))?;
    }
    Ok(())
}

fn context(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("cannot {what} cgroup file {}: {e}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(io: Option<IoLimit>) -> Limits {
        Limits {
            cpu_quota_us: 200_000,
            cpu_weight: 2,
            memory_bytes: 768 << 20,
            pids: 128,
            io,
        }
    }

    #[test]
    fn v1_limits() {
        let files = v1_files(&limits(None));
        assert!(files.contains(&("cpu", "cpu.cfs_quota_us", "200000".into())));
        assert!(files.contains(&("cpu", "cpu.shares", "2048".into())));
        assert!(files.contains(&("memory", "memory.limit_in_bytes", "805306368".into())));
        assert!(files.contains(&("pids", "pids.max", "128".into())));
        assert!(!files.iter().any(|f| f.0 == "blkio"));
        let with_io = v1_files(&limits(Some(IoLimit {
            major: 7,
            minor: 3,
            bytes_per_sec: 1000,
            iops: 10,
        })));
        assert!(with_io.contains(&(
            "blkio",
            "blkio.throttle.write_bps_device",
            "7:3 1000".into()
        )));
        assert!(with_io.contains(&("blkio", "blkio.throttle.read_iops_device", "7:3 10".into())));
    }

    #[test]
    fn v2_limits() {
        let files = v2_files(&limits(Some(IoLimit {
            major: 259,
            minor: 0,
            bytes_per_sec: 5,
            iops: 6,
        })));
        assert!(files.contains(&("cpu.max", "200000 100000".into())));
        assert!(files.contains(&("cpu.weight", "200".into())));
        assert!(files.contains(&("memory.max", "805306368".into())));
        assert!(files.contains(&("pids.max", "128".into())));
        assert!(files.contains(&("io.max", "259:0 rbps=5 wbps=5 riops=6 wiops=6".into())));
    }

    #[test]
    fn parents_weigh_one_thread_per_host_cpu() {
        let v1 = CgroupLayout::V1 {
            root: "/sys/fs/cgroup".into(),
        };
        let v2 = CgroupLayout::V2 {
            root: "/sys/fs/cgroup".into(),
        };
        assert_eq!(parent_files(&v1, 8), [("cpu", "cpu.shares", "8192".into())]);
        assert_eq!(parent_files(&v2, 8), [("", "cpu.weight", "800".into())]);
        // v2 weights stop at 10 000; nothing weighs less than one thread.
        assert_eq!(parent_files(&v2, 256)[0].2, "10000");
        assert_eq!(parent_files(&v1, 0)[0].2, "1024");
    }

    #[test]
    fn paths_per_layout() {
        let v1 = VmCgroup::of(
            &CgroupLayout::V1 {
                root: "/sys/fs/cgroup".into(),
            },
            Path::new("space/n1"),
            "sbx-1",
        );
        assert_eq!(v1.dirs().len(), 4);
        assert!(v1
            .dirs()
            .contains(&PathBuf::from("/sys/fs/cgroup/pids/space/n1/sbx-1")));
        let v2 = VmCgroup::of(
            &CgroupLayout::V2 {
                root: "/sys/fs/cgroup".into(),
            },
            Path::new("space/n1"),
            "sbx-1",
        );
        assert_eq!(v2.dirs(), [PathBuf::from("/sys/fs/cgroup/space/n1/sbx-1")]);
    }
}

//! What the jail of one VM holds, derived from its [`VmConfig`] alone: the mounts, the paths
//! QEMU is given, the files lent to its uid, its limits. Pure, so every rule is unit-tested;
//! [`super::spawn`] carries it out.

use std::path::{Path, PathBuf};

use super::cgroup::{IoLimit, Limits, CPU_PERIOD_US};
use super::JailConfig;
use crate::accel::Accel;
use crate::config::{GuestMemory, VmConfig};

/// Descriptor numbers inside the VMM (0–2 are stdin, stdout and stderr).
pub(crate) mod fds {
    use std::os::fd::RawFd;
    pub(crate) const QMP: RawFd = 3;
    pub(crate) const CONSOLE: RawFd = 4;
    pub(crate) const CHANNEL: RawFd = 5;
    pub(crate) const TAP: RawFd = 6;
    /// The memfd of a memory image ([`super::PassedMemory`]).
    pub(crate) const MEMORY: RawFd = 7;
    /// The locked lease of the VMM's uid ([`super::super::UidLease`]).
    pub(crate) const UID_LOCK: RawFd = 8;
}

/// Host paths mirrored into every jail read-only: the VMM binary, its shared libraries and
/// firmware (all under `/usr` on a merged-/usr system, where `/lib`, `/lib64` and `/bin` are
/// symbolic links into it, copied as links), and the dynamic linker's cache.
pub(crate) const SYSTEM_PATHS: [&str; 5] = ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache"];

/// The paths QEMU's command line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JailedFiles {
    pub(crate) kernel: PathBuf,
    pub(crate) initrd: PathBuf,
    pub(crate) disk: PathBuf,
    /// `mem-path` of a file-backed guest RAM.
    pub(crate) memory: Option<PathBuf>,
}

impl JailedFiles {
    /// Without a jail QEMU opens the host's paths.
    pub(crate) fn host(cfg: &VmConfig) -> JailedFiles {
        JailedFiles {
            kernel: cfg.kernel.clone(),
            initrd: cfg.initrd.clone(),
            disk: cfg.root_disk.clone(),
            memory: match &cfg.memory {
                GuestMemory::Anonymous => None,
                GuestMemory::File { path, .. } => Some(path.clone()),
                GuestMemory::InMemory { .. } => Some(passed_memory_path()),
            },
        }
    }
}

/// Guest RAM that reaches the VMM as a memfd ([`fds::MEMORY`]), never by a path of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PassedMemory {
    /// A memory image file, mapped copy-on-write: loaded into a sealed memfd, because a
    /// jailed VMM must not hold the file itself (see [`super::memory_image`]).
    ImageFile(PathBuf),
    /// A new in-memory image this VM fills.
    FillInMemory(String),
    /// A filled in-memory image, sealed, mapped copy-on-write.
    MapInMemory(String),
}

/// What of `memory` is passed as a memfd: in-memory images always; image files only to a
/// jailed VMM (an unjailed one opens the file, as it did before jails).
pub(crate) fn passed_memory(memory: &GuestMemory, jailed: bool) -> Option<PassedMemory> {
    match memory {
        GuestMemory::InMemory {
            image,
            shared: true,
        } => Some(PassedMemory::FillInMemory(image.clone())),
        GuestMemory::InMemory {
            image,
            shared: false,
        } => Some(PassedMemory::MapInMemory(image.clone())),
        GuestMemory::File {
            path,
            shared: false,
        } if jailed => Some(PassedMemory::ImageFile(path.clone())),
        GuestMemory::File { .. } | GuestMemory::Anonymous => None,
    }
}

/// `mem-path` of RAM passed as [`fds::MEMORY`] (QEMU reopens it there).
fn passed_memory_path() -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fds::MEMORY))
}

/// A bind mount of a host file or directory into the jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bind {
    pub(crate) host: PathBuf,
    /// Path inside the jail (absolute).
    pub(crate) jail: PathBuf,
    pub(crate) writable: bool,
    /// Programs may run from it (only the system paths).
    pub(crate) exec: bool,
    /// Device nodes in it work (only `/dev/null` and `/dev/kvm`).
    pub(crate) dev: bool,
    /// Made empty when missing (the RAM file of an image build, which QEMU sizes).
    pub(crate) create: bool,
}

impl Bind {
    /// A program other than the VMM, run in its jail (tests' probes).
    pub(crate) fn program(host: &Path, jail: &str) -> Bind {
        Bind {
            host: host.to_path_buf(),
            jail: PathBuf::from(jail),
            writable: false,
            exec: true,
            dev: false,
            create: false,
        }
    }
}

/// The jail of one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JailPlan {
    /// Host directory that becomes the VMM's `/`.
    pub(crate) root: PathBuf,
    /// Host paths mirrored read-only at the same place (see [`SYSTEM_PATHS`]).
    pub(crate) system: Vec<PathBuf>,
    /// The VM's own files.
    pub(crate) binds: Vec<Bind>,
    /// Files that must belong to the VMM's uid while it runs (QEMU opens them read-write by
    /// path): its disk, and the RAM file of a VM whose memory becomes an image.
    pub(crate) lend: Vec<PathBuf>,
    pub(crate) files: JailedFiles,
    pub(crate) limits: Limits,
    /// Limits of QEMU's own throttling of the disk.
    pub(crate) disk: super::DiskLimits,
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
}

/// The jail of `cfg`'s VM under `jail`'s rules; `block_device` holds its disk's file system.
pub(crate) fn plan(
    cfg: &VmConfig,
    jail: &JailConfig,
    qemu: &Path,
    block_device: Option<(u32, u32)>,
) -> JailPlan {
    let root = cfg.run_dir.join("root");
    let mut system: Vec<PathBuf> = SYSTEM_PATHS.iter().map(PathBuf::from).collect();
    // A VMM installed outside /usr (e.g. /opt/qemu/bin) brings its directory.
    if !qemu.starts_with("/usr") {
        if let Some(dir) = qemu.parent().filter(|d| d.is_absolute()) {
            system.push(dir.to_path_buf());
        }
    }
    let mut binds = vec![
        read_only(&cfg.kernel, "/kernel/vmlinuz"),
        read_only(&cfg.initrd, "/kernel/initrd"),
        Bind {
            host: cfg.root_disk.clone(),
            jail: PathBuf::from("/disk.raw"),
            writable: true,
            exec: false,
            dev: false,
            create: false,
        },
        // QEMU probes its file locking on /dev/null.
        Bind {
            host: PathBuf::from("/dev/null"),
            jail: PathBuf::from("/dev/null"),
            writable: true,
            exec: false,
            dev: true,
            create: false,
        },
    ];
    let mut lend = vec![cfg.root_disk.clone()];
    let memory = match &cfg.memory {
        GuestMemory::Anonymous => None,
        GuestMemory::File { path, shared: true } => {
            binds.push(Bind {
                host: path.clone(),
                jail: PathBuf::from("/memory"),
                writable: true,
                exec: false,
                dev: false,
                create: true,
            });
            lend.push(path.clone());
            Some(PathBuf::from("/memory"))
        }
        GuestMemory::File { shared: false, .. } | GuestMemory::InMemory { .. } => {
            Some(passed_memory_path())
        }
    };
    if cfg.accel == Accel::Kvm {
        binds.push(Bind {
            host: PathBuf::from("/dev/kvm"),
            jail: PathBuf::from("/dev/kvm"),
            writable: true,
            exec: false,
            dev: true,
            create: false,
        });
    }
    let vcpus = u64::from(cfg.vcpus);
    let tcg_cache_mib = match cfg.accel {
        Accel::Tcg => u64::from(cfg.tcg_tb_size_mib.unwrap_or(1024)),
        Accel::Kvm => 0,
    };
    let memory_mib = u64::from(cfg.memory_mib) + tcg_cache_mib + jail.vmm_overhead_mib;
    let disk = super::DiskLimits {
        bytes_per_sec: jail.disk_per_vcpu.bytes_per_sec.saturating_mul(vcpus),
        iops: jail.disk_per_vcpu.iops.saturating_mul(vcpus),
    };
    let limits = Limits {
        cpu_quota_us: vcpus * CPU_PERIOD_US,
        cpu_weight: cfg.vcpus,
        memory_bytes: memory_mib << 20,
        pids: jail.max_pids + cfg.vcpus,
        io: block_device.map(|(major, minor)| IoLimit {
            major,
            minor,
            bytes_per_sec: disk.bytes_per_sec,
            iops: disk.iops,
        }),
    };
    JailPlan {
        root,
        system,
        binds,
        lend,
        files: JailedFiles {
            kernel: PathBuf::from("/kernel/vmlinuz"),
            initrd: PathBuf::from("/kernel/initrd"),
            disk: PathBuf::from("/disk.raw"),
            memory,
        },
        limits,
        disk,
        rlimits: vec![
            (libc::RLIMIT_CORE, 0),
            (libc::RLIMIT_NOFILE, jail.max_open_files),
            // Per uid, and the uid is the VMM's alone: a second bound on its threads.
            (libc::RLIMIT_NPROC, u64::from(jail.max_pids + cfg.vcpus)),
        ],
    }
}

fn read_only(host: &Path, jail: &str) -> Bind {
    Bind {
        host: host.to_path_buf(),
        jail: PathBuf::from(jail),
        writable: false,
        exec: false,
        dev: false,
        create: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(memory: GuestMemory) -> VmConfig {
        VmConfig {
            name: "sbx-1".into(),
            vcpus: 2,
            memory_mib: 512,
            kernel: "/store/kernels/k/vmlinuz".into(),
            initrd: "/store/kernels/k/initramfs.cpio".into(),
            cmdline: String::new(),
            root_disk: "/store/sandboxes/sbx-1/disk.raw".into(),
            run_dir: "/data/run/sbx-1".into(),
            accel: Accel::Tcg,
            tcg_tb_size_mib: Some(64),
            memory,
            restore: None,
            network: None,
        }
    }

    fn jail() -> JailConfig {
        JailConfig {
            cgroups: super::super::CgroupLayout::V1 {
                root: "/sys/fs/cgroup".into(),
            },
            ..JailConfig::new("n1")
        }
    }

    #[test]
    fn only_the_vms_own_files_are_writable() {
        let p = plan(
            &cfg(GuestMemory::Anonymous),
            &jail(),
            Path::new("/usr/bin/qemu-system-x86_64"),
            None,
        );
        assert_eq!(p.root, PathBuf::from("/data/run/sbx-1/root"));
        let writable: Vec<_> = p.binds.iter().filter(|b| b.writable && !b.dev).collect();
        assert_eq!(writable.len(), 1);
        assert_eq!(
            writable[0].host,
            PathBuf::from("/store/sandboxes/sbx-1/disk.raw")
        );
        assert!(p.binds.iter().all(|b| !b.exec));
        let devices: Vec<_> = p.binds.iter().filter(|b| b.dev).map(|b| &b.host).collect();
        assert_eq!(devices, [&PathBuf::from("/dev/null")]);
        assert_eq!(p.lend, [PathBuf::from("/store/sandboxes/sbx-1/disk.raw")]);
        assert_eq!(p.files.disk, PathBuf::from("/disk.raw"));
        assert_eq!(p.files.memory, None);
        assert!(p
            .system
            .iter()
            .all(|s| SYSTEM_PATHS.contains(&s.to_str().unwrap())));
    }

    #[test]
    fn a_memory_image_is_never_bound_only_passed_sealed() {
        let image = "/store/images/d/memory";
        let p = plan(
            &cfg(GuestMemory::File {
                path: image.into(),
                shared: false,
            }),
            &jail(),
            Path::new("/usr/bin/qemu-system-x86_64"),
            None,
        );
        assert!(p.binds.iter().all(|b| b.host != Path::new(image)));
        assert!(!p.lend.contains(&PathBuf::from(image)));
        assert_eq!(
            passed_memory(
                &cfg(GuestMemory::File {
                    path: image.into(),
                    shared: false
                })
                .memory,
                true
            ),
            Some(PassedMemory::ImageFile(image.into()))
        );
        assert_eq!(p.files.memory, Some(PathBuf::from("/proc/self/fd/7")));
    }

    #[test]
    fn an_in_memory_image_is_passed_jailed_or_not() {
        for shared in [true, false] {
            let memory = GuestMemory::InMemory {
                image: "fork-1".into(),
                shared,
            };
            let p = plan(
                &cfg(memory.clone()),
                &jail(),
                Path::new("/usr/bin/qemu-system-x86_64"),
                None,
            );
            assert_eq!(p.lend, [PathBuf::from("/store/sandboxes/sbx-1/disk.raw")]);
            assert_eq!(p.files.memory, Some(PathBuf::from("/proc/self/fd/7")));
            assert_eq!(
                JailedFiles::host(&cfg(memory.clone())).memory,
                p.files.memory
            );
            let expected = if shared {
                PassedMemory::FillInMemory("fork-1".into())
            } else {
                PassedMemory::MapInMemory("fork-1".into())
            };
            for jailed in [true, false] {
                assert_eq!(passed_memory(&memory, jailed).as_ref(), Some(&expected));
            }
        }
        // An unjailed VMM opens an image file itself.
        let file = GuestMemory::File {
            path: "/store/images/d/memory".into(),
            shared: false,
        };
        assert_eq!(passed_memory(&file, false), None);
    }

    #[test]
    fn the_ram_file_of_an_image_build_is_lent() {
        let p = plan(
            &cfg(GuestMemory::File {
                path: "/store/images/.staging/memory".into(),
                shared: true,
            }),
            &jail(),
            Path::new("/usr/bin/qemu-system-x86_64"),
            None,
        );
        assert!(p
            .lend
            .contains(&PathBuf::from("/store/images/.staging/memory")));
        assert_eq!(p.files.memory, Some(PathBuf::from("/memory")));
        assert_eq!(
            passed_memory(
                &cfg(GuestMemory::File {
                    path: "/m".into(),
                    shared: true
                })
                .memory,
                true
            ),
            None
        );
    }

    #[test]
    fn limits_follow_the_vm() {
        let p = plan(
            &cfg(GuestMemory::Anonymous),
            &jail(),
            Path::new("/usr/bin/qemu-system-x86_64"),
            None,
        );
        assert_eq!(p.limits.cpu_quota_us, 200_000);
        assert_eq!(p.limits.cpu_weight, 2);
        assert_eq!(p.limits.memory_bytes, (512 + 64 + 256) << 20);
        assert_eq!(p.limits.pids, 130);
        assert_eq!(p.limits.io, None);
        assert_eq!(p.disk.bytes_per_sec, 512 << 20);
        assert!(p.rlimits.contains(&(libc::RLIMIT_CORE, 0)));
        let p = plan(
            &cfg(GuestMemory::Anonymous),
            &jail(),
            Path::new("/usr/bin/qemu-system-x86_64"),
            Some((7, 1)),
        );
        assert_eq!(p.limits.io.map(|io| (io.major, io.minor)), Some((7, 1)));
    }

    #[test]
    fn kvm_gets_its_device_and_a_vmm_outside_usr_its_directory() {
        let mut c = cfg(GuestMemory::Anonymous);
        c.accel = Accel::Kvm;
        let p = plan(
            &c,
            &jail(),
            Path::new("/opt/qemu/bin/qemu-system-x86_64"),
            None,
        );
        assert!(p
            .binds
            .iter()
            .any(|b| b.jail == Path::new("/dev/kvm") && b.dev));
        assert!(p.system.contains(&PathBuf::from("/opt/qemu/bin")));
        assert_eq!(p.limits.memory_bytes, (512 + 256) << 20);
    }
}

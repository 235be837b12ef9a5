//! Kernel module dependency resolution over the text of `modules.dep` (pure).

use std::collections::{BTreeMap, BTreeSet};

/// A module the initramfs wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WantedModule {
    /// Module name (`-` and `_` are the same, as for modprobe).
    pub name: &'static str,
    /// Whether the bundle fails without it (otherwise it is skipped if the kernel lacks it).
    pub required: bool,
}

/// Modules the initramfs loads: virtio over MMIO (QEMU microvm, Firecracker), the root disk,
/// the host channel (virtio-serial), networking, entropy, and vsock for Firecracker.
pub const WANTED_MODULES: &[WantedModule] = &[
    WantedModule {
        name: "virtio_mmio",
        required: true,
    },
    WantedModule {
        name: "virtio_blk",
        required: true,
    },
    WantedModule {
        name: "virtio_console",
        required: true,
    },
    WantedModule {
        name: "virtio_net",
        required: true,
    },
    WantedModule {
        name: "virtio_rng",
        required: false,
    },
    WantedModule {
        name: "vmw_vsock_virtio_transport",
        required: false,
    },
];

/// Why a set of modules could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// A required module is not listed.
    Missing(String),
    /// The dependencies form a cycle through this module.
    Cycle(String),
}

/// The parsed `modules.dep`: module name → (file path, dependency paths).
#[derive(Debug, Clone, Default)]
pub struct ModuleDeps {
    by_name: BTreeMap<String, (String, Vec<String>)>,
    name_of_path: BTreeMap<String, String>,
}

/// The module name of a module file path: base name without `.ko[.xz|.zst|.gz]`, `-` as `_`.
pub fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = [".ko.xz", ".ko.zst", ".ko.gz", ".ko"]
        .iter()
        .find_map(|ext| base.strip_suffix(ext))
        .unwrap_or(base);
    stem.replace('-', "_")
}

/// Whether a module file is compressed.
pub fn is_compressed(path: &str) -> bool {
    [".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .any(|ext| path.ends_with(ext))
}

impl ModuleDeps {
    /// Parses `modules.dep` (`path: dep dep …` per line). Malformed lines are ignored.
    pub fn parse(text: &str) -> ModuleDeps {
        let mut deps = ModuleDeps::default();
        for line in text.lines() {
            let Some((path, rest)) = line.split_once(':') else {
                continue;
            };
            let path = path.trim();
            if path.is_empty() {
                continue;
            }
            let list: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
            let name = module_name(path);
            deps.name_of_path.insert(path.to_owned(), name.clone());
            deps.by_name.insert(name, (path.to_owned(), list));
        }
        deps
    }

    /// Whether a module is listed.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(&name.replace('-', "_"))
    }

    /// The files to load, dependencies first, for the wanted modules and everything they
    /// depend on; each file once. Optional modules that are not listed are skipped.
    pub fn load_order(&self, wanted: &[WantedModule]) -> Result<Vec<String>, ResolveError> {
        let mut order = Vec::new();
        let mut done = BTreeSet::new();
        let mut visiting = BTreeSet::new();
        for w in wanted {
            let name = w.name.replace('-', "_");
            if !self.by_name.contains_key(&name) {
                if w.required {
                    return Err(ResolveError::Missing(name));
                }
                continue;
            }
            self.visit(&name, &mut done, &mut visiting, &mut order)?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        done: &mut BTreeSet<String>,
        visiting: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) -> Result<(), ResolveError> {
        if done.contains(name) {
            return Ok(());
        }
        if !visiting.insert(name.to_owned()) {
            return Err(ResolveError::Cycle(name.to_owned()));
        }
        let (path, deps) = self
            .by_name
            .get(name)
            .ok_or_else(|| ResolveError::Missing(name.to_owned()))?;
        // modules.dep lists the deepest dependency last (modprobe loads the list backwards).
        for dep in deps.iter().rev() {
            let dep_name = self
                .name_of_path
                .get(dep)
                .cloned()
                .unwrap_or_else(|| module_name(dep));
            self.visit(&dep_name, done, visiting, order)?;
        }
        visiting.remove(name);
        done.insert(name.to_owned());
        order.push(path.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines from Debian's 6.1.0-56-cloud-amd64 modules.dep, plus noise.
    const FIXTURE: &str = "\
kernel/fs/fuse/virtiofs.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko kernel/fs/fuse/fuse.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/net/vmw_vsock/vsock.ko:
kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko: kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko kernel/net/vmw_vsock/vsock.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko: kernel/net/vmw_vsock/vsock.ko
not a module line
";

    fn names(order: &[String]) -> Vec<String> {
        order.iter().map(|p| module_name(p)).collect()
    }

    #[test]
    fn closure_in_load_order() {
        let deps = ModuleDeps::parse(FIXTURE);
        let order = deps.load_order(WANTED_MODULES).unwrap();
        assert_eq!(
            names(&order),
            [
                "virtio_ring",
                "virtio",
                "virtio_mmio",
                "virtio_blk",
                "virtio_console",
                "failover",
                "net_failover",
                "virtio_net",
                "virtio_rng",
                "vsock",
                "vmw_vsock_virtio_transport_common",
                "vmw_vsock_virtio_transport",
            ]
        );
        assert!(order.contains(&"kernel/drivers/char/hw_random/virtio-rng.ko".to_owned()));
        // Every module comes after everything it depends on.
        for (i, p) in order.iter().enumerate() {
            for line in FIXTURE.lines().filter(|l| l.starts_with(&format!("{p}:"))) {
                for dep in line.split_once(':').unwrap().1.split_whitespace() {
                    let j = order.iter().position(|x| x == dep).unwrap();
                    assert!(j < i, "{dep} must load before {p}");
                }
            }
        }
    }

    #[test]
    fn optional_missing_is_skipped_required_missing_fails() {
        let deps = ModuleDeps::parse("kernel/a.ko: kernel/b.ko\nkernel/b.ko:\n");
        let want = [
            WantedModule {
                name: "a",
                required: true,
            },
            WantedModule {
                name: "zzz",
                required: false,
            },
        ];
        assert_eq!(
            deps.load_order(&want).unwrap(),
            ["kernel/b.ko", "kernel/a.ko"]
        );
        let want = [WantedModule {
            name: "zzz",
            required: true,
        }];
        assert_eq!(
            deps.load_order(&want),
            Err(ResolveError::Missing("zzz".into()))
        );
    }

    #[test]
    fn cycles_are_errors_not_hangs() {
        let deps = ModuleDeps::parse("a.ko: b.ko\nb.ko: a.ko\n");
        assert!(matches!(
            deps.load_order(&[WantedModule {
                name: "a",
                required: true
            }]),
            Err(ResolveError::Cycle(_))
        ));
    }

    #[test]
    fn names_and_compression() {
        assert_eq!(
            module_name("kernel/drivers/char/hw_random/virtio-rng.ko.xz"),
            "virtio_rng"
        );
        assert!(is_compressed("x/virtio_blk.ko.zst"));
        assert!(!is_compressed("x/virtio_blk.ko"));
        assert!(ModuleDeps::parse(FIXTURE).contains("virtio-rng"));
    }
}

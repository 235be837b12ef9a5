//! [`LocalNodeManager`]: the node manager's operations carried out in this process.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use space_core::template::TemplateInfo;
use space_core::{SandboxId, SnapshotId};
use space_net::datapath::{netns, uplink_guard, GuestLink, SandboxNetwork};
use space_storage::{ExistingDisk, KernelMeta, PendingSnapshot, Store};
use space_vmm::{FileOwner, QemuVmm, Vm, VmConfig, VmNetwork, Vmm};

use crate::{GatewaySockets, NodeManager, NodeManagerError, UplinkSocketKind, MAX_UPLINK_SOCKETS};

/// The in-process node manager (this process must run as root).
pub struct LocalNodeManager {
    vmm: Arc<dyn Vmm>,
    /// The same VMM driver, when it is QEMU's (for what only it can do).
    qemu: Option<Arc<QemuVmm>>,
    /// The uplink namespace and its guard.
    uplink: Uplink,
}

/// The guard's table and mark, and a socket maker per uplink namespace (made on first use:
/// one for another namespace keeps a thread in it).
struct Uplink {
    table: String,
    mark: u32,
    sockets: std::sync::Mutex<
        std::collections::HashMap<crate::UplinkNetns, Arc<uplink_guard::MarkedSockets>>,
    >,
}

impl Uplink {
    fn new(table: String, mark: u32) -> Self {
        Uplink {
            table,
            mark,
            sockets: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    fn sockets(
        &self,
        netns: &crate::UplinkNetns,
    ) -> Result<Arc<uplink_guard::MarkedSockets>, NodeManagerError> {
        let mut makers = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = makers.get(netns) {
            return Ok(s.clone());
        }
        let made = Arc::new(uplink_guard::MarkedSockets::new(
            netns.as_deref(),
            self.mark,
        )?);
        makers.insert(netns.clone(), made.clone());
        Ok(made)
    }
}

impl LocalNodeManager {
    /// A node manager that starts VMs with `vmm`.
    pub fn new(vmm: Arc<dyn Vmm>) -> Self {
        Self {
            vmm,
            qemu: None,
            uplink: Uplink::new("space_uplink".to_owned(), 0x5ace_0000),
        }
    }

    /// Takes over the console and cgroup of each VMM of `names` under `run_root` that an
    /// earlier node manager launched and released (see [`QemuVmm::take_over_orphan`]).
    pub async fn take_over_orphans(&self, run_root: &Path, names: &[String]) -> usize {
        let Some(qemu) = &self.qemu else { return 0 };
        let mut taken = 0;
        for name in names {
            match qemu.take_over_orphan(name, &run_root.join(name)).await {
                Ok(pid) => {
                    tracing::info!(vm = %name, pid, "took over the console of a running VMM");
                    taken += 1;
                }
                Err(e) => tracing::debug!(vm = %name, error = %e, "no VMM to take over"),
            }
        }
        taken
    }

    /// The node manager of the node whose run directory is `run_root`: QEMU VMMs, each in a
    /// jail of its own unless `jail` is false (only to measure what the jail costs), their
    /// sockets and the files lent to them handed to `sandbox_manager`.
    pub fn qemu(run_root: &Path, jail: bool, sandbox_manager: FileOwner) -> Self {
        let vmm = if jail {
            // The node's VMM cgroups are named like its network namespaces, after its run
            // directory, so nodes sharing a machine never touch each other's.
            let node = crate::netns_prefix(run_root);
            let mut config = space_vmm::JailConfig::new(node.trim_end_matches('-'));
            config.files_owner = sandbox_manager;
            QemuVmm::jailed("qemu-system-x86_64", config)
        } else {
            tracing::warn!("VMMs run unjailed, as root: for measuring the jail only");
            QemuVmm::unjailed("qemu-system-x86_64")
        };
        let qemu = Arc::new(vmm);
        Self {
            vmm: qemu.clone(),
            qemu: Some(qemu),
            uplink: Uplink::new(crate::uplink_table(run_root), crate::uplink_mark(run_root)),
        }
    }
}

/// How long a VMM gets to quit before it is killed.
const KILL_GRACE: Duration = Duration::from_secs(2);

#[async_trait]
impl NodeManager for LocalNodeManager {
    fn open_store(&self, data_dir: &Path, loop_size: u64) -> Result<Store, NodeManagerError> {
        Ok(Store::open(data_dir, loop_size)?)
    }

    fn create_sandbox_disk(
        &self,
        store: &Store,
        id: &SandboxId,
        image: &Path,
        disk_mib: u32,
    ) -> Result<PathBuf, NodeManagerError> {
        Ok(store.create_sandbox_disk(id, image, disk_mib)?)
    }

    fn clone_disk(
        &self,
        store: &Store,
        src: &Path,
        dst: &Path,
        disk_mib: u32,
        existing: ExistingDisk,
    ) -> Result<(), NodeManagerError> {
        Ok(store.clone_snapshot_disk(src, dst, disk_mib, existing)?)
    }

    fn install_template(
        &self,
        store: &Store,
        staged: &Path,
        template: &TemplateInfo,
        named: bool,
    ) -> Result<TemplateInfo, NodeManagerError> {
        let image = open_staged(staged, space_storage::IMAGE_FILE)?;
        install(store, template, &image, named)
    }

    fn build_template(
        &self,
        store: &Store,
        staged: &Path,
        build: &crate::protocol::TemplateBuild,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<TemplateInfo, NodeManagerError> {
        // In one process the sandbox manager is this process: nothing to act as.
        let input = open_staged_image(staged)?;
        build_staged_template(store, &input, build, progress)
    }

    fn name_template(
        &self,
        store: &Store,
        name: &str,
        digest: &str,
    ) -> Result<(), NodeManagerError> {
        let templates = store.templates();
        if templates.lookup_digest(digest)?.is_none() {
            return Err(space_storage::StorageError::NotFound {
                what: "template",
                name: digest.to_owned(),
                dir: templates.dir().to_owned(),
            }
            .into());
        }
        Ok(templates.set_name(name, digest)?)
    }

    fn remove_template_name(&self, store: &Store, name: &str) -> Result<bool, NodeManagerError> {
        Ok(store.templates().remove(name)?)
    }

    fn remove_unnamed_template(
        &self,
        store: &Store,
        digest: &str,
    ) -> Result<bool, NodeManagerError> {
        Ok(store.templates().remove_unnamed(digest)?)
    }

    fn install_kernel(
        &self,
        store: &Store,
        staged: &Path,
        kernel: &KernelMeta,
    ) -> Result<(), NodeManagerError> {
        let vmlinuz = open_staged(staged, space_storage::VMLINUZ_FILE)?;
        let initramfs = open_staged(staged, space_storage::INITRAMFS_FILE)?;
        store.kernels().install(kernel, &vmlinuz, &initramfs)?;
        Ok(())
    }

    fn begin_snapshot(
        &self,
        store: &Store,
        sandbox: &SandboxId,
        snapshot: &SnapshotId,
    ) -> Result<PendingSnapshot, NodeManagerError> {
        Ok(store.begin_snapshot(sandbox, snapshot)?)
    }

    fn begin_persistent_snapshot(
        &self,
        store: &Store,
        sandbox: &SandboxId,
        snapshot: &SnapshotId,
    ) -> Result<PendingSnapshot, NodeManagerError> {
        Ok(store.begin_persistent_snapshot(sandbox, snapshot)?)
    }

    fn snapshot_disk(
        &self,
        pending: &PendingSnapshot,
        disk: &Path,
    ) -> Result<(), NodeManagerError> {
        Ok(pending.reflink_disk(disk)?)
    }

    fn delete_snapshot(
        &self,
        store: &Store,
        sandbox: &SandboxId,
        snapshot: &SnapshotId,
    ) -> Result<bool, NodeManagerError> {
        Ok(store.delete_snapshot(sandbox, snapshot)?)
    }

    fn remove_pending_snapshots(
        &self,
        store: &Store,
        sandbox: &SandboxId,
    ) -> Result<usize, NodeManagerError> {
        Ok(store.remove_pending_snapshots(sandbox)?)
    }

    fn persist_snapshot(
        &self,
        store: &Store,
        sandbox: &SandboxId,
        snapshot: &SnapshotId,
    ) -> Result<bool, NodeManagerError> {
        Ok(store.persist_snapshot(sandbox, snapshot)?)
    }

    fn delete_persistent_snapshot(
        &self,
        store: &Store,
        snapshot: &SnapshotId,
    ) -> Result<bool, NodeManagerError> {
        Ok(store.delete_persistent_snapshot(snapshot)?)
    }

    fn remove_pending_persistent_snapshots(
        &self,
        store: &Store,
    ) -> Result<usize, NodeManagerError> {
        Ok(store.remove_pending_persistent_snapshots()?)
    }

    fn link_disk(&self, src: &Path, dst: &Path) -> Result<(), NodeManagerError> {
        let io = |what, path: &Path, source| NodeManagerError::Io {
            what,
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = dst.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io("cannot create directory", dir, e))?;
        }
        std::fs::hard_link(src, dst).map_err(|e| io("cannot link disk", src, e))
    }

    fn remove_run_dir(&self, dir: &Path) -> Result<(), NodeManagerError> {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(NodeManagerError::Io {
                what: "cannot remove directory",
                path: dir.to_owned(),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    fn remove_sandbox_files(
        &self,
        store: &Store,
        id: &SandboxId,
        run_dir: &Path,
    ) -> Result<(), NodeManagerError> {
        store.remove_sandbox_dir(id)?;
        match std::fs::remove_dir_all(run_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(NodeManagerError::Io {
                what: "cannot remove run directory",
                path: run_dir.to_owned(),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    async fn launch_vm(&self, cfg: &VmConfig) -> Result<Vm, NodeManagerError> {
        std::fs::create_dir_all(&cfg.run_dir).map_err(|e| NodeManagerError::Io {
            what: "cannot create run directory",
            path: cfg.run_dir.clone(),
            source: e,
        })?;
        Ok(self.vmm.launch(cfg).await?)
    }

    async fn adopt_vm(&self, name: &str, run_dir: &Path) -> Result<Vm, NodeManagerError> {
        Ok(self.vmm.adopt(name, run_dir).await?)
    }

    async fn kill_vm(&self, vm: &Vm) -> Result<(), NodeManagerError> {
        Ok(vm.kill(KILL_GRACE).await?)
    }

    async fn kill_stray_vms(&self, name: &str, run_root: &Path) -> Result<usize, NodeManagerError> {
        Ok(self.vmm.kill_strays(name, run_root).await?)
    }

    fn forget_memory_image(&self, image: &str) -> Result<(), NodeManagerError> {
        self.vmm.forget_memory_image(image);
        Ok(())
    }

    fn vm_names_under(&self, run_root: &Path) -> Vec<String> {
        self.vmm.names_under(run_root)
    }

    fn remove_stale_vm_confinement(&self) -> usize {
        self.vmm.remove_stale_confinement()
    }

    fn ensure_vm_network(&self, name: &str) -> Result<VmNetwork, NodeManagerError> {
        let link = GuestLink::default();
        let net = match SandboxNetwork::existing(name, link.clone()) {
            Some(net) => net,
            None => SandboxNetwork::create(name, link)?,
        };
        Ok(VmNetwork {
            netns: netns::path(&net.netns),
            tap: net.link.tap.clone(),
            mac: net.link.guest_mac,
        })
    }

    fn remove_vm_network(&self, name: &str) -> Result<(), NodeManagerError> {
        Ok(netns::delete(name)?)
    }

    fn vm_networks(&self, prefix: &str) -> Vec<String> {
        netns::names_with_prefix(prefix)
    }

    fn open_udp_flow(
        &self,
        name: &str,
        dst: std::net::SocketAddrV4,
        guest: std::net::SocketAddrV4,
    ) -> Result<std::net::UdpSocket, NodeManagerError> {
        Ok(netns::run_in(name, move || {
            space_net::udp::flow_socket(dst, guest)
        })?)
    }

    fn guard_uplink(
        &self,
        uplink: &crate::UplinkNetns,
        granted: &[ipnet::IpNet],
        node_addresses: &[std::net::IpAddr],
    ) -> Result<(), NodeManagerError> {
        let forbidden = uplink_guard::forbidden_networks(node_addresses);
        let script =
            uplink_guard::script(&self.uplink.table, self.uplink.mark, &forbidden, granted);
        uplink_guard::apply(uplink.as_deref(), &script)?;
        tracing::info!(table = %self.uplink.table, mark = format_args!("{:#010x}", self.uplink.mark), granted = granted.len(), "uplink guard installed");
        Ok(())
    }

    fn unguard_uplink(&self, uplink: &crate::UplinkNetns) -> Result<(), NodeManagerError> {
        Ok(uplink_guard::remove(uplink.as_deref(), &self.uplink.table)?)
    }

    fn open_uplink_sockets(
        &self,
        uplink: &crate::UplinkNetns,
        kind: UplinkSocketKind,
        count: usize,
    ) -> Result<Vec<std::os::fd::OwnedFd>, NodeManagerError> {
        let sockets = self.uplink.sockets(uplink)?;
        (0..count.clamp(1, MAX_UPLINK_SOCKETS))
            .map(|_| {
                sockets.socket(kind).map_err(|e| {
                    NodeManagerError::Network(space_net::datapath::NetError::Io {
                        what: "make an uplink socket".into(),
                        source: e,
                    })
                })
            })
            .collect()
    }

    fn open_gateway_sockets(&self, name: &str) -> Result<GatewaySockets, NodeManagerError> {
        let link = GuestLink::default();
        let gw = link.gateway;
        let proxy_port = link.proxy_port;
        let relay_addr = std::net::SocketAddrV4::new(gw, link.udp_relay_port);
        Ok(netns::run_in(name, move || {
            let udp_relay = space_net::udp::listener(relay_addr)?;
            let dns_udp = std::net::UdpSocket::bind((gw, 53))?;
            let dns_tcp = std::net::TcpListener::bind((gw, 53))?;
            let proxy = std::net::TcpListener::bind((gw, proxy_port))?;
            dns_udp.set_nonblocking(true)?;
            dns_tcp.set_nonblocking(true)?;
            proxy.set_nonblocking(true)?;
            Ok(GatewaySockets {
                dns_udp,
                dns_tcp,
                proxy,
                udp_relay,
            })
        })?)
    }
}

/// Opens `dir/name` for reading, refusing a symlink or anything but a regular file (a
/// fetched file is the sandbox manager's, which could have swapped one in).
pub(crate) fn open_staged(dir: &Path, name: &str) -> Result<std::fs::File, NodeManagerError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let io = |source| NodeManagerError::Io {
        what: "open a fetched file",
        path: path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(io(std::io::Error::other("not a regular file")));
    }
    Ok(file)
}

/// Installs `template` from the open image file, named or not.
pub(crate) fn install(
    store: &Store,
    template: &TemplateInfo,
    image: &std::fs::File,
    named: bool,
) -> Result<TemplateInfo, NodeManagerError> {
    let templates = store.templates();
    Ok(if named {
        templates.install(template, image)?
    } else {
        templates.install_unnamed(template, image)?
    })
}

/// Opens and checks a staged image (see [`space_images::oci::staged`]).
pub(crate) fn open_staged_image(
    dir: &Path,
) -> Result<space_images::oci::StagedInput, NodeManagerError> {
    space_images::oci::open_staged(dir, &space_images::oci::ImageLimits::default())
        .map_err(|e| NodeManagerError::Image(e.into()))
}

/// Builds a template from a staged image opened by [`open_staged_image`], as root: the
/// unpacker is this program, re-run in its jail.
pub(crate) fn build_staged_template(
    store: &Store,
    input: &space_images::oci::StagedInput,
    build: &crate::protocol::TemplateBuild,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<TemplateInfo, NodeManagerError> {
    let unpacker = std::env::current_exe().map_err(|source| NodeManagerError::Io {
        what: "find this program (the image unpacker)",
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let opts = space_images::oci::ImageBuildOpts {
        unpacker,
        user: build.user.clone(),
        ..Default::default()
    };
    Ok(space_images::oci::build_staged(
        store,
        build.name.as_deref(),
        input,
        &build.kernel_digest,
        &opts,
        progress,
    )?)
}

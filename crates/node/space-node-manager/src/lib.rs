//! The node manager: every privileged operation of a node, behind one interface, and the
//! root process that serves it.
//!
//! Mounting the btrfs store, cloning disks a VMM was lent, making network namespaces,
//! opening sockets inside them, and starting or killing jailed VMMs need root. The sandbox
//! manager never does these itself; it asks a [`NodeManager`]:
//! - [`RemoteNodeManager`] (in the sandbox manager's process) sends each operation as a
//!   typed [`protocol::Request`] over a Unix socket to `space node-manager`;
//! - [`server`] (in `space node-manager`, the only root process of a node) checks the
//!   caller's uid (`SO_PEERCRED`), confines every path it is given to the store and run
//!   directories ([`confine`]), and carries the operation out with [`LocalNodeManager`];
//! - [`LocalNodeManager`] does the work in the calling process (which must then be root):
//!   the server's implementation, and the in-process node manager of `space server` until
//!   every node runs split.
//!
//! Architecture invariant (a tidy test): no crate but this one and the crates it drives
//! calls `mount`, `setns`, `unshare`, `pivot_root`, or spawns a VMM.

pub mod confine;
mod local;
mod ownership;
pub mod protocol;
mod remote;
pub mod server;
pub mod wire;

pub use local::LocalNodeManager;
pub use remote::RemoteNodeManager;
pub use space_vmm::FileOwner;

use async_trait::async_trait;
use space_core::template::TemplateInfo;
use space_core::{SandboxId, SnapshotId};
use space_net::datapath::NetError;
use space_storage::{ExistingDisk, KernelMeta, PendingSnapshot, Store};
use space_vmm::{Vm, VmConfig, VmNetwork};
use std::path::{Path, PathBuf};

/// Why a privileged operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeManagerError {
    /// Store (btrfs, disks) failure.
    #[error(transparent)]
    Storage(#[from] space_storage::StorageError),
    /// VMM failure.
    #[error(transparent)]
    Vmm(#[from] space_vmm::VmmError),
    /// Network namespace, TAP or firewall failure.
    #[error(transparent)]
    Network(#[from] NetError),
    /// An image could not become a template.
    #[error(transparent)]
    Image(#[from] space_images::ImageError),
    /// The node manager refused or failed the request (see [`protocol::RefusalCode`]).
    #[error("node manager: {0}")]
    Refused(#[from] protocol::Refusal),
    /// The node manager could not be reached, or broke the protocol.
    #[error("node manager connection: {0}")]
    Connection(String),
    /// File system failure on run directories.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Privileged operations of a node.
#[async_trait]
pub trait NodeManager: Send + Sync + 'static {
    /// Opens the btrfs store under `data_dir`, loop-mounting an image if needed.
    fn open_store(&self, data_dir: &Path, loop_size: u64) -> Result<Store, NodeManagerError>;
    /// Clones a template image into a sandbox disk of `disk_mib` (reflink, no data copied).
    fn create_sandbox_disk(
        &self,
        store: &Store,
        id: &SandboxId,
        image: &Path,
        disk_mib: u32,
    ) -> Result<PathBuf, NodeManagerError>;
    /// Makes `dst` a reflink of the disk `src` grown to `disk_mib` (0 keeps its size); the
    /// parent directory is created. Used for images, pool members, rollbacks and forks.
    fn clone_disk(
        &self,
        store: &Store,
        src: &Path,
        dst: &Path,
        disk_mib: u32,
        existing: ExistingDisk,
    ) -> Result<(), NodeManagerError>;
    /// Starts a two-phase snapshot of a sandbox (see [`space_storage::PendingSnapshot`]).
    fn begin_snapshot(
        &self,
        store: &Store,
        sandbox: &SandboxId,
        snapshot: &SnapshotId,
    ) -> Result<PendingSnapshot, NodeManagerError>;
    /// Starts a persistent snapshot directly among those whose sandbox is gone (a stored
    /// snapshot being downloaded; see [`Store::begin_persistent_snapshot`]).
    fn begin_persistent_snapshot(
        &self,
        store: &Store,
        sandbox: &SandboxId,
        snapshot: &SnapshotId,
    ) -> Result<PendingSnapshot, NodeManagerError>;
    /// Reflinks the sandbox's disk into a pending snapshot.
    fn snapshot_disk(&self, pending: &PendingSnapshot, disk: &Path)
        -> Result<(), NodeManagerError>;
    /// Deletes a committed snapshot; false if there was none.
    fn delete_snapshot(
        &self,
        store: &Store,
        sandbox: &SandboxId,
        snapshot: &SnapshotId,
    ) -> Result<bool, NodeManagerError>;
    /// Removes snapshots a crash left half-taken.
    fn remove_pending_snapshots(
        &self,
        store: &Store,
        sandbox: &SandboxId,
    ) -> Result<usize, NodeManagerError>;
    /// Moves a persistent snapshot of a sandbox being deleted out of its directory, into the
    /// store's persistent snapshots (see [`Store::persist_snapshot`]); false if it was moved
    /// already.
    fn persist_snapshot(
        &self,
        store: &Store,
        sandbox: &SandboxId,
        snapshot: &SnapshotId,
    ) -> Result<bool, NodeManagerError>;
    /// Deletes a persistent snapshot whose sandbox was deleted; false if there was none.
    fn delete_persistent_snapshot(
        &self,
        store: &Store,
        snapshot: &SnapshotId,
    ) -> Result<bool, NodeManagerError>;
    /// Removes persistent snapshots a crash left half-deleted.
    fn remove_pending_persistent_snapshots(&self, store: &Store)
        -> Result<usize, NodeManagerError>;
    /// Gives a disk (a pool member's) a second name `dst` in the same store (a hard link).
    /// The first name must stay while the VM runs: QEMU reopens its disk by the path it was
    /// started with (e.g. when a checkpoint hands the disk over), and fails if it is gone.
    fn link_disk(&self, src: &Path, dst: &Path) -> Result<(), NodeManagerError>;
    /// Installs template `template`, fetched by the sandbox manager into `staged` (a
    /// directory of its `incoming/` holding [`space_storage::IMAGE_FILE`]), into the store's
    /// templates (root's): copied from the files as opened (as the sandbox manager), checked
    /// against the template's recorded SHA-256, once per digest.
    /// `named`: whether `template.name` is pointed at it (else only its digest finds it).
    /// An empty `image_sha256` stays empty until a name points at it (see
    /// `space_storage::TemplateStore::install_unnamed`). Returns what was installed.
    fn install_template(
        &self,
        store: &Store,
        staged: &Path,
        template: &TemplateInfo,
        named: bool,
    ) -> Result<TemplateInfo, NodeManagerError>;
    /// Builds template `build.name` from the image the sandbox manager staged in `staged` (a
    /// directory of its `incoming/`, see [`space_images::oci::staged`]): read as the
    /// sandbox manager and checked, unpacked by the jailed unpacker, installed in the
    /// store's templates (root's) once per digest. Blocking: minutes for a large image;
    /// `progress` gets its lines.
    fn build_template(
        &self,
        store: &Store,
        staged: &Path,
        build: &protocol::TemplateBuild,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<TemplateInfo, NodeManagerError>;
    /// Points template name `name` at template `digest`, which the store has.
    fn name_template(
        &self,
        store: &Store,
        name: &str,
        digest: &str,
    ) -> Result<(), NodeManagerError>;
    /// Removes template name `name`, and the template unless another name points there;
    /// whether the name existed.
    fn remove_template_name(&self, store: &Store, name: &str) -> Result<bool, NodeManagerError>;
    /// Removes template `digest` if no name points at it (a build's cached step, an old
    /// version of a rebuilt template); whether it was removed.
    fn remove_unnamed_template(
        &self,
        store: &Store,
        digest: &str,
    ) -> Result<bool, NodeManagerError>;
    /// Installs kernel bundle `kernel`, fetched into `staged` (its `vmlinuz` and
    /// `initramfs.cpio`), into the store's kernels, once per digest.
    fn install_kernel(
        &self,
        store: &Store,
        staged: &Path,
        kernel: &KernelMeta,
    ) -> Result<(), NodeManagerError>;
    /// Removes a directory tree that is not a sandbox's (a pool member's, an image VM's run
    /// directory). Idempotent.
    fn remove_run_dir(&self, dir: &Path) -> Result<(), NodeManagerError>;
    /// Drops an in-memory image ([`space_vmm::GuestMemory::InMemory`]). Idempotent.
    fn forget_memory_image(&self, image: &str) -> Result<(), NodeManagerError>;
    /// Removes a sandbox's disk directory and run directory. Idempotent.
    fn remove_sandbox_files(
        &self,
        store: &Store,
        id: &SandboxId,
        run_dir: &Path,
    ) -> Result<(), NodeManagerError>;
    /// Starts a VM.
    async fn launch_vm(&self, cfg: &VmConfig) -> Result<Vm, NodeManagerError>;
    /// Re-attaches to a VM started before this process.
    async fn adopt_vm(&self, name: &str, run_dir: &Path) -> Result<Vm, NodeManagerError>;
    /// Stops a VM for good.
    async fn kill_vm(&self, vm: &Vm) -> Result<(), NodeManagerError>;
    /// Kills VMMs started for `name` under `run_root` that no handle covers (see
    /// [`Vmm::kill_strays`]).
    async fn kill_stray_vms(&self, name: &str, run_root: &Path) -> Result<usize, NodeManagerError>;
    /// Names of the live VMMs whose runtime files are under `run_root`.
    fn vm_names_under(&self, run_root: &Path) -> Vec<String>;
    /// Removes the cgroups VMMs that died unwatched left behind (see
    /// [`Vmm::remove_stale_confinement`]).
    fn remove_stale_vm_confinement(&self) -> usize;
    /// Makes the network namespace `netns` (TAP, gateway address, firewall) unless it
    /// exists, and returns the NIC a VM in it gets.
    fn ensure_vm_network(&self, netns: &str) -> Result<VmNetwork, NodeManagerError>;
    /// Removes the network namespace `netns`. Idempotent.
    fn remove_vm_network(&self, netns: &str) -> Result<(), NodeManagerError>;
    /// Network namespaces whose names start with `prefix`.
    fn vm_networks(&self, prefix: &str) -> Vec<String>;
    /// The egress gateway's listening sockets, opened inside network namespace `netns` on
    /// the gateway address of the sandbox link (`GuestLink::default()`, the same in every
    /// sandbox). A socket belongs for good to the namespace it was made in, so the gateway
    /// can serve them from anywhere.
    fn open_gateway_sockets(&self, netns: &str) -> Result<GatewaySockets, NodeManagerError>;
    /// The guest side of a UDP flow from `guest` to `dst` inside `netns` (see
    /// [`space_net::udp::FlowSockets`]).
    fn open_udp_flow(
        &self,
        netns: &str,
        dst: std::net::SocketAddrV4,
        guest: std::net::SocketAddrV4,
    ) -> Result<std::net::UdpSocket, NodeManagerError>;
    /// Installs (or replaces) the uplink guard in the uplink namespace: the kernel rejects
    /// what the egress ceiling forbids (non-public ranges, `node_addresses`) from the
    /// uplink's sockets, but for the networks in `granted` (see
    /// [`space_net::datapath::uplink_guard`]).
    fn guard_uplink(
        &self,
        uplink: &UplinkNetns,
        granted: &[ipnet::IpNet],
        node_addresses: &[std::net::IpAddr],
    ) -> Result<(), NodeManagerError>;
    /// Removes the uplink guard (at the node's shutdown).
    fn unguard_uplink(&self, uplink: &UplinkNetns) -> Result<(), NodeManagerError>;
    /// `count` (1 to [`MAX_UPLINK_SOCKETS`]) new unconnected sockets of `kind` in the uplink
    /// namespace, marked for the uplink guard.
    fn open_uplink_sockets(
        &self,
        uplink: &UplinkNetns,
        kind: UplinkSocketKind,
        count: usize,
    ) -> Result<Vec<std::os::fd::OwnedFd>, NodeManagerError>;
}

pub use space_net::datapath::uplink_guard::UplinkSocketKind;

/// The namespace the uplink connects out from: `None`, the node manager's own (the host's);
/// or a named one (a test's stand-in internet), which may not be a sandbox's.
pub type UplinkNetns = Option<String>;

/// Checks an uplink namespace a caller names: a valid name, and not a sandbox's (`spc…`,
/// any node's), where marked sockets could reach a guest.
pub fn check_uplink_netns(uplink: &UplinkNetns) -> Result<(), protocol::Refusal> {
    let Some(name) = uplink else { return Ok(()) };
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid || name.starts_with("spc") {
        return Err(protocol::Refusal::new(
            protocol::RefusalCode::Confinement,
            format!("{name:?} cannot be an uplink namespace"),
        ));
    }
    Ok(())
}

/// Most uplink sockets one request makes.
pub const MAX_UPLINK_SOCKETS: usize = 16;

/// The firewall mark of the uplink sockets of the node whose run directory is `run_root`:
/// `0x5ace` and 16 bits of a hash of the path, so that nodes sharing a machine (and its
/// host namespace) keep to their own guards.
pub fn uplink_mark(run_root: &Path) -> u32 {
    let low = u32::from_str_radix(&run_root_hash(run_root, 4), 16).unwrap_or(0);
    0x5ace_0000 | low
}

/// The name of the uplink guard's nftables table of the node whose run directory is
/// `run_root`.
pub fn uplink_table(run_root: &Path) -> String {
    format!("space_uplink_{}", run_root_hash(run_root, 8))
}

/// The listening sockets of one sandbox's egress gateway, non-blocking.
#[derive(Debug)]
pub struct GatewaySockets {
    /// DNS over UDP, port 53.
    pub dns_udp: std::net::UdpSocket,
    /// DNS over TCP, port 53.
    pub dns_tcp: std::net::TcpListener,
    /// The transparent proxy guest TCP is redirected to.
    pub proxy: std::net::TcpListener,
    /// The UDP relay guest UDP is handed to (IP_TRANSPARENT).
    pub udp_relay: std::os::fd::OwnedFd,
}

/// Where fork images' directories (the device state of a checkpoint whose RAM became an
/// in-memory image every child maps) live: tmpfs, as they last only one fork.
pub const FORK_IMAGE_ROOT: &str = "/dev/shm";

/// Prefix of the fork image directories of the node whose run directory is `run_root`
/// (so a restart removes only its own, and its node manager reaches only those).
pub fn fork_image_prefix(run_root: &Path) -> String {
    format!("space-fork-{}-", run_root_hash(run_root, 12))
}

/// Prefix of every network namespace the node whose run directory is `run_root`
/// (`<data_dir>/run`, absolute) makes: `spc` and 8 hex digits of a hash of the path, so
/// that nodes sharing a machine never touch each other's.
pub fn netns_prefix(run_root: &Path) -> String {
    format!("spc{}-", run_root_hash(run_root, 8))
}

/// The first `digits` hex digits of the SHA-256 of the run directory's path: what tells a
/// node's namespaces and fork images from those of other nodes on the machine.
fn run_root_hash(run_root: &Path, digits: usize) -> String {
    use sha2::{Digest, Sha256};
    let mut hex = hex::encode(Sha256::digest(run_root.as_os_str().as_encoded_bytes()));
    hex.truncate(digits);
    hex
}

//! The node manager's protocol: what the sandbox manager may ask of the root process, and
//! what it gets back.
//!
//! Pure data, shared by the client and the server. Every request names sandbox, snapshot
//! and VM ids and shapes; where it must name a file it names a [`NodePath`]: an area (the
//! store or the run directory) and a relative path of plain components, which the node
//! manager resolves inside that area itself and refuses to follow out of it. No request
//! carries a command, an absolute path or anything the node manager would execute.
//!
//! On the wire (see [`crate::wire`]) each message is one frame: a 4-byte big-endian length
//! and that many bytes of JSON. A connection starts with [`Request::Hello`]; after that the
//! client sends one request at a time and reads its response. A response may carry file
//! descriptors (`SCM_RIGHTS`), which [`Response::GatewaySockets`] says how to read.

use std::fmt;

use serde::{Deserialize, Serialize};
use space_core::template::TemplateInfo;
use space_core::{SandboxId, SnapshotId};
use space_storage::KernelMeta;

/// The protocol version this build speaks. A server refuses a client of another version
/// (there is one of each per node, upgraded together).
pub const PROTOCOL_VERSION: u32 = 4;

/// Largest request frame the server reads; a larger one ends the connection.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Largest response frame the client reads.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Longest progress line sent (longer ones are cut).
pub const MAX_PROGRESS_LINE: usize = 4096;
/// Most descriptors one response carries (a batch of uplink sockets).
pub const MAX_FDS: usize = crate::MAX_UPLINK_SOCKETS;

/// Longest relative path accepted, in bytes (Linux's PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most components a relative path may have.
const MAX_PATH_COMPONENTS: usize = 32;
/// Longest VM or namespace name accepted.
pub const MAX_NAME_BYTES: usize = 64;
/// Longest kernel command line accepted.
const MAX_CMDLINE_BYTES: usize = 2048;

/// The directory tree a [`NodePath`] is relative to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Area {
    /// The node's btrfs store (`<data_dir>/store`).
    Store,
    /// The node's run directory (`<data_dir>/run`): VM sockets, logs, jail roots.
    Run,
    /// Its fork images on tmpfs ([`crate::FORK_IMAGE_ROOT`]): only directories named with
    /// the node's [`crate::fork_image_prefix`].
    ForkImages,
}

/// A file or directory inside one of the node's areas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePath {
    /// Which area.
    pub area: Area,
    /// Where inside it.
    pub rel: RelPath,
}

impl fmt::Display for NodePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let area = match self.area {
            Area::Store => "store",
            Area::Run => "run",
            Area::ForkImages => "fork_images",
        };
        write!(f, "{area}:{}", self.rel.0)
    }
}

/// A relative path of plain components: not empty, no leading `/`, no `.`, `..` or empty
/// component, no NUL, at most [`MAX_PATH_BYTES`] bytes and 32 components. That it stays
/// inside its area once symlinks are considered is for whoever resolves it to check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RelPath(String);

/// Why a relative path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path {path:?} refused: {reason}")]
pub struct BadPath {
    /// The path as given (cut to 200 bytes).
    pub path: String,
    /// Why.
    pub reason: &'static str,
}

impl RelPath {
    /// Checks `s` (see [`RelPath`]).
    pub fn new(s: &str) -> Result<RelPath, BadPath> {
        let bad = |reason| BadPath {
            path: s.chars().take(200).collect(),
            reason,
        };
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if s.len() > MAX_PATH_BYTES {
            return Err(bad("too long"));
        }
        if s.contains('\0') {
            return Err(bad("contains NUL"));
        }
        if s.starts_with('/') {
            return Err(bad("absolute"));
        }
        let mut n = 0;
        for c in s.split('/') {
            n += 1;
            match c {
                "" => return Err(bad("empty component")),
                "." | ".." => return Err(bad("'.' or '..' component")),
                _ if c.len() > 255 => return Err(bad("component longer than 255 bytes")),
                _ => {}
            }
        }
        if n > MAX_PATH_COMPONENTS {
            return Err(bad("too many components"));
        }
        Ok(RelPath(s.to_owned()))
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its components.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// Whether it is `prefix` or lies under it.
    pub fn is_under(&self, prefix: &str) -> bool {
        self.0 == prefix
            || (self.0.starts_with(prefix) && self.0.as_bytes().get(prefix.len()) == Some(&b'/'))
    }
}

impl TryFrom<String> for RelPath {
    type Error = BadPath;
    fn try_from(s: String) -> Result<Self, BadPath> {
        RelPath::new(&s)
    }
}

impl From<RelPath> for String {
    fn from(p: RelPath) -> String {
        p.0
    }
}

/// A VM or network namespace name: 1..=64 ASCII letters, digits, `-`, `_`, `.`, not
/// starting with `-` or `.`.
pub fn check_name(what: &'static str, name: &str) -> Result<(), Refusal> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Refusal::new(
            RefusalCode::BadRequest,
            format!("{what} {:?} is not a valid name", cut(name)),
        ))
    }
}

fn cut(s: &str) -> String {
    s.chars().take(80).collect()
}

/// What to do when a disk's destination exists (mirrors [`space_storage::ExistingDisk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Existing {
    /// Fail.
    Refuse,
    /// Replace it atomically.
    Replace,
}

/// What backs a VM's RAM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MemorySpec {
    /// Private anonymous memory.
    Anonymous,
    /// A file in the store mapped as RAM (shared: guest writes reach the file).
    File {
        /// The memory file.
        path: NodePath,
        /// Whether guest writes reach it.
        shared: bool,
    },
    /// A memory image held in the node manager's memory only (a fork's): `shared` fills a
    /// new one, else a filled one is sealed and mapped copy-on-write.
    InMemory {
        /// Its name (plain, like a VM's).
        image: String,
        /// Whether this VM fills it.
        shared: bool,
    },
}

/// Saved state a VM starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreSpec {
    /// Saved with `x-ignore-shared` (RAM comes from the memory file). The state itself is
    /// fed by the client once the VM is up (`space_vmm::Vm::load_state`): this process never
    /// reads a sandbox's saved state.
    pub ignore_shared: bool,
}

/// A VM to launch, in a jail of its own: its shape and the store files it runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSpec {
    /// The VM's name (a sandbox, pool member or image VM id).
    pub name: String,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Guest RAM.
    pub memory_mib: u32,
    /// Kernel, in the store's kernel bundles.
    pub kernel: NodePath,
    /// Initramfs, beside it.
    pub initrd: NodePath,
    /// Kernel command line.
    pub cmdline: String,
    /// The root disk, in the store.
    pub root_disk: NodePath,
    /// Its run directory.
    pub run_dir: NodePath,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// TCG translation cache bound.
    pub tcg_tb_size_mib: Option<u32>,
    /// What backs its RAM.
    pub memory: MemorySpec,
    /// Saved state to start from.
    pub restore: Option<RestoreSpec>,
    /// The network namespace its NIC is in (made by [`Request::EnsureVmNetwork`]).
    pub netns: Option<String>,
}

impl VmSpec {
    /// Checks what can be checked without the file system.
    pub fn check(&self) -> Result<(), Refusal> {
        check_name("VM name", &self.name)?;
        if let Some(ns) = &self.netns {
            check_name("network namespace", ns)?;
        }
        if let MemorySpec::InMemory { image, .. } = &self.memory {
            check_name("in-memory image", image)?;
        }
        if self.vcpus == 0 || self.vcpus > 64 || self.memory_mib < 16 || self.memory_mib > 1 << 20 {
            return Err(Refusal::new(
                RefusalCode::BadRequest,
                format!(
                    "VM shape {} vCPUs, {} MiB is out of range",
                    self.vcpus, self.memory_mib
                ),
            ));
        }
        if self.cmdline.len() > MAX_CMDLINE_BYTES || self.cmdline.contains('\0') {
            return Err(Refusal::new(
                RefusalCode::BadRequest,
                "kernel command line too long or contains NUL",
            ));
        }
        Ok(())
    }
}

/// What the sandbox manager asks. Each variant is one privileged operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// First message of a connection.
    Hello {
        /// The client's [`PROTOCOL_VERSION`].
        version: u32,
    },
    /// Mounts the store if it is not (idempotent); the node manager opened it at start.
    OpenStore,
    /// Clones template image `image` into sandbox `sandbox`'s disk of `disk_mib`.
    CreateSandboxDisk {
        /// The sandbox.
        sandbox: SandboxId,
        /// The template image, in the store.
        image: NodePath,
        /// Size of the disk.
        disk_mib: u32,
    },
    /// Makes `dst` a reflink of disk `src` grown to `disk_mib` (0 keeps its size).
    CloneDisk {
        /// Disk to clone.
        src: NodePath,
        /// Where the clone goes.
        dst: NodePath,
        /// Size of the clone.
        disk_mib: u32,
        /// If `dst` exists.
        existing: Existing,
    },
    /// Reflinks `disk` into the pending snapshot `snapshot` of `sandbox`.
    SnapshotDisk {
        /// The sandbox.
        sandbox: SandboxId,
        /// The pending snapshot.
        snapshot: SnapshotId,
        /// The disk.
        disk: NodePath,
    },
    /// Gives disk `src` a second name `dst` (a hard link).
    LinkDisk {
        /// Existing disk.
        src: NodePath,
        /// New name.
        dst: NodePath,
    },
    /// Installs a template the sandbox manager fetched or made into `staged` (under
    /// `incoming/`). Answered with [`Response::Template`].
    InstallTemplate {
        /// The directory holding its image.
        staged: NodePath,
        /// What it is (its image's SHA-256 is checked; empty for an image made on this node,
        /// a build step's disk: hashed when a name first points at it).
        template: Box<TemplateInfo>,
        /// Whether its name is pointed at it; unnamed, only its digest finds it (a build
        /// step's cache).
        #[serde(default = "yes")]
        named: bool,
    },
    /// Builds a template from the image the sandbox manager staged in `staged` (under
    /// `incoming/`; see `space_images::oci::staged`). Answered by any number of
    /// [`Response::Progress`] frames, then [`Response::Template`] or a refusal.
    BuildTemplate {
        /// The staged image's directory.
        staged: NodePath,
        /// What to build.
        build: TemplateBuild,
    },
    /// Points template name `name` at template `digest` (in the store). Answered `Done`.
    NameTemplate {
        /// The name (`NAME` or `NAME:TAG`).
        name: String,
        /// The template's digest.
        digest: String,
    },
    /// Removes template name `name`, and its template unless another name points there.
    /// Answered with a [`Response::Flag`]: whether the name existed.
    RemoveTemplateName {
        /// The name.
        name: String,
    },
    /// Removes template `digest` if no name points at it. Answered with a
    /// [`Response::Flag`]: whether it was removed.
    RemoveUnnamedTemplate {
        /// The template's digest.
        digest: String,
    },
    /// Installs a kernel bundle the sandbox manager fetched into `staged` (under `incoming/`).
    InstallKernel {
        /// The directory holding its files.
        staged: NodePath,
        /// What it is.
        kernel: KernelMeta,
    },
    /// Removes a directory tree that is not a sandbox's (pool member, image VM). Idempotent.
    RemoveDir {
        /// The directory.
        dir: NodePath,
    },
    /// Drops an in-memory image ([`MemorySpec::InMemory`]); VMs that map it keep their pages.
    /// Idempotent.
    ForgetMemoryImage {
        /// Its name.
        image: String,
    },
    /// Removes a sandbox's disk directory and run directory. Idempotent.
    RemoveSandboxFiles {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its VM's run directory.
        run_dir: NodePath,
    },
    /// Starts a jailed VMM.
    LaunchVm {
        /// The VM.
        spec: Box<VmSpec>,
    },
    /// Kills the VMM of VM `name` (it did not quit when asked over QMP).
    KillVm {
        /// The VM.
        name: String,
    },
    /// How the VMM of VM `name` ended (once it has): its parent is the node manager, so only
    /// it knows the status.
    VmExit {
        /// The VM.
        name: String,
    },
    /// Kills VMMs started for `name` that no handle covers.
    KillStrayVms {
        /// The VM.
        name: String,
    },
    /// Names of the node's live VMMs (their runtime files are in its run directory).
    VmNames,
    /// Removes the cgroups VMMs that died unwatched left.
    RemoveStaleVmConfinement,
    /// Makes network namespace `netns` (TAP, gateway address, firewall) unless it exists.
    EnsureVmNetwork {
        /// The namespace.
        netns: String,
    },
    /// Removes network namespace `netns`. Idempotent.
    RemoveVmNetwork {
        /// The namespace.
        netns: String,
    },
    /// The node's network namespaces.
    VmNetworks,
    /// Opens the egress gateway's listening sockets inside `netns` and passes them back.
    OpenGatewaySockets {
        /// The namespace.
        netns: String,
    },
    /// Opens the guest side of a UDP flow inside `netns`: a transparent socket bound to
    /// `dst` (where the guest wrote) and connected to `guest` (its address and port).
    OpenUdpFlow {
        /// The namespace.
        netns: String,
        /// The destination the guest wrote to.
        dst: std::net::SocketAddrV4,
        /// The guest's address and port.
        guest: std::net::SocketAddrV4,
    },
    /// Installs or replaces the uplink guard in the node manager's namespace, rejecting the
    /// non-public ranges and `node_addresses`, accepting `granted` (at most
    /// [`space_core::egress::MAX_CEILING_GRANTS`] of each).
    GuardUplink {
        /// The uplink namespace (`None`: the node manager's own).
        #[serde(default)]
        netns: crate::UplinkNetns,
        /// The operator's granted networks.
        granted: Vec<ipnet::IpNet>,
        /// The node's own addresses.
        node_addresses: Vec<std::net::IpAddr>,
    },
    /// Removes the uplink guard.
    UnguardUplink {
        /// The uplink namespace (`None`: the node manager's own).
        #[serde(default)]
        netns: crate::UplinkNetns,
    },
    /// Makes `count` (1 to [`crate::MAX_UPLINK_SOCKETS`]) marked uplink sockets of `kind`
    /// and passes them back.
    OpenUplinkSockets {
        /// The uplink namespace (`None`: the node manager's own).
        #[serde(default)]
        netns: crate::UplinkNetns,
        /// Which kind.
        kind: crate::UplinkSocketKind,
        /// How many.
        count: usize,
    },
}

fn yes() -> bool {
    true
}

/// A template build's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateBuild {
    /// The name to give it (validated by the node manager too); `None`: found by its digest
    /// only (the base of a build with steps).
    pub name: Option<String>,
    /// The account commands run as by default, instead of the image's `User`.
    pub user: Option<String>,
    /// The kernel bundle it boots with (in the store).
    pub kernel_digest: String,
}

impl Request {
    /// The operation's name, for logs and metrics.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::OpenStore => "open_store",
            Request::CreateSandboxDisk { .. } => "create_sandbox_disk",
            Request::CloneDisk { .. } => "clone_disk",
            Request::SnapshotDisk { .. } => "snapshot_disk",
            Request::LinkDisk { .. } => "link_disk",
            Request::InstallTemplate { .. } => "install_template",
            Request::BuildTemplate { .. } => "build_template",
            Request::NameTemplate { .. } => "name_template",
            Request::RemoveTemplateName { .. } => "remove_template_name",
            Request::RemoveUnnamedTemplate { .. } => "remove_unnamed_template",
            Request::InstallKernel { .. } => "install_kernel",
            Request::RemoveDir { .. } => "remove_dir",
            Request::ForgetMemoryImage { .. } => "forget_memory_image",
            Request::RemoveSandboxFiles { .. } => "remove_sandbox_files",
            Request::LaunchVm { .. } => "launch_vm",
            Request::KillVm { .. } => "kill_vm",
            Request::VmExit { .. } => "vm_exit",
            Request::KillStrayVms { .. } => "kill_stray_vms",
            Request::VmNames => "vm_names",
            Request::RemoveStaleVmConfinement => "remove_stale_vm_confinement",
            Request::EnsureVmNetwork { .. } => "ensure_vm_network",
            Request::RemoveVmNetwork { .. } => "remove_vm_network",
            Request::VmNetworks => "vm_networks",
            Request::OpenGatewaySockets { .. } => "open_gateway_sockets",
            Request::OpenUdpFlow { .. } => "open_udp_flow",
            Request::GuardUplink { .. } => "guard_uplink",
            Request::UnguardUplink { .. } => "unguard_uplink",
            Request::OpenUplinkSockets { .. } => "open_uplink_sockets",
        }
    }
}

/// What the node manager answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// The handshake was accepted.
    Welcome {
        /// The server's [`PROTOCOL_VERSION`].
        version: u32,
    },
    /// Done; nothing to report.
    Done,
    /// A yes/no answer (e.g. whether something was there to delete).
    Flag {
        /// The answer.
        value: bool,
    },
    /// How many (e.g. VMMs killed).
    Count {
        /// The count.
        value: u64,
    },
    /// Names (VMs, namespaces).
    Names {
        /// The names.
        names: Vec<String>,
    },
    /// A VMM was launched and released: the caller may connect to its control socket.
    Launched {
        /// Its pid.
        pid: u32,
    },
    /// How a VMM ended.
    VmEnded {
        /// Its end.
        end: VmEnd,
    },
    /// A network namespace is ready for a VM.
    VmNetwork {
        /// The TAP device in it.
        tap: String,
        /// The guest's MAC.
        mac: [u8; 6],
    },
    /// The gateway's sockets, passed as descriptors with this frame, in this order: DNS
    /// over UDP, DNS over TCP, the transparent proxy, the UDP relay.
    GatewaySockets,
    /// A UDP flow's socket, passed as the one descriptor with this frame.
    UdpFlowSocket,
    /// Uplink sockets, passed as the descriptors with this frame.
    UplinkSockets,
    /// A line of a build's progress; more frames follow.
    Progress {
        /// The line (at most [`MAX_PROGRESS_LINE`] bytes).
        line: String,
    },
    /// A template was built (or found built) and named.
    Template {
        /// It.
        template: Box<TemplateInfo>,
    },
    /// The request was refused or failed; nothing else happened.
    Refused(Refusal),
}

/// How a VMM process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum VmEnd {
    /// It exited with `code`.
    Code {
        /// The exit status.
        code: i32,
    },
    /// Signal `signal` ended it.
    Signal {
        /// The signal number.
        signal: i32,
    },
    /// Not known (not launched by this node manager, or not ended yet).
    Unknown,
}

/// A refused or failed request: a machine-readable code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Refusal {
    /// What kind of failure.
    pub code: RefusalCode,
    /// What happened, for logs.
    pub message: String,
}

impl Refusal {
    /// A refusal.
    pub fn new(code: RefusalCode, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

/// Kinds of refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCode {
    /// The request is malformed or out of range.
    BadRequest,
    /// Another protocol version.
    UnsupportedVersion,
    /// The caller's uid may not use the node manager.
    Forbidden,
    /// A path leaves its area, or names something the caller may not change.
    Confinement,
    /// A frame is larger than the protocol allows.
    TooLarge,
    /// What the request names does not exist.
    NotFound,
    /// The store failed.
    Storage,
    /// The VMM failed.
    Vmm,
    /// Networking failed.
    Network,
    /// A file system operation failed.
    Io,
    /// An image could not become a template (malformed, hostile or too large).
    BadImage,
}

impl fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            RefusalCode::BadRequest => "bad_request",
            RefusalCode::UnsupportedVersion => "unsupported_version",
            RefusalCode::Forbidden => "forbidden",
            RefusalCode::Confinement => "confinement",
            RefusalCode::TooLarge => "too_large",
            RefusalCode::NotFound => "not_found",
            RefusalCode::Storage => "storage",
            RefusalCode::Vmm => "vmm",
            RefusalCode::Network => "network",
            RefusalCode::Io => "io",
            RefusalCode::BadImage => "bad_image",
        };
        f.write_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_of_plain_components_only() {
        for good in [
            "a",
            "sandboxes/sbx-1/rootfs.ext4",
            "images/.staging-x/disk.raw",
        ] {
            assert!(RelPath::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "..",
            "./a",
            "a//b",
            "a/",
            "a\0b",
            "a/./b",
        ] {
            assert!(RelPath::new(bad).is_err(), "{bad:?}");
        }
        assert!(
            RelPath::new(&"a/".repeat(40)[..79]).is_err(),
            "too many components"
        );
        assert!(RelPath::new(&"x".repeat(256)).is_err(), "long component");
    }

    #[test]
    fn paths_from_the_wire_are_checked_too() {
        let r: Result<NodePath, _> =
            serde_json::from_str(r#"{"area":"store","rel":"../../etc/shadow"}"#);
        assert!(r.is_err());
        let r: Result<NodePath, _> = serde_json::from_str(r#"{"area":"root","rel":"a"}"#);
        assert!(r.is_err());
    }

    #[test]
    fn is_under_matches_whole_components() {
        let p = RelPath::new("templates/abc/rootfs.ext4").unwrap();
        assert!(p.is_under("templates"));
        assert!(!p.is_under("templ"));
        assert!(!RelPath::new("templatesX/a").unwrap().is_under("templates"));
    }

    #[test]
    fn names_are_plain() {
        assert!(check_name("VM", "sbx-abc_1.2").is_ok());
        for bad in ["", "-x", ".x", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name("VM", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn requests_round_trip_and_unknown_ops_are_refused() {
        let r = Request::KillVm {
            name: "sbx-1".into(),
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, r#"{"op":"kill_vm","name":"sbx-1"}"#);
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), r);
        assert!(serde_json::from_str::<Request>(r#"{"op":"run_shell","cmd":"id"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"kill_vm"}"#).is_err());
    }

    #[test]
    fn vm_shapes_are_bounded() {
        let p = |s: &str| NodePath {
            area: Area::Store,
            rel: RelPath::new(s).unwrap(),
        };
        let mut spec = VmSpec {
            name: "sbx-1".into(),
            vcpus: 1,
            memory_mib: 256,
            kernel: p("kernels/k/vmlinuz"),
            initrd: p("kernels/k/initrd"),
            cmdline: "console=ttyS0".into(),
            root_disk: p("sandboxes/sbx-1/rootfs.ext4"),
            run_dir: NodePath {
                area: Area::Run,
                rel: RelPath::new("sbx-1").unwrap(),
            },
            accel: "tcg".into(),
            tcg_tb_size_mib: None,
            memory: MemorySpec::Anonymous,
            restore: None,
            netns: None,
        };
        assert!(spec.check().is_ok());
        spec.vcpus = 0;
        assert!(spec.check().is_err());
        spec.vcpus = 1;
        spec.name = "../x".into();
        assert!(spec.check().is_err());
        spec.name = "sbx-1".into();
        spec.memory = MemorySpec::InMemory {
            image: "fork/../../x".into(),
            shared: false,
        };
        assert!(spec.check().is_err());
    }
}

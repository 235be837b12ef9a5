//! [`RemoteNodeManager`]: the sandbox manager's side of the node manager's socket.
//!
//! Each privileged operation becomes one [`Request`]; absolute paths the sandbox manager
//! works with are turned into [`NodePath`]s here (and resolved again, confined, by the
//! server). Operations on the sandbox manager's own files that need no privilege (a
//! snapshot's directory and metadata) are done in this process. A VM the node manager
//! launched is handed over: this process attaches to its QMP socket and watches it by
//! pidfd; to kill it, it asks QEMU to quit and, if QEMU will not, the node manager.
//!
//! Connections are kept in a small pool and used one request at a time, so concurrent
//! operations (a launch taking seconds, a reflink taking milliseconds) never queue behind
//! each other.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use space_core::template::TemplateInfo;
use space_core::{SandboxId, SnapshotId};
use space_net::datapath::netns;
use space_storage::{ExistingDisk, KernelMeta, PendingSnapshot, Store, SANDBOX_DISK_FILE};
use space_vmm::{GuestMemory, ProcessEnd, Vm, VmConfig, VmNetwork};

use crate::confine::Areas;
use crate::protocol::{
    Existing, MemorySpec, NodePath, Request, Response, RestoreSpec, VmEnd, VmSpec,
    MAX_RESPONSE_BYTES, PROTOCOL_VERSION,
};
use crate::wire;
use crate::{GatewaySockets, NodeManager, NodeManagerError};

/// How long a VMM gets to quit over QMP before the node manager kills it.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long one request may take (a VM launch restoring a large state under TCG is the
/// slowest).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a template build may go without a line of progress (one large layer).
const BUILD_TIMEOUT: Duration = Duration::from_secs(3600);
/// Idle connections kept for reuse.
const MAX_IDLE: usize = 8;

/// The node manager of this node, reached over its socket.
pub struct RemoteNodeManager {
    inner: Arc<Client>,
}

struct Client {
    socket: PathBuf,
    areas: Areas,
    idle: Mutex<Vec<UnixStream>>,
}

impl RemoteNodeManager {
    /// The node manager listening on `socket`, serving the node whose data directory is
    /// `data_dir`. Connects once, so that a wrong socket or version fails here.
    pub fn connect(socket: &Path, data_dir: &Path) -> Result<Self, NodeManagerError> {
        let data_dir = std::path::absolute(data_dir).map_err(|e| NodeManagerError::Io {
            what: "cannot resolve data directory",
            path: data_dir.to_owned(),
            source: e,
        })?;
        // The store's paths are canonical (see `Store::open`); the run directory's are not.
        let canonical = data_dir.canonicalize().map_err(|e| NodeManagerError::Io {
            what: "cannot resolve data directory",
            path: data_dir.clone(),
            source: e,
        })?;
        let client = Client {
            socket: socket.to_owned(),
            areas: Areas::new(
                &canonical.join("store"),
                &data_dir.join("run"),
                Path::new(crate::FORK_IMAGE_ROOT),
            ),
            idle: Mutex::new(Vec::new()),
        };
        let first = client.open()?;
        client.put_back(first);
        Ok(RemoteNodeManager {
            inner: Arc::new(client),
        })
    }

    /// One request and its answer, on a blocking thread (for operations that take long).
    async fn call_async(
        &self,
        request: Request,
    ) -> Result<(Response, Vec<OwnedFd>), NodeManagerError> {
        let client = self.inner.clone();
        tokio::task::spawn_blocking(move || client.call(&request))
            .await
            .map_err(|e| NodeManagerError::Connection(format!("request task: {e}")))?
    }

    /// How VM `name`'s VMM ended, asked of the node manager (its parent) once it has.
    fn exit_status(&self, name: &str) -> space_vmm::ExitStatus {
        let client = self.inner.clone();
        let request = Request::VmExit {
            name: name.to_owned(),
        };
        Box::pin(async move {
            let answer = tokio::task::spawn_blocking(move || client.call(&request)).await;
            match answer {
                Ok(Ok((Response::VmEnded { end }, _))) => match end {
                    VmEnd::Code { code } => ProcessEnd::Code(code),
                    VmEnd::Signal { signal } => ProcessEnd::Signal(signal),
                    VmEnd::Unknown => ProcessEnd::Unknown,
                },
                _ => ProcessEnd::Unknown,
            }
        })
    }

    fn name(&self, abs: &Path) -> Result<NodePath, NodeManagerError> {
        Ok(self.inner.areas.name(abs)?)
    }

    /// The protocol's description of `cfg`.
    fn spec(&self, cfg: &VmConfig) -> Result<VmSpec, NodeManagerError> {
        let memory = match &cfg.memory {
            GuestMemory::Anonymous => MemorySpec::Anonymous,
            GuestMemory::File { path, shared } => MemorySpec::File {
                path: self.name(path)?,
                shared: *shared,
            },
            GuestMemory::InMemory { image, shared } => MemorySpec::InMemory {
                image: image.clone(),
                shared: *shared,
            },
        };
        let restore = cfg.restore.map(|r| RestoreSpec {
            ignore_shared: r.ignore_shared,
        });
        let netns = match &cfg.network {
            Some(n) => Some(netns_name(&n.netns)?),
            None => None,
        };
        Ok(VmSpec {
            name: cfg.name.clone(),
            vcpus: cfg.vcpus,
            memory_mib: cfg.memory_mib,
            kernel: self.name(&cfg.kernel)?,
            initrd: self.name(&cfg.initrd)?,
            cmdline: cfg.cmdline.clone(),
            root_disk: self.name(&cfg.root_disk)?,
            run_dir: self.name(&cfg.run_dir)?,
            accel: cfg.accel.to_string(),
            tcg_tb_size_mib: cfg.tcg_tb_size_mib,
            memory,
            restore,
            netns,
        })
    }
}

/// The name of the namespace whose file is `path` (`/run/netns/<name>`).
fn netns_name(path: &Path) -> Result<String, NodeManagerError> {
    path.file_name()
        .and_then(|n| n.to_str())
        .filter(|name| netns::path(name) == path)
        .map(str::to_owned)
        .ok_or_else(|| {
            NodeManagerError::Connection(format!(
                "{} is not a named network namespace",
                path.display()
            ))
        })
}

/// Whether an idle connection is still open. The node manager never speaks unasked, so an
/// idle connection that is readable is one it has closed (the end of file is what is ready).
fn still_open(stream: &UnixStream) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
}

impl Client {
    /// A new connection, greeted.
    fn open(&self) -> Result<UnixStream, NodeManagerError> {
        let conn = |e: std::io::Error| {
            NodeManagerError::Connection(format!("{}: {e}", self.socket.display()))
        };
        let stream = UnixStream::connect(&self.socket).map_err(conn)?;
        stream
            .set_read_timeout(Some(REQUEST_TIMEOUT))
            .map_err(conn)?;
        match self.exchange(
            &stream,
            &Request::Hello {
                version: PROTOCOL_VERSION,
            },
        )? {
            (Response::Welcome { .. }, _) => Ok(stream),
            (other, _) => Err(unexpected("hello", &other)),
        }
    }

    fn put_back(&self, stream: UnixStream) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(stream);
        }
    }

    /// Sends `request` on `stream` and reads the answer; a refusal is an error.
    fn exchange(
        &self,
        stream: &UnixStream,
        request: &Request,
    ) -> Result<(Response, Vec<OwnedFd>), NodeManagerError> {
        wire::send(stream, request, &[]).map_err(|e| broken(request, e))?;
        Self::receive(stream, request)
    }

    /// Reads the next answer to `request` from `stream`; a refusal is an error.
    fn receive(
        stream: &UnixStream,
        request: &Request,
    ) -> Result<(Response, Vec<OwnedFd>), NodeManagerError> {
        let frame = wire::recv(stream, MAX_RESPONSE_BYTES)
            .map_err(|e| broken(request, e))?
            .ok_or_else(|| {
                NodeManagerError::Connection(format!("{}: the node manager hung up", request.op()))
            })?;
        match frame.parse::<Response>().map_err(|e| broken(request, e))? {
            Response::Refused(r) => Err(NodeManagerError::Refused(r)),
            r => Ok((r, frame.fds)),
        }
    }

    /// One request, on a pooled connection if one is still open, else on a fresh one. A
    /// request is never sent twice: one whose connection broke after it was written may
    /// have been carried out (a launch, a clone), so that failure is the caller's to see.
    fn call(&self, request: &Request) -> Result<(Response, Vec<OwnedFd>), NodeManagerError> {
        let pooled = loop {
            let next = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match next {
                Some(stream) if still_open(&stream) => break Some(stream),
                // Closed by the node manager while idle (its timeout, or a restart).
                Some(_) => continue,
                None => break None,
            }
        };
        let stream = match pooled {
            Some(stream) => stream,
            None => self.open()?,
        };
        let r = self.exchange(&stream, request);
        if !matches!(r, Err(NodeManagerError::Connection(_))) {
            self.put_back(stream);
        }
        r
    }

    /// A request answered by [`Response::Progress`] frames (each given to `progress`) and
    /// then one final answer, on a connection of its own that waits up to `timeout` for
    /// each frame. The connection is not reused: a build's end may leave it mid-stream.
    fn call_streaming(
        &self,
        request: &Request,
        timeout: Duration,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Response, NodeManagerError> {
        let stream = self.open()?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| broken(request, e.into()))?;
        wire::send(&stream, request, &[]).map_err(|e| broken(request, e))?;
        loop {
            match Self::receive(&stream, request)? {
                (Response::Progress { line }, _) => progress(&line),
                (r, _) => return Ok(r),
            }
        }
    }

    fn call_done(&self, request: &Request) -> Result<(), NodeManagerError> {
        match self.call(request)? {
            (Response::Done, _) => Ok(()),
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }

    fn call_count(&self, request: &Request) -> Result<usize, NodeManagerError> {
        match self.call(request)? {
            (Response::Count { value }, _) => Ok(value as usize),
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }

    fn call_names(&self, request: &Request) -> Result<Vec<String>, NodeManagerError> {
        match self.call(request)? {
            (Response::Names { names }, _) => Ok(names),
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }
}

/// The connection broke (or the protocol did) during `request`.
fn broken(request: &Request, e: wire::WireError) -> NodeManagerError {
    NodeManagerError::Connection(format!("{}: {e}", request.op()))
}

fn unexpected(op: &str, r: &Response) -> NodeManagerError {
    NodeManagerError::Connection(format!("unexpected answer to {op}: {r:?}"))
}

fn existing(e: ExistingDisk) -> Existing {
    match e {
        ExistingDisk::Refuse => Existing::Refuse,
        ExistingDisk::Replace => Existing::Replace,
    }
}

#[async_trait]
impl NodeManager for RemoteNodeManager {
    fn open_store(&self, data_dir: &Path, _loop_size: u64) -> Result<Store, NodeManagerError> {
        // The node manager opened it at its start, with its own size; this makes sure it
        // is still mounted.
        self.inner.call_done(&Request::OpenStore)?;
        Ok(Store::attach(data_dir)?)
    }

    fn create_sandbox_disk(
        &self,
        store: &Store,
        id: &SandboxId,
        image: &Path,
        disk_mib: u32,
    ) -> Result<PathBuf, NodeManagerError> {
        self.inner.call_done(&Request::CreateSandboxDisk {
            sandbox: id.clone(),
            image: self.name(image)?,
            disk_mib,
        })?;
        Ok(store.sandbox_dir(id).join(SANDBOX_DISK_FILE))
    }

    fn clone_disk(
        &self,
        _store: &Store,
        src: &Path,
        dst: &Path,
        disk_mib: u32,
        e: ExistingDisk,
    ) -> Result<(), NodeManagerError> {
        self.inner.call_done(&Request::CloneDisk {
            src: self.name(src)?,
            dst: self.name(dst)?,
            disk_mib,
            existing: existing(e),
        })
    }

    // A snapshot's directory and metadata are the sandbox manager's own files: made and
    // removed here. Only the disk inside, a reflink of a disk lent to a VMM, needs the
    // node manager.
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
        self.inner.call_done(&Request::SnapshotDisk {
            sandbox: pending.sandbox().clone(),
            snapshot: pending.id().clone(),
            disk: self.name(disk)?,
        })
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
        self.inner.call_done(&Request::LinkDisk {
            src: self.name(src)?,
            dst: self.name(dst)?,
        })
    }

    fn install_template(
        &self,
        _store: &Store,
        staged: &Path,
        template: &TemplateInfo,
        named: bool,
    ) -> Result<TemplateInfo, NodeManagerError> {
        let request = Request::InstallTemplate {
            staged: self.name(staged)?,
            template: Box::new(template.clone()),
            named,
        };
        match self.inner.call(&request)?.0 {
            Response::Template { template } => Ok(*template),
            other => Err(unexpected(request.op(), &other)),
        }
    }

    fn build_template(
        &self,
        _store: &Store,
        staged: &Path,
        build: &crate::protocol::TemplateBuild,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<TemplateInfo, NodeManagerError> {
        let request = Request::BuildTemplate {
            staged: self.name(staged)?,
            build: build.clone(),
        };
        match self
            .inner
            .call_streaming(&request, BUILD_TIMEOUT, progress)?
        {
            Response::Template { template } => Ok(*template),
            other => Err(unexpected(request.op(), &other)),
        }
    }

    fn name_template(
        &self,
        _store: &Store,
        name: &str,
        digest: &str,
    ) -> Result<(), NodeManagerError> {
        self.inner.call_done(&Request::NameTemplate {
            name: name.to_owned(),
            digest: digest.to_owned(),
        })
    }

    fn remove_template_name(&self, _store: &Store, name: &str) -> Result<bool, NodeManagerError> {
        match self.inner.call(&Request::RemoveTemplateName {
            name: name.to_owned(),
        })? {
            (Response::Flag { value }, _) => Ok(value),
            (other, _) => Err(unexpected("remove_template_name", &other)),
        }
    }

    fn remove_unnamed_template(
        &self,
        _store: &Store,
        digest: &str,
    ) -> Result<bool, NodeManagerError> {
        match self.inner.call(&Request::RemoveUnnamedTemplate {
            digest: digest.to_owned(),
        })? {
            (Response::Flag { value }, _) => Ok(value),
            (other, _) => Err(unexpected("remove_unnamed_template", &other)),
        }
    }

    fn install_kernel(
        &self,
        _store: &Store,
        staged: &Path,
        kernel: &KernelMeta,
    ) -> Result<(), NodeManagerError> {
        self.inner.call_done(&Request::InstallKernel {
            staged: self.name(staged)?,
            kernel: kernel.clone(),
        })
    }

    fn remove_run_dir(&self, dir: &Path) -> Result<(), NodeManagerError> {
        self.inner.call_done(&Request::RemoveDir {
            dir: self.name(dir)?,
        })
    }

    fn forget_memory_image(&self, image: &str) -> Result<(), NodeManagerError> {
        self.inner.call_done(&Request::ForgetMemoryImage {
            image: image.to_owned(),
        })
    }

    fn remove_sandbox_files(
        &self,
        _store: &Store,
        id: &SandboxId,
        run_dir: &Path,
    ) -> Result<(), NodeManagerError> {
        self.inner.call_done(&Request::RemoveSandboxFiles {
            sandbox: id.clone(),
            run_dir: self.name(run_dir)?,
        })
    }

    async fn launch_vm(&self, cfg: &VmConfig) -> Result<Vm, NodeManagerError> {
        let spec = self.spec(cfg)?;
        match self
            .call_async(Request::LaunchVm {
                spec: Box::new(spec),
            })
            .await?
        {
            (Response::Launched { .. }, _) => {}
            (other, _) => return Err(unexpected("launch_vm", &other)),
        }
        match space_vmm::attach(&cfg.name, &cfg.run_dir, self.exit_status(&cfg.name)).await {
            Ok(vm) => Ok(vm),
            Err(e) => {
                // Nobody could control it: it must not run on.
                let kill = Request::KillVm {
                    name: cfg.name.clone(),
                };
                if let Err(k) = self.call_async(kill).await {
                    tracing::warn!(vm = %cfg.name, error = %k, "cannot kill a VM this process could not attach to");
                }
                Err(e.into())
            }
        }
    }

    async fn adopt_vm(&self, name: &str, run_dir: &Path) -> Result<Vm, NodeManagerError> {
        Ok(space_vmm::attach(name, run_dir, self.exit_status(name)).await?)
    }

    async fn kill_vm(&self, vm: &Vm) -> Result<(), NodeManagerError> {
        let request = Request::KillVm {
            name: vm.name().to_owned(),
        };
        let client = self.inner.clone();
        Ok(vm
            .kill_with(KILL_GRACE, || async move {
                tokio::task::spawn_blocking(move || client.call_done(&request))
                    .await
                    .map_err(|e| space_vmm::VmmError::KillFailed(format!("kill task: {e}")))?
                    .map_err(|e| space_vmm::VmmError::KillFailed(e.to_string()))
            })
            .await?)
    }

    async fn kill_stray_vms(&self, name: &str, run_root: &Path) -> Result<usize, NodeManagerError> {
        // The node manager kills its own node's VMMs only (those under its run directory).
        if run_root != self.inner.areas.root(crate::protocol::Area::Run) {
            return Err(NodeManagerError::Refused(crate::protocol::Refusal::new(
                crate::protocol::RefusalCode::Confinement,
                "stray VMMs are killed under this node's run directory only",
            )));
        }
        let client = self.inner.clone();
        let request = Request::KillStrayVms {
            name: name.to_owned(),
        };
        tokio::task::spawn_blocking(move || client.call_count(&request))
            .await
            .map_err(|e| NodeManagerError::Connection(format!("request task: {e}")))?
    }

    fn vm_names_under(&self, run_root: &Path) -> Vec<String> {
        // The node manager knows its node's run directory; it lists nothing else.
        let names = if run_root == self.inner.areas.root(crate::protocol::Area::Run) {
            self.inner.call_names(&Request::VmNames)
        } else {
            Err(NodeManagerError::Refused(crate::protocol::Refusal::new(
                crate::protocol::RefusalCode::Confinement,
                format!("{} is not this node's run directory", run_root.display()),
            )))
        };
        names.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list the node's VMMs");
            Vec::new()
        })
    }

    fn remove_stale_vm_confinement(&self) -> usize {
        self.inner
            .call_count(&Request::RemoveStaleVmConfinement)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot remove stale VMM cgroups");
                0
            })
    }

    fn ensure_vm_network(&self, name: &str) -> Result<VmNetwork, NodeManagerError> {
        let request = Request::EnsureVmNetwork {
            netns: name.to_owned(),
        };
        match self.inner.call(&request)? {
            (Response::VmNetwork { tap, mac }, _) => Ok(VmNetwork {
                netns: netns::path(name),
                tap,
                mac,
            }),
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }

    fn remove_vm_network(&self, name: &str) -> Result<(), NodeManagerError> {
        self.inner.call_done(&Request::RemoveVmNetwork {
            netns: name.to_owned(),
        })
    }

    fn vm_networks(&self, prefix: &str) -> Vec<String> {
        match self.inner.call_names(&Request::VmNetworks) {
            Ok(names) => names
                .into_iter()
                .filter(|n| n.starts_with(prefix))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the node's network namespaces");
                Vec::new()
            }
        }
    }

    fn open_udp_flow(
        &self,
        name: &str,
        dst: std::net::SocketAddrV4,
        guest: std::net::SocketAddrV4,
    ) -> Result<std::net::UdpSocket, NodeManagerError> {
        let request = Request::OpenUdpFlow {
            netns: name.to_owned(),
            dst,
            guest,
        };
        match self.inner.call(&request)? {
            (Response::UdpFlowSocket, fds) => {
                let [fd]: [OwnedFd; 1] = fds.try_into().map_err(|fds: Vec<OwnedFd>| {
                    NodeManagerError::Connection(format!(
                        "UDP flow: {} descriptors instead of 1",
                        fds.len()
                    ))
                })?;
                Ok(fd.into())
            }
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }

    fn guard_uplink(
        &self,
        uplink: &crate::UplinkNetns,
        granted: &[ipnet::IpNet],
        node_addresses: &[std::net::IpAddr],
    ) -> Result<(), NodeManagerError> {
        let request = Request::GuardUplink {
            netns: uplink.clone(),
            granted: granted.to_vec(),
            node_addresses: node_addresses.to_vec(),
        };
        match self.inner.call(&request)? {
            (Response::Done, _) => Ok(()),
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }

    fn unguard_uplink(&self, uplink: &crate::UplinkNetns) -> Result<(), NodeManagerError> {
        let request = Request::UnguardUplink {
            netns: uplink.clone(),
        };
        match self.inner.call(&request)? {
            (Response::Done, _) => Ok(()),
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }

    fn open_uplink_sockets(
        &self,
        uplink: &crate::UplinkNetns,
        kind: crate::UplinkSocketKind,
        count: usize,
    ) -> Result<Vec<OwnedFd>, NodeManagerError> {
        let request = Request::OpenUplinkSockets {
            netns: uplink.clone(),
            kind,
            count: count.clamp(1, crate::MAX_UPLINK_SOCKETS),
        };
        match self.inner.call(&request)? {
            (Response::UplinkSockets, fds) if !fds.is_empty() => Ok(fds),
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }

    fn open_gateway_sockets(&self, name: &str) -> Result<GatewaySockets, NodeManagerError> {
        let request = Request::OpenGatewaySockets {
            netns: name.to_owned(),
        };
        match self.inner.call(&request)? {
            (Response::GatewaySockets, fds) => {
                let [dns_udp, dns_tcp, proxy, udp_relay]: [OwnedFd; 4] =
                    fds.try_into().map_err(|fds: Vec<OwnedFd>| {
                        NodeManagerError::Connection(format!(
                            "gateway sockets: {} descriptors instead of 4",
                            fds.len()
                        ))
                    })?;
                Ok(GatewaySockets {
                    dns_udp: dns_udp.into(),
                    dns_tcp: dns_tcp.into(),
                    proxy: proxy.into(),
                    udp_relay,
                })
            }
            (other, _) => Err(unexpected(request.op(), &other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_connection_the_server_closed_is_not_reused() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        assert!(still_open(&ours));
        drop(theirs);
        assert!(!still_open(&ours));
    }
}

//! The sandbox manager: creates, watches, re-adopts and deletes sandboxes.
//!
//! Every state change goes through [`Inner::transition`], which applies the lifecycle
//! table and persists the record before anything else sees the new state. Operations on one
//! sandbox are serialised by its own lock; different sandboxes never wait for each other.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use space_core::template::TemplateInfo;
use space_core::{NodeCapacity, SandboxEvent, SandboxId, SandboxState};
use space_guest_client::GuestClient;
use space_storage::Store;
use space_vmm::{Accel, Vm};
use tokio::task::AbortHandle;

use crate::config::{default_capacity, NodeConfig, MAX_DATA_DIR_LEN};
use crate::events::EventLog;
use crate::pool::Pool;
use crate::records::RecordStore;
use crate::{NodeError, SandboxRecord};
use space_node_manager::{LocalNodeManager, NodeManager, RemoteNodeManager};

/// Bytes of serial console attached to a failure reason.
const FAILURE_CONSOLE_TAIL: usize = 4096;
/// Deleted records older than this are pruned at start.
const DELETED_RECORD_RETENTION_MS: i64 = 24 * 3600 * 1000;
/// How long a re-adopted daemon has to answer the handshake after a node restart.
const READOPT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long shutdown waits for pool fills in flight.
const SHUTDOWN_FILL_WAIT: Duration = Duration::from_secs(30);
/// How long to wait for the VM to exit after its channel broke, for a better reason.
const EXIT_AFTER_CHANNEL_LOSS: Duration = Duration::from_secs(3);

/// A running node: the sandbox manager plus its store. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) cfg: NodeConfig,
    pub(crate) store: Store,
    pub(crate) nm: Arc<dyn NodeManager>,
    pub(crate) records: RecordStore,
    pub(crate) accel: Accel,
    pub(crate) capacity: NodeCapacity,
    pub(crate) run_root: PathBuf,
    pub(crate) pool: Pool,
    pub(crate) events: EventLog,
    pub(crate) scheduler: crate::scheduler::Scheduler,
    /// Every sandbox's resource-use samples.
    pub(crate) metrics: crate::metrics::Metrics,
    pub(crate) background: Mutex<Vec<AbortHandle>>,
    /// The gateways' way out and upstream TLS (with `sandbox_network`), made on first use.
    pub(crate) gateway_shared: crate::gateway::GatewayCell,
    /// Each sandbox's CA for TLS interception.
    pub(crate) sandbox_cas: crate::sandbox_ca::CaStore,
    /// The credential manager and its audit log.
    pub(crate) credentials: crate::credentials::Credentials,
    /// Tenants' artifact keys lent by the control plane (see [`crate::sealing`]).
    pub(crate) artifact_keys: crate::sealing::ArtifactKeys,
    /// What no egress policy may reach (the operator's grants, the node's addresses).
    pub(crate) egress_ceiling: Arc<space_core::egress::EgressCeiling>,
    /// Each tenant's open egress connections across its sandboxes' gateways.
    pub(crate) tenant_connections: space_net::proxy::tenant_connections::TenantConnectionLimits,
    /// Where suspended sandboxes' snapshots go (`None`: no suspend or resume here).
    pub(crate) objects: Option<space_objects::Objects>,
    /// Templates and kernel bundles in the object store: what is known published, fetches
    /// under way.
    pub(crate) published: crate::published::Published,
    /// Template builds started here.
    pub(crate) template_builds: crate::template_builds::TemplateBuilds,
    sandboxes: Mutex<HashMap<SandboxId, Entry>>,
}

/// Live state of one sandbox.
pub(crate) struct Entry {
    pub(crate) record: SandboxRecord,
    pub(crate) vm: Option<Arc<Vm>>,
    pub(crate) guest: Option<GuestClient>,
    /// Serialises the operations (create, pause, snapshot, delete…) on this sandbox.
    pub(crate) op: Arc<tokio::sync::Mutex<()>>,
    pub(crate) monitor: Option<AbortHandle>,
    /// The egress gateway in the VM's namespace (with `sandbox_network`).
    pub(crate) gateway: Option<crate::gateway::Gateway>,
    /// When the daemon channel broke under a running VM and was opened afresh, ms since
    /// the Unix epoch (those inside [`crate::recovery::CRASH_WINDOW_MS`]).
    pub(crate) channel_reconnects_ms: Vec<i64>,
}

impl Entry {
    fn new(record: SandboxRecord) -> Self {
        Entry {
            record,
            vm: None,
            guest: None,
            op: Arc::default(),
            monitor: None,
            gateway: None,
            channel_reconnects_ms: Vec::new(),
        }
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn internal(what: &str, e: impl std::fmt::Display) -> NodeError {
    NodeError::Internal(format!("{what}: {e}"))
}

impl Node {
    /// Opens the store (through the node manager), loads the sandbox records, re-adopts the
    /// VMs that should be running and cleans up anything left over from a crash.
    pub async fn start(cfg: NodeConfig) -> Result<Node, NodeError> {
        let data_dir =
            std::path::absolute(&cfg.data_dir).map_err(|e| internal("bad data directory", e))?;
        if data_dir.as_os_str().len() > MAX_DATA_DIR_LEN {
            return Err(NodeError::Invalid(format!(
                "data directory {} is longer than {MAX_DATA_DIR_LEN} bytes (sandbox socket paths would exceed the Unix limit)",
                data_dir.display()
            )));
        }
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| internal("cannot create data directory", e))?;
        let accel = match &cfg.accel {
            Some(a) => a
                .parse::<Accel>()
                .map_err(|e| NodeError::Invalid(format!("bad accelerator: {e}")))?,
            None => space_vmm::detect_accel(),
        };
        tracing::info!(%accel, "VMs will run under {accel}");
        let run_root = data_dir.join("run");
        let nm: Arc<dyn NodeManager> = match &cfg.node_manager {
            Some(socket) => Arc::new(RemoteNodeManager::connect(socket, &data_dir)?),
            None => Arc::new(LocalNodeManager::qemu(
                &run_root,
                cfg.vmm_jail,
                space_vmm::FileOwner::current(),
            )),
        };
        let store = {
            let nm = nm.clone();
            let (dir, size) = (data_dir.clone(), cfg.loop_size_bytes);
            tokio::task::spawn_blocking(move || nm.open_store(&dir, size))
                .await
                .map_err(|e| internal("store task", e))??
        };
        let records_dir = store.root().join("records");
        let records =
            RecordStore::open(&records_dir).map_err(|e| internal("cannot open records", e))?;
        let capacity = cfg
            .capacity
            .unwrap_or_else(|| default_capacity(fs_size(store.root())));
        std::fs::create_dir_all(&run_root)
            .map_err(|e| internal("cannot create run directory", e))?;
        let egress_ceiling = egress_ceiling(&cfg)?;
        let cfg_pool_size = cfg.pool_size;
        let sandbox_cas = crate::sandbox_ca::CaStore::open(&data_dir.join("sandbox-ca"))?;
        let credentials = crate::credentials::open(
            &data_dir,
            &cfg.credentials,
            &cfg.credential_audit,
            cfg.placeholder_key.as_deref(),
        )
        .await?;
        let objects = cfg
            .object_store
            .as_ref()
            .map(space_objects::Objects::open)
            .transpose()
            .map_err(|e| internal("cannot open the object store", e))?;
        if let Some(o) = &objects {
            tracing::info!(store = ?o, "object store for suspended sandboxes");
        }
        let node = Node {
            inner: Arc::new(Inner {
                cfg: NodeConfig { data_dir, ..cfg },
                store,
                nm,
                records,
                accel,
                capacity,
                run_root,
                pool: Pool::new(cfg_pool_size),
                events: EventLog::new(&records_dir),
                scheduler: Default::default(),
                metrics: Default::default(),
                background: Mutex::new(Vec::new()),
                gateway_shared: Default::default(),
                sandbox_cas,
                credentials,
                artifact_keys: Default::default(),
                egress_ceiling,
                // Bounded before the control plane says more (it sets the operator's default
                // and each tenant's quota when it starts).
                tenant_connections:
                    space_net::proxy::tenant_connections::TenantConnectionLimits::new(
                        space_core::quota::TenantQuota::embedded_default().max_connections,
                    ),
                objects,
                published: Default::default(),
                template_builds: Default::default(),
                sandboxes: Mutex::new(HashMap::new()),
            }),
        };
        node.recover().await?;
        node.start_background();
        Ok(node)
    }

    /// What no egress policy may reach: every policy set on this node is checked against it,
    /// and its gateways refuse connections beyond it.
    pub fn egress_ceiling(&self) -> &space_core::egress::EgressCeiling {
        &self.inner.egress_ceiling
    }

    /// Node name.
    pub fn name(&self) -> &str {
        &self.inner.cfg.node_name
    }

    /// The accelerator VMs run under.
    pub fn accel(&self) -> Accel {
        self.inner.accel
    }

    /// The btrfs store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Total capacity.
    pub fn capacity(&self) -> NodeCapacity {
        self.inner.capacity
    }

    /// Capacity held by sandboxes.
    pub fn used(&self) -> NodeCapacity {
        used_by(&self.inner.lock())
    }

    /// What the node reports of itself: capacity, use, and how warm it is per template.
    pub async fn status(&self) -> Result<crate::NodeStatus, NodeError> {
        let (used, sandboxes) = {
            let map = self.inner.lock();
            let live = map
                .values()
                .filter(|e| e.record.state != SandboxState::Deleted)
                .count();
            (used_by(&map), u32::try_from(live).unwrap_or(u32::MAX))
        };
        let mut pool_ready = std::collections::BTreeMap::new();
        for shape in self.pool_status() {
            *pool_ready.entry(shape.template_digest).or_insert(0u32) +=
                u32::try_from(shape.ready).unwrap_or(u32::MAX);
        }
        let templates = self.templates()?.into_iter().map(|t| t.digest).collect();
        let store = self.inner.store.clone();
        let memory_images =
            tokio::task::spawn_blocking(move || crate::image::image_dir(&store).list())
                .await
                .map_err(|e| NodeError::Internal(format!("memory image listing task: {e}")))??
                .into_iter()
                .map(|image| image.key.template_digest)
                .collect();
        Ok(crate::NodeStatus {
            capacity: self.inner.capacity,
            used,
            sandboxes,
            memory_images,
            templates,
            templates_fetched: self.fetched_from_object_store(),
            pool_ready,
            credentials_revision: self
                .inner
                .credentials
                .catalog_revision
                .load(std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// Templates on this node.
    pub fn templates(&self) -> Result<Vec<TemplateInfo>, NodeError> {
        self.inner
            .store
            .templates()
            .list()
            .map_err(|e| internal("cannot list templates", e))
    }

    /// One template.
    pub fn template(&self, name: &str) -> Result<TemplateInfo, NodeError> {
        self.inner
            .store
            .templates()
            .get(name)
            .map_err(|e| internal("cannot read template", e))?
            .ok_or_else(|| NodeError::TemplateNotFound(name.to_owned()))
    }

    /// The template a sandbox was created from: the one of its digest (its name may point
    /// at a newer build since), else the one its name points at.
    pub(crate) fn template_of(&self, rec: &SandboxRecord) -> Result<TemplateInfo, NodeError> {
        let by_digest = self
            .inner
            .store
            .templates()
            .lookup_digest(&rec.template_digest)
            .map_err(|e| internal("cannot read template", e))?;
        match by_digest {
            Some(tpl) => Ok(tpl),
            None => self.template(&rec.template),
        }
    }

    /// Live record of one sandbox.
    pub fn sandbox(&self, id: &SandboxId) -> Option<SandboxRecord> {
        self.inner.lock().get(id).map(|e| e.record.clone())
    }

    /// All records, deleted ones included until they are pruned.
    pub fn sandboxes(&self) -> Vec<SandboxRecord> {
        self.inner
            .lock()
            .values()
            .map(|e| e.record.clone())
            .collect()
    }

    /// The node's channel to a running sandbox's daemon.
    pub fn guest(&self, id: &SandboxId) -> Result<GuestClient, NodeError> {
        let map = self.inner.lock();
        let entry = map
            .get(id)
            .filter(|e| e.record.state != SandboxState::Deleted);
        let entry = entry.ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        match (&entry.guest, entry.record.state) {
            (Some(g), state) if state.serves_guest() => Ok(g.clone()),
            (_, state) => Err(NodeError::NotServing(state)),
        }
    }

    /// Like [`Node::guest`], but first resumes a sandbox that idleness paused: the call
    /// that needs the guest is what wakes it.
    pub async fn guest_waking(&self, id: &SandboxId) -> Result<GuestClient, NodeError> {
        let rec = self.settled(id).await?;
        let idle_paused =
            rec.state == SandboxState::Paused && rec.paused_by == Some(crate::PauseCause::Idle);
        if idle_paused {
            match self.resume_sandbox(id).await {
                Ok(_) => {}
                // Someone else resumed it first.
                Err(NodeError::Lifecycle(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let guest = self.guest(id)?;
        if !guest.is_closed() {
            return Ok(guest);
        }
        // The session ended under a running VM: wait for (or make) a fresh one rather than
        // fail this call with the old one's end.
        self.reconnect_channel(id, &guest.closed().await.to_string())
            .await;
        self.guest(id)
    }

    /// The sandbox's event log, oldest first.
    pub fn events(&self, id: &SandboxId) -> Result<Vec<space_core::LifecycleEntry>, NodeError> {
        if self.sandbox(id).is_none() {
            return Err(NodeError::SandboxNotFound(id.clone()));
        }
        Ok(self.inner.events.read(id))
    }

    /// Event log entries of every sandbox from now on.
    pub fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<space_core::LifecycleEntry> {
        self.inner.events.subscribe()
    }

    /// Last `max_bytes` of the sandbox's serial console.
    pub fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> Result<String, NodeError> {
        match self.sandbox(id) {
            Some(r) if r.state != SandboxState::Deleted => {}
            _ => return Err(NodeError::SandboxNotFound(id.clone())),
        }
        let path = space_vmm::VmPaths::new(&self.inner.run_dir(id)).console_log;
        match space_vmm::console_tail(&path, max_bytes) {
            Ok(s) => Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(internal("cannot read console log", e)),
        }
    }

    /// Keeps the VM and channel of a running sandbox and starts watching them.
    pub(crate) fn attach(&self, id: &SandboxId, vm: Arc<Vm>, guest: Option<GuestClient>) {
        let weak = Arc::downgrade(&self.inner);
        let monitor = tokio::spawn(watch(weak, id.clone(), vm.clone(), guest.clone()));
        // The same VM again (pause, resume, a new session): its gateway keeps running, with
        // its connections. Without a gateway a sandbox simply has no way out; that is
        // logged, not fatal.
        let same_vm = self
            .inner
            .lock()
            .get(id)
            .and_then(|e| e.gateway.as_ref())
            .is_some_and(|g| g.vm_name == vm.name());
        let gateway = if self.inner.cfg.sandbox_network && !same_vm {
            let record = self.sandbox(id);
            match record
                .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))
                .and_then(|r| self.inner.start_gateway(&r, vm.name()))
            {
                Ok(g) => Some(g),
                Err(e) => {
                    tracing::error!(%id, error = %e, "cannot start the sandbox's gateway");
                    None
                }
            }
        } else {
            None
        };
        let mut map = self.inner.lock();
        if let Some(e) = map.get_mut(id) {
            e.vm = Some(vm);
            e.guest = guest;
            if !same_vm {
                e.gateway = gateway;
            }
            if let Some(old) = e.monitor.replace(monitor.abort_handle()) {
                old.abort();
            }
        }
    }

    /// Deletes a sandbox: kills the VMM, removes disk, sockets and logs, marks the record
    /// deleted. Safe to repeat after a failure.
    pub async fn delete_sandbox(&self, id: &SandboxId) -> Result<(), NodeError> {
        let op = {
            let map = self.inner.lock();
            match map.get(id) {
                Some(e) if e.record.state != SandboxState::Deleted => e.op.clone(),
                _ => return Err(NodeError::SandboxNotFound(id.clone())),
            }
        };
        let _guard = op.lock().await;
        // Another delete may have finished while this one waited for the lock.
        if self
            .sandbox(id)
            .is_none_or(|r| r.state == SandboxState::Deleted)
        {
            return Err(NodeError::SandboxNotFound(id.clone()));
        }
        self.inner.transition(id, SandboxEvent::Delete, |_| {})?;
        let vm = {
            let mut map = self.inner.lock();
            map.get_mut(id).and_then(|e| {
                if let Some(m) = e.monitor.take() {
                    m.abort();
                }
                e.guest = None;
                e.vm.take()
            })
        };
        match self.inner.teardown(id, vm).await {
            Ok(()) => {
                self.inner
                    .transition(id, SandboxEvent::Done, |r| r.vmm_pid = None)?;
                self.inner.sandbox_cas.remove(id);
                self.inner.metrics.forget(id);
                tracing::info!(%id, "sandbox deleted");
                Ok(())
            }
            Err(e) => {
                let reason = format!("delete failed: {e}");
                self.inner
                    .transition(id, SandboxEvent::Fail, |r| r.failure_reason = Some(reason))?;
                Err(e)
            }
        }
    }

    /// Stops watching sandboxes; running VMs keep running and are re-adopted by the next
    /// start. Warm pool members are stopped (a new start fills the pool again).
    pub async fn shutdown(&self) {
        for task in self
            .inner
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
        for member in self.inner.pool.drain() {
            self.inner.discard_member(member).await;
        }
        // Fills still running discard their member when they finish; wait for them, so no
        // VM outlives the node unseen.
        let deadline = Instant::now() + SHUTDOWN_FILL_WAIT;
        while self.inner.pool.filling() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut map = self.inner.lock();
        for e in map.values_mut() {
            if let Some(m) = e.monitor.take() {
                m.abort();
            }
            e.guest = None;
            e.vm = None;
            // Close the gateway's sockets: the next start opens them again in the same
            // namespaces (the VMs keep running, and their guests' connections retry).
            e.gateway = None;
        }
        drop(map);
        // No gateway is left to connect out; the next start installs the guard again.
        if self.inner.gateway_shared.get().is_some() {
            if let Err(e) = self.inner.nm.unguard_uplink(&self.inner.cfg.uplink_netns) {
                tracing::warn!(error = %e, "cannot remove the uplink guard");
            }
        }
    }

    /// After a restart: re-adopt, finish or fail every sandbox, then remove leftovers.
    async fn recover(&self) -> Result<(), NodeError> {
        let records = self
            .inner
            .records
            .load_all()
            .map_err(|e| internal("cannot load records", e))?;
        let now = now_ms();
        let mut work = Vec::new();
        let mut builders = Vec::new();
        for rec in records {
            if rec.template_build.is_some() && rec.state != SandboxState::Deleted {
                builders.push(rec.id.clone());
            }
            if rec.state == SandboxState::Deleted
                && now - rec.created_at_ms > DELETED_RECORD_RETENTION_MS
            {
                let _ = self.inner.records.remove(&rec.id);
                self.inner.events.remove(&rec.id);
                continue;
            }
            let id = rec.id.clone();
            let state = rec.state;
            self.inner.lock().insert(id.clone(), Entry::new(rec));
            work.push(async move { self.recover_one(&id, state).await });
        }
        futures::future::join_all(work).await;
        // Builds do not survive a restart: their builders go.
        for id in builders {
            tracing::info!(%id, "deleting the builder of a template build a restart ended");
            if let Err(e) = self.delete_sandbox(&id).await {
                tracing::warn!(%id, error = %e, "cannot delete a template build's builder");
            }
        }
        self.remove_orphans().await;
        Ok(())
    }

    async fn recover_one(&self, id: &SandboxId, state: SandboxState) {
        let run_dir = self.inner.run_dir(id);
        // Snapshot disks rebuilt for an operation the restart ended: plaintext of a disk
        // sealed at rest, needed by nobody now.
        self.sweep_rebuilt_disks(id);
        self.remove_abandoned_fork_checkpoints(id);
        self.note_leftover_disks(id);
        match state {
            SandboxState::Running => match self.readopt(id, &run_dir).await {
                Ok(()) => tracing::info!(%id, "re-adopted running sandbox"),
                Err(reason) => {
                    tracing::warn!(%id, %reason, "cannot re-adopt sandbox");
                    let vm = self
                        .inner
                        .nm
                        .adopt_vm(&self.inner.vm_name(id), &run_dir)
                        .await
                        .ok();
                    self.inner.fail(id, vm.as_ref(), &reason).await;
                }
            },
            SandboxState::Creating => {
                let vm = self
                    .inner
                    .nm
                    .adopt_vm(&self.inner.vm_name(id), &run_dir)
                    .await
                    .ok();
                self.inner
                    .fail(
                        id,
                        vm.as_ref(),
                        "the node restarted while the sandbox was being created",
                    )
                    .await;
            }
            SandboxState::Deleting => {
                if let Err(e) = self.delete_resumed(id).await {
                    tracing::warn!(%id, error = %e, "cannot finish interrupted delete");
                }
            }
            SandboxState::Failed | SandboxState::Deleted | SandboxState::Stopped => {
                let _ = self
                    .inner
                    .nm
                    .remove_pending_snapshots(&self.inner.store, id);
            }
            other => self.recover_transient(id, other).await,
        }
    }

    async fn readopt(&self, id: &SandboxId, run_dir: &Path) -> Result<(), String> {
        let vm = self
            .inner
            .nm
            .adopt_vm(&self.inner.vm_name(id), run_dir)
            .await
            .map_err(|e| format!("VMM gone after node restart: {e}"))?;
        match crate::vm_start::connect_ready(&vm, READOPT_TIMEOUT).await {
            Ok(guest) => {
                let pid = vm.pid();
                let _ = self.inner.set_pid(id, pid);
                self.attach(id, Arc::new(vm), Some(guest));
                Ok(())
            }
            Err(e) => {
                let _ = self.inner.nm.kill_vm(&vm).await;
                Err(format!("daemon did not answer after node restart: {e}"))
            }
        }
    }

    /// Finishes a delete that a crash interrupted (the record is already `deleting`).
    async fn delete_resumed(&self, id: &SandboxId) -> Result<(), NodeError> {
        let vm = self
            .inner
            .nm
            .adopt_vm(&self.inner.vm_name(id), &self.inner.run_dir(id))
            .await
            .ok()
            .map(Arc::new);
        self.inner.teardown(id, vm).await?;
        self.inner
            .transition(id, SandboxEvent::Done, |r| r.vmm_pid = None)?;
        Ok(())
    }

    /// Kills VMs and removes directories that belong to no live sandbox: VMs and disks of
    /// deleted sandboxes, warm pool members (they never survive a restart), image builds
    /// that were interrupted.
    async fn remove_orphans(&self) {
        let (live_ids, live_vms): (HashSet<String>, HashSet<String>) = {
            let map = self.inner.lock();
            let live: Vec<&SandboxRecord> = map
                .values()
                .filter(|e| e.record.state != SandboxState::Deleted)
                .map(|e| &e.record)
                .collect();
            (
                live.iter().map(|r| r.id.to_string()).collect(),
                live.iter().map(|r| r.vm_name().to_owned()).collect(),
            )
        };
        let inner = &self.inner;
        for entry in read_dir_names(&inner.run_root) {
            if live_vms.contains(&entry) || space_vmm::validate_name(&entry).is_err() {
                continue;
            }
            tracing::warn!(vm = %entry, "removing orphaned VM");
            let run_dir = inner.vm_run_dir(&entry);
            if let Ok(vm) = inner.nm.adopt_vm(&entry, &run_dir).await {
                let _ = inner.nm.kill_vm(&vm).await;
            }
            if let Err(e) = inner.nm.remove_run_dir(&run_dir) {
                tracing::warn!(vm = %entry, error = %e, "cannot remove orphaned run directory");
            }
        }
        // VMMs whose run directory is already gone, or that never got as far as a pidfile.
        for name in inner.nm.vm_names_under(&inner.run_root) {
            if live_vms.contains(&name) {
                continue;
            }
            match inner.nm.kill_stray_vms(&name, &inner.run_root).await {
                Ok(n) if n > 0 => tracing::warn!(vm = %name, "killed an orphaned VMM"),
                Ok(_) => {}
                Err(e) => tracing::warn!(vm = %name, error = %e, "cannot kill an orphaned VMM"),
            }
        }
        let cgroups = inner.nm.remove_stale_vm_confinement();
        if cgroups > 0 {
            tracing::info!(cgroups, "removed the cgroups of VMMs that ended unwatched");
        }
        for entry in read_dir_names(&inner.store.sandboxes_root()) {
            if live_ids.contains(&entry) {
                continue;
            }
            let Ok(id) = entry.parse::<SandboxId>() else {
                tracing::warn!(name = %entry, "unexpected entry in the sandboxes directory; leaving it");
                continue;
            };
            tracing::warn!(%id, "removing orphaned sandbox disk");
            // Its persistent snapshots are kept, as a delete keeps them.
            if let Err(e) = inner.persist_snapshots(&id) {
                tracing::warn!(%id, error = %e, "cannot keep the persistent snapshots of an orphaned sandbox; leaving its files");
                continue;
            }
            if let Err(e) =
                inner
                    .nm
                    .remove_sandbox_files(&inner.store, &id, &inner.vm_run_dir(id.as_str()))
            {
                tracing::warn!(%id, error = %e, "cannot remove orphaned sandbox files");
            }
        }
        // Persistent snapshots a crash left half-deleted.
        if let Err(e) = inner.nm.remove_pending_persistent_snapshots(&inner.store) {
            tracing::warn!(error = %e, "cannot remove half-deleted persistent snapshots");
        }
        // Fork images a crash left behind, and their RAM, which a node manager that
        // outlived us may still hold.
        let prefix = space_node_manager::fork_image_prefix(&inner.run_root);
        let fork_images = std::path::Path::new(space_node_manager::FORK_IMAGE_ROOT);
        for entry in read_dir_names(fork_images) {
            if let Some(memory) = crate::fork::ForkImage::memory_of(&entry, &prefix) {
                let _ = inner.nm.forget_memory_image(&memory);
                let _ = inner.nm.remove_run_dir(&fork_images.join(entry));
            }
        }
        // Pool disks of members (they never survive a restart), but not those of VMs that
        // became sandboxes: their QEMU still refers to the disk by that path.
        for entry in read_dir_names(&inner.pool_dir()) {
            if !live_vms.contains(&entry) {
                if let Err(e) = inner.nm.remove_run_dir(&inner.pool_dir().join(&entry)) {
                    tracing::warn!(member = %entry, error = %e, "cannot remove leftover pool disk");
                }
            }
        }
        inner.sweep_vm_networks(&live_vms);
    }
}

/// Names in a directory (none if it cannot be read).
fn read_dir_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Watches a sandbox's VM (and its channel, when connected) until the VM exits or the
/// channel breaks. A VM that exits is restored or failed, as the sandbox's crash policy
/// says; a channel that breaks under a running VM is opened afresh
/// ([`Node::reconnect_channel`]).
async fn watch(node: Weak<Inner>, id: SandboxId, vm: Arc<Vm>, guest: Option<GuestClient>) {
    let channel_closed = async {
        match &guest {
            Some(g) => g.closed().await,
            None => std::future::pending().await,
        }
    };
    let reason = tokio::select! {
        exit = vm.exited() => format!("VM exited: {}", exit.reason),
        err = channel_closed => {
            // A dying guest usually drops the channel a moment before the VM exits; the
            // exit says more about why, so give it a little time.
            match tokio::time::timeout(EXIT_AFTER_CHANNEL_LOSS, vm.exited()).await {
                Ok(exit) => format!("VM exited: {} (the daemon channel closed first: {err})", exit.reason),
                Err(_) => {
                    let Some(inner) = node.upgrade() else { return };
                    let node = Node { inner };
                    // In its own task: the fresh session replaces this watcher (and aborts it).
                    tokio::spawn(async move { node.reconnect_channel(&id, &err.to_string()).await });
                    return;
                }
            }
        }
    };
    let Some(inner) = node.upgrade() else { return };
    let record = inner.lock().get(&id).map(|e| e.record.clone());
    let Some(record) = record else { return };
    if !matches!(record.state, SandboxState::Running | SandboxState::Paused) {
        // An operation owns the VM right now (it replaces or stops it on purpose).
        return;
    }
    let node = Node { inner };
    if record.on_crash == crate::CrashPolicy::Restore && record.state == SandboxState::Running {
        tracing::warn!(%id, %reason, "sandbox crashed; restoring it");
        // In its own task: the restore replaces this watcher (and aborts it).
        tokio::spawn(async move { node.restore_after_crash(&id, vm, reason).await });
    } else {
        tracing::warn!(%id, %reason, "sandbox failed");
        node.inner.fail(&id, Some(vm.as_ref()), &reason).await;
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Entry>> {
        // A panic while holding this lock is a bug; the map itself stays consistent
        // because every mutation is a single insert/update.
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Name of the VM backing a sandbox (the sandbox id unless it came from the pool).
    pub(crate) fn vm_name(&self, id: &SandboxId) -> String {
        self.lock()
            .get(id)
            .map(|e| e.record.vm_name().to_owned())
            .unwrap_or_else(|| id.to_string())
    }

    /// Run directory of the VM backing a sandbox.
    pub(crate) fn run_dir(&self, id: &SandboxId) -> PathBuf {
        self.vm_run_dir(&self.vm_name(id))
    }

    /// Forgets the record of deleted sandbox `id` (a suspended sandbox coming back to the
    /// node that freed it takes its id again). `false`: there is none, or it is not deleted.
    pub(crate) fn forget_deleted(&self, id: &SandboxId) -> bool {
        let mut map = self.lock();
        if !map
            .get(id)
            .is_some_and(|e| e.record.state == SandboxState::Deleted)
        {
            return false;
        }
        map.remove(id);
        true
    }

    /// Checks capacity and inserts a new `creating` record, atomically.
    pub(crate) fn admit(
        &self,
        record: SandboxRecord,
    ) -> Result<Arc<tokio::sync::Mutex<()>>, NodeError> {
        let mut map = self.lock();
        if map.contains_key(&record.id) {
            return Err(NodeError::SandboxExists(record.id));
        }
        self.capacity
            .admit(&used_by(&map), &record.resources)
            .map_err(NodeError::Capacity)?;
        self.records
            .save(&record)
            .map_err(|e| internal("cannot persist sandbox record", e))?;
        let entry = Entry::new(record);
        let op = entry.op.clone();
        map.insert(entry.record.id.clone(), entry);
        Ok(op)
    }

    /// Checks the node can give a sandbox that holds no compute (stopped) its vCPUs and
    /// memory again.
    pub(crate) fn admit_compute(&self, id: &SandboxId) -> Result<(), NodeError> {
        let map = self.lock();
        let entry = map
            .get(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        if entry.record.state.holds_compute() {
            return Ok(());
        }
        self.capacity
            .admit(&used_by(&map), &entry.record.resources)
            .map_err(NodeError::Capacity)
    }

    /// Applies `event` through the lifecycle table, lets `edit` adjust the record, persists it.
    pub(crate) fn transition(
        &self,
        id: &SandboxId,
        event: SandboxEvent,
        edit: impl FnOnce(&mut SandboxRecord),
    ) -> Result<SandboxRecord, NodeError> {
        self.transition_noted(id, event, None, edit)
    }

    /// [`Inner::transition`] with a detail for the event log.
    pub(crate) fn transition_noted(
        &self,
        id: &SandboxId,
        event: SandboxEvent,
        detail: Option<String>,
        edit: impl FnOnce(&mut SandboxRecord),
    ) -> Result<SandboxRecord, NodeError> {
        let mut map = self.lock();
        let entry = map
            .get_mut(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let mut next = entry.record.clone();
        next.state = entry.record.state.apply(event)?;
        edit(&mut next);
        self.records
            .save(&next)
            .map_err(|e| internal("cannot persist sandbox record", e))?;
        tracing::debug!(%id, from = %entry.record.state, to = %next.state, "transition");
        let from = entry.record.state;
        entry.record = next.clone();
        drop(map);
        let detail = detail.or_else(|| {
            (next.state == SandboxState::Failed)
                .then(|| next.failure_reason.clone())
                .flatten()
                .map(|r| r.lines().next().unwrap_or_default().to_owned())
        });
        self.events.append(space_core::LifecycleEntry {
            sandbox_id: id.clone(),
            at_ms: now_ms(),
            event,
            from,
            to: next.state,
            detail,
        });
        Ok(next)
    }

    pub(crate) fn set_pid(&self, id: &SandboxId, pid: u32) -> Result<(), NodeError> {
        let mut map = self.lock();
        let entry = map
            .get_mut(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        entry.record.vmm_pid = Some(pid);
        self.records
            .save(&entry.record)
            .map_err(|e| internal("cannot persist sandbox record", e))
    }

    /// Kills the VM (if any) and marks the sandbox failed with `reason` plus the console tail.
    /// The disk and console log stay until the sandbox is deleted.
    pub(crate) async fn fail(&self, id: &SandboxId, vm: Option<&Vm>, reason: &str) {
        if let Some(vm) = vm {
            if let Err(e) = self.nm.kill_vm(vm).await {
                tracing::error!(%id, error = %e, "cannot kill VM of failed sandbox");
            }
        }
        let console = space_vmm::console_tail(
            &space_vmm::VmPaths::new(&self.run_dir(id)).console_log,
            FAILURE_CONSOLE_TAIL,
        )
        .unwrap_or_default();
        let full = if console.trim().is_empty() {
            reason.to_owned()
        } else {
            format!("{reason}\n--- console tail ---\n{console}")
        };
        {
            let mut map = self.lock();
            if let Some(e) = map.get_mut(id) {
                if let Some(m) = e.monitor.take() {
                    m.abort();
                }
                e.guest = None;
                e.vm = None;
                e.gateway = None;
            }
        }
        if let Err(e) = self.transition(id, SandboxEvent::Fail, |r| {
            r.failure_reason = Some(full);
            r.vmm_pid = None;
        }) {
            tracing::warn!(%id, error = %e, "cannot mark sandbox failed");
        }
    }

    /// Kills the VM (if any), moves the sandbox's persistent snapshots out, and removes
    /// its files. Repeated after a crash, it moves the snapshots not yet moved.
    pub(crate) async fn teardown(
        &self,
        id: &SandboxId,
        vm: Option<Arc<Vm>>,
    ) -> Result<(), NodeError> {
        self.discard_vms(id, vm).await?;
        self.persist_snapshots(id)?;
        self.nm
            .remove_sandbox_files(&self.store, id, &self.run_dir(id))?;
        Ok(())
    }

    /// Kills `vm` (if given) and every VM that may belong to the sandbox: the one its
    /// record names and one under its own id that an interrupted operation may have started
    /// while the record still named another VM (e.g. a rollback of a sandbox that came from
    /// the pool, interrupted by a node crash). Each is adopted if it can be; one whose
    /// starter died before its pidfile or QMP existed is found by its command line. Their
    /// run directories go, and so does a pool VM's first name for its disk.
    pub(crate) async fn discard_vms(
        &self,
        id: &SandboxId,
        vm: Option<Arc<Vm>>,
    ) -> Result<(), NodeError> {
        if let Some(vm) = vm {
            self.nm.kill_vm(&vm).await?;
        }
        // Its sockets keep the namespace alive: close them before it is removed.
        if let Some(e) = self.lock().get_mut(id) {
            e.gateway = None;
        }
        let mut names = vec![self.vm_name(id)];
        if names[0] != id.as_str() {
            names.push(id.to_string());
        }
        for name in names {
            let run_dir = self.vm_run_dir(&name);
            if let Ok(vm) = self.nm.adopt_vm(&name, &run_dir).await {
                self.nm.kill_vm(&vm).await?;
            }
            self.nm.kill_stray_vms(&name, &self.run_root).await?;
            self.nm.remove_run_dir(&run_dir)?;
            self.nm.remove_run_dir(&self.pool_dir().join(&name))?;
            self.drop_vm_network(&name);
        }
        Ok(())
    }
}

/// Capacity held by the sandboxes in `map` (those whose state holds resources).
fn used_by(map: &HashMap<SandboxId, Entry>) -> NodeCapacity {
    NodeCapacity::sum(
        map.values()
            .filter(|e| e.record.state.holds_compute())
            .map(|e| &e.record.resources),
    )
}

fn fs_size(path: &Path) -> u64 {
    nix::sys::statvfs::statvfs(path)
        .map(|s| s.blocks() * s.fragment_size())
        .unwrap_or(0)
}

/// The node's egress ceiling: the operator's grants, and the addresses of this host (the
/// network the gateways connect out from). The node's default policy must lie within it.
fn egress_ceiling(cfg: &NodeConfig) -> Result<Arc<space_core::egress::EgressCeiling>, NodeError> {
    let addresses = space_net::uplink::interface_addresses();
    let ceiling = space_core::egress::EgressCeiling::new(cfg.egress_grants.clone(), addresses)
        .map_err(|e| NodeError::Invalid(format!("bad egress grant: {e}")))?;
    ceiling.check(&cfg.egress)?;
    Ok(Arc::new(ceiling))
}

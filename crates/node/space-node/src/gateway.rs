//! The egress gateway of each sandbox: a DNS resolver, the transparent proxy and the UDP
//! relay (UDP only to addresses a CIDR rule allows), listening
//! on the gateway address inside the sandbox VM's network namespace, connecting out through
//! the node's uplink. Started whenever a VM becomes a sandbox's (create, start, restore,
//! fork, re-adoption); dropped with the VM.
//!
//! The gateway enforces the sandbox's egress policy (held in a [`PolicyHandle`] that
//! [`crate::Node::set_egress_policy`] swaps while it runs), signs intercepted TLS with the
//! sandbox's own CA ([`crate::sandbox_ca`]) and injects the node's credentials for the
//! sandbox's tenant, project and id.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use space_core::egress::EgressPolicy;
use space_core::SandboxId;
use space_net::ca::LeafCache;
use space_net::dns::{PinLimits, PinTable, PolicyHandle, SandboxResolver};
use space_net::proxy::{upstream_tls_config, ProxyContext, ProxyLimits, SandboxProxy};
use space_net::udp::{UdpLimits, UdpRelay};
use space_net::uplink::NetnsUplink;
use space_node_manager::UplinkSocketKind;
use tokio::task::AbortHandle;

use crate::sandbox_manager::Inner;
use crate::{NodeError, SandboxRecord};

/// A running gateway; its tasks stop when it is dropped.
pub(crate) struct Gateway {
    /// The VM whose namespace it listens in.
    pub(crate) vm_name: String,
    /// The policy it enforces, swapped in place on an update.
    pub(crate) policy: PolicyHandle,
    tasks: Vec<AbortHandle>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What every gateway of the node shares: the uplink and the upstream TLS configuration.
pub(crate) struct GatewayShared {
    uplink: Arc<NetnsUplink>,
    upstream_tls: Arc<rustls::ClientConfig>,
}

/// The node's [`GatewayShared`], made on first use.
pub(crate) type GatewayCell = OnceLock<GatewayShared>;

impl Inner {
    fn gateway_shared(&self) -> Result<&GatewayShared, NodeError> {
        if let Some(s) = self.gateway_shared.get() {
            return Ok(s);
        }
        // The kernel's layer first: no uplink socket exists before the guard does.
        self.nm.guard_uplink(
            &self.cfg.uplink_netns,
            self.egress_ceiling.granted(),
            self.egress_ceiling.node_addresses(),
        )?;
        let uplink = NetnsUplink::start(
            self.cfg.uplink_netns.as_deref(),
            &self.cfg.upstream_dns,
            self.egress_ceiling.clone(),
            Arc::new(UplinkSocketsFromNodeManager::new(
                self.nm.clone(),
                self.cfg.uplink_netns.clone(),
            )),
        )
        .map_err(|e| NodeError::Internal(format!("cannot start the uplink: {e}")))?;
        let upstream_tls = upstream_tls_config(&self.cfg.upstream_extra_roots()?)
            .map_err(|e| NodeError::Internal(format!("upstream TLS: {e}")))?;
        // Two first users may race: one wins, the other's uplink is dropped (its thread ends).
        Ok(self.gateway_shared.get_or_init(|| GatewayShared {
            uplink: Arc::new(uplink),
            upstream_tls,
        }))
    }

    /// Starts the gateway of the sandbox of `record` in the namespace of VM `vm_name`.
    pub(crate) fn start_gateway(
        &self,
        record: &SandboxRecord,
        vm_name: &str,
    ) -> Result<Gateway, NodeError> {
        let id = &record.id;
        let ns = self.netns_name(vm_name);
        let sockets = self.nm.open_gateway_sockets(&ns)?;
        let io = |e: std::io::Error| NodeError::Internal(format!("gateway socket: {e}"));
        let udp = tokio::net::UdpSocket::from_std(sockets.dns_udp).map_err(io)?;
        let dns_tcp = tokio::net::TcpListener::from_std(sockets.dns_tcp).map_err(io)?;
        let proxy = tokio::net::TcpListener::from_std(sockets.proxy).map_err(io)?;
        let relay_socket = sockets.udp_relay;

        let shared = self.gateway_shared()?;
        let uplink = shared.uplink.clone();
        let policy: PolicyHandle = Arc::new(ArcSwap::from_pointee(record.egress.clone()));
        let pins = Arc::new(PinTable::new(PinLimits::default()));
        let resolver = Arc::new(SandboxResolver::new(
            id.clone(),
            policy.clone(),
            pins.clone(),
            uplink.clone(),
        ));
        let ca = self.sandbox_cas.load_or_create(id)?;
        // A sandbox without an owner (made before records had one) gets no credentials.
        let (tenant, credentials) = match &record.tenant {
            Some(t) => (t.clone(), Some(self.credentials.manager.clone())),
            None => (space_core::TenantId::generate(), None),
        };
        let proxy_srv = Arc::new(SandboxProxy::new(
            ProxyContext {
                sandbox: id.clone(),
                project: record.project.clone(),
                inherited_from: record.inherited_from.clone(),
                policy: policy.clone(),
                pins,
                leaves: Arc::new(LeafCache::new(ca)),
                credentials,
                upstream_tls: shared.upstream_tls.clone(),
                limits: ProxyLimits::default(),
                tenant_connections: self.tenant_connections.of(&tenant),
                tenant,
            },
            uplink,
        ));
        let relay = Arc::new(UdpRelay::new(
            id.clone(),
            Arc::new(FlowsThroughNodeManager {
                nm: self.nm.clone(),
                netns: ns.clone(),
            }),
            policy.clone(),
            shared.uplink.clone(),
            UdpLimits::default(),
        ));
        let tasks = vec![
            tokio::spawn(resolver.serve(udp, dns_tcp)).abort_handle(),
            tokio::spawn(proxy_srv.serve(proxy)).abort_handle(),
            tokio::spawn(relay.serve(relay_socket)).abort_handle(),
        ];
        tracing::debug!(%id, netns = %ns, "gateway started");
        Ok(Gateway {
            vm_name: vm_name.to_owned(),
            policy,
            tasks,
        })
    }
}

/// The uplink's sockets, made and marked by the node manager in the uplink namespace, a
/// batch at a time (one round trip per [`UPLINK_SOCKET_BATCH`] connections).
struct UplinkSocketsFromNodeManager {
    nm: Arc<dyn space_node_manager::NodeManager>,
    netns: space_node_manager::UplinkNetns,
    spare: std::sync::Mutex<std::collections::HashMap<UplinkSocketKind, Vec<std::os::fd::OwnedFd>>>,
}

/// Sockets asked for at once.
const UPLINK_SOCKET_BATCH: usize = space_node_manager::MAX_UPLINK_SOCKETS;

impl UplinkSocketsFromNodeManager {
    fn new(
        nm: Arc<dyn space_node_manager::NodeManager>,
        netns: space_node_manager::UplinkNetns,
    ) -> Self {
        Self {
            nm,
            netns,
            spare: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }
}

impl space_net::uplink::UplinkSockets for UplinkSocketsFromNodeManager {
    fn socket(&self, kind: UplinkSocketKind) -> std::io::Result<std::os::fd::OwnedFd> {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        let pool = spare.entry(kind).or_default();
        if pool.is_empty() {
            *pool = self
                .nm
                .open_uplink_sockets(&self.netns, kind, UPLINK_SOCKET_BATCH)
                .map_err(std::io::Error::other)?;
        }
        pool.pop()
            .ok_or_else(|| std::io::Error::other("the node manager made no uplink socket"))
    }
}

/// The UDP relay's flow sockets, opened by the node manager in the sandbox's namespace.
struct FlowsThroughNodeManager {
    nm: Arc<dyn space_node_manager::NodeManager>,
    netns: String,
}

impl space_net::udp::FlowSockets for FlowsThroughNodeManager {
    fn open(
        &self,
        dst: std::net::SocketAddrV4,
        guest: std::net::SocketAddrV4,
    ) -> std::io::Result<std::net::UdpSocket> {
        self.nm
            .open_udp_flow(&self.netns, dst, guest)
            .map_err(std::io::Error::other)
    }
}

impl Inner {
    /// The sandbox CA the guest of sandbox `id` is configured to trust (with a network).
    pub(crate) fn guest_trust(&self, id: &SandboxId) -> Result<Option<String>, NodeError> {
        if !self.cfg.sandbox_network {
            return Ok(None);
        }
        Ok(Some(
            self.sandbox_cas.load_or_create(id)?.cert_pem().to_owned(),
        ))
    }

    /// The placeholders a process started now in sandbox `id` gets in its environment: one
    /// per credential visible to it that asks for one, under the credential's name, unless
    /// the sandbox's own env sets that name. Computed at each start, never configured once:
    /// a credential created after the sandbox started is there for the next process, and a
    /// fork child (or a sandbox restored from another's checkpoint) gets its own, not the
    /// ones of the sandbox its memory came from.
    pub(crate) fn placeholder_env(
        &self,
        id: &SandboxId,
    ) -> Result<BTreeMap<String, String>, NodeError> {
        // Only what it needs, out of the lock: a process start is frequent, a record large.
        let (tenant, project, env) = self
            .lock()
            .get(id)
            .map(|e| {
                let r = &e.record;
                (r.tenant.clone(), r.project.clone(), r.env.clone())
            })
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let Some(tenant) = &tenant else {
            return Ok(BTreeMap::new());
        };
        Ok(self
            .credentials
            .manager
            .placeholders(tenant, project.as_ref(), id)
            .into_iter()
            // Credential names allow '-', which no shell accepts in a variable name.
            .filter(|(name, _)| {
                space_core::process::valid_env_key(name.as_str())
                    && !env.contains_key(name.as_str())
            })
            .map(|(name, placeholder)| (name.as_str().to_owned(), placeholder.as_str().to_owned()))
            .collect())
    }
}

impl crate::Node {
    /// What the node adds to the environment of a process about to start in sandbox `id`
    /// (below the process's own env): its credential placeholders, see
    /// [`Inner::placeholder_env`].
    pub fn process_env(&self, id: &SandboxId) -> Result<BTreeMap<String, String>, NodeError> {
        self.inner.placeholder_env(id)
    }

    /// The most egress connections every tenant without a limit of its own may hold open
    /// across its sandboxes on this node (`None`: unlimited); see [`TenantConnectionLimits`].
    ///
    /// [`TenantConnectionLimits`]: space_net::proxy::tenant_connections::TenantConnectionLimits
    pub fn set_default_tenant_connections(&self, limit: Option<u64>) {
        self.inner.tenant_connections.set_default(limit);
    }

    /// Sets (`Some`, `Some(None)` for unlimited) or clears (`None`: the default applies) the
    /// tenant's own limit of open egress connections on this node; connections already open
    /// stay, new ones are refused until the tenant is under it.
    pub fn set_tenant_connections(
        &self,
        tenant: &space_core::TenantId,
        limit: Option<Option<u64>>,
    ) {
        self.inner.tenant_connections.set_own(tenant, limit);
    }

    /// Replaces the sandbox's egress policy: saved in its record, then enforced by its
    /// running gateway from the next DNS query or connection on (connections already open
    /// keep going; a proxy re-checks every new one).
    pub fn set_egress_policy(
        &self,
        id: &SandboxId,
        policy: EgressPolicy,
    ) -> Result<SandboxRecord, NodeError> {
        policy
            .validate()
            .map_err(|e| NodeError::Invalid(format!("bad egress policy: {e}")))?;
        self.inner.egress_ceiling.check(&policy)?;
        let mut map = self.inner.lock();
        let entry = map
            .get_mut(id)
            .filter(|e| e.record.state != space_core::SandboxState::Deleted)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let mut record = entry.record.clone();
        record.egress = policy.clone();
        self.inner
            .records
            .save(&record)
            .map_err(|e| NodeError::Internal(format!("cannot save the record: {e}")))?;
        entry.record = record.clone();
        if let Some(gateway) = &entry.gateway {
            gateway.policy.store(Arc::new(policy));
        }
        tracing::info!(%id, mode = ?record.egress.mode, rules = record.egress.rules.len(), "egress policy updated");
        Ok(record)
    }

    /// The node's credential manager (secrets are managed through it; values never leave it
    /// except into a gateway's upstream request).
    pub fn credentials(&self) -> &Arc<space_secrets::CredentialManager> {
        &self.inner.credentials.manager
    }

    /// Credential decisions matching `filter`, newest first.
    pub fn audit(
        &self,
        filter: &space_secrets::AuditFilter,
    ) -> Result<Vec<space_secrets::AuditEvent>, NodeError> {
        self.inner
            .credentials
            .audit
            .query(filter)
            .map_err(|e| NodeError::Internal(format!("cannot read the audit log: {e}")))
    }
}

//! The egress gateway of each sandbox: a DNS resolver and the transparent proxy, listening
//! on the gateway address inside the sandbox VM's network namespace, connecting out through
//! the node's uplink. Started whenever a VM becomes a sandbox's (create, start, restore,
//! fork, re-adoption); dropped with the VM.
//!
//! Not wired yet (issue 4): per-sandbox policies from the API (every sandbox gets the node's
//! `egress` policy), the sandbox CA in the guest's trust store (so TLS termination is not
//! trusted by the guest yet), credentials.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use space_core::SandboxId;
use space_net::ca::{LeafCache, SandboxCa};
use space_net::datapath::{netns, GuestLink};
use space_net::dns::{PinLimits, PinTable, SandboxResolver};
use space_net::proxy::{upstream_tls_config, ProxyContext, ProxyLimits, SandboxProxy};
use space_net::uplink::NetnsUplink;
use tokio::task::AbortHandle;

use crate::sandbox_manager::Inner;
use crate::NodeError;

/// A running gateway; its tasks stop when it is dropped.
pub(crate) struct Gateway {
    /// The VM whose namespace it listens in.
    pub(crate) vm_name: String,
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
        let uplink = NetnsUplink::start(self.cfg.uplink_netns.as_deref(), &self.cfg.upstream_dns)
            .map_err(|e| NodeError::Internal(format!("cannot start the uplink: {e}")))?;
        let upstream_tls = upstream_tls_config(&self.cfg.upstream_extra_roots()?)
            .map_err(|e| NodeError::Internal(format!("upstream TLS: {e}")))?;
        // Two first users may race: one wins, the other's uplink is dropped (its thread ends).
        Ok(self.gateway_shared.get_or_init(|| GatewayShared {
            uplink: Arc::new(uplink),
            upstream_tls,
        }))
    }

    /// Starts the gateway of sandbox `id` in the namespace of VM `vm_name`.
    pub(crate) fn start_gateway(
        &self,
        id: &SandboxId,
        vm_name: &str,
    ) -> Result<Gateway, NodeError> {
        let link = GuestLink::default();
        let ns = self.netns_name(vm_name);
        let gw = link.gateway;
        let proxy_port = link.proxy_port;
        let (udp, dns_tcp, proxy) = netns::run_in(&ns, move || {
            let udp = std::net::UdpSocket::bind((gw, 53))?;
            let dns_tcp = std::net::TcpListener::bind((gw, 53))?;
            let proxy = std::net::TcpListener::bind(SocketAddr::from((gw, proxy_port)))?;
            for s in [&dns_tcp, &proxy] {
                s.set_nonblocking(true)?;
            }
            udp.set_nonblocking(true)?;
            Ok((udp, dns_tcp, proxy))
        })
        .map_err(|e| NodeError::Internal(format!("cannot open the gateway sockets: {e}")))?;
        let io = |e: std::io::Error| NodeError::Internal(format!("gateway socket: {e}"));
        let udp = tokio::net::UdpSocket::from_std(udp).map_err(io)?;
        let dns_tcp = tokio::net::TcpListener::from_std(dns_tcp).map_err(io)?;
        let proxy = tokio::net::TcpListener::from_std(proxy).map_err(io)?;

        let shared = self.gateway_shared()?;
        let uplink = shared.uplink.clone();
        let policy = Arc::new(ArcSwap::from_pointee(self.cfg.egress.clone()));
        let pins = Arc::new(PinTable::new(PinLimits::default()));
        let resolver = Arc::new(SandboxResolver::new(
            id.clone(),
            policy.clone(),
            pins.clone(),
            uplink.clone(),
        ));
        let ca = SandboxCa::generate(id.as_str())
            .map_err(|e| NodeError::Internal(format!("cannot make the sandbox CA: {e}")))?;
        let proxy_srv = Arc::new(SandboxProxy::new(
            ProxyContext {
                sandbox: id.clone(),
                tenant: self.gateway_tenant.clone(),
                project: None,
                policy,
                pins,
                leaves: Arc::new(LeafCache::new(Arc::new(ca))),
                credentials: None,
                upstream_tls: shared.upstream_tls.clone(),
                limits: ProxyLimits::default(),
            },
            uplink,
        ));
        let tasks = vec![
            tokio::spawn(resolver.serve(udp, dns_tcp)).abort_handle(),
            tokio::spawn(proxy_srv.serve(proxy)).abort_handle(),
        ];
        tracing::debug!(%id, netns = %ns, "gateway started");
        Ok(Gateway {
            vm_name: vm_name.to_owned(),
            tasks,
        })
    }
}

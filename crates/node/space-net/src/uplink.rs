//! The gateway's way out: outbound TCP connections and upstream DNS lookups made from the
//! uplink network namespace (the host's by default; a test's isolated "internet" in tests),
//! never from a sandbox's.
//!
//! Every connection and flow it opens must lie within the node's egress ceiling
//! ([`EgressCeiling`]): whatever a sandbox's policy decided, the uplink itself refuses
//! loopback, private, link-local and metadata addresses and the node's own addresses
//! (unless the operator granted them), so a bug in a decision is not enough to reach them.
//!
//! Below both checks, the kernel refuses the same: every socket the uplink connects or
//! sends with comes from [`UplinkSockets`] — made by the node manager in the uplink
//! namespace and marked, so that the uplink guard's nftables table there rejects what the
//! ceiling forbids ([`crate::datapath::uplink_guard`]).
//!
//! A socket belongs for good to the namespace of the thread that created it. The upstream
//! DNS resolver makes its sockets itself, so the uplink runs one thread that entered the
//! uplink namespace and drives a small runtime of its own for lookups. Connections need no
//! such thread: their sockets come made in the namespace, and connect from any runtime.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::RecordType;
use space_core::egress::{EgressCeiling, Hostname};

use crate::datapath::uplink_guard::UplinkSocketKind;
use crate::datapath::{netns, NetError};
use crate::dns::{HickoryUpstream, Upstream, UpstreamAddr, UpstreamError};
use crate::proxy::{ConnectFuture, Uplink};

/// How long an outbound connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the uplink's sockets come from: made in the uplink namespace, unconnected and
/// non-blocking, marked for the uplink guard.
pub trait UplinkSockets: Send + Sync {
    /// A new socket of `kind`.
    fn socket(&self, kind: UplinkSocketKind) -> std::io::Result<OwnedFd>;
}

/// The uplink: sockets from [`UplinkSockets`], and a runtime on a thread inside the uplink
/// namespace for upstream DNS.
#[derive(Clone)]
pub struct NetnsUplink {
    handle: tokio::runtime::Handle,
    resolver: Arc<HickoryUpstream>,
    /// What no connection may reach.
    ceiling: Arc<EgressCeiling>,
    /// Where sockets come from.
    sockets: Arc<dyn UplinkSockets>,
    /// Dropping the last clone stops the uplink thread.
    _stop: Arc<tokio::sync::oneshot::Sender<()>>,
}

impl NetnsUplink {
    /// Starts the uplink in namespace `netns` (`None`: the namespace of this process), with
    /// upstream DNS servers `name_servers` (empty: those of `/etc/resolv.conf`), connecting
    /// nowhere `ceiling` forbids, with sockets from `sockets` (made in `netns`).
    pub fn start(
        netns: Option<&str>,
        name_servers: &[SocketAddr],
        ceiling: Arc<EgressCeiling>,
        sockets: Arc<dyn UplinkSockets>,
    ) -> Result<Self, NetError> {
        let ns_file = match netns {
            Some(name) => {
                Some(
                    std::fs::File::open(netns::path(name)).map_err(|e| NetError::Io {
                        what: format!("open namespace {name}"),
                        source: e,
                    })?,
                )
            }
            None => None,
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let name_servers = name_servers.to_vec();
        std::thread::Builder::new()
            .name("space-uplink".into())
            .spawn(move || {
                let started = (|| -> Result<_, NetError> {
                    if let Some(ns) = &ns_file {
                        use std::os::fd::AsFd;
                        nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                            .map_err(|e| NetError::Io {
                                what: "setns into the uplink namespace".into(),
                                source: e.into(),
                            })?;
                    }
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| NetError::Io {
                            what: "uplink runtime".into(),
                            source: e,
                        })?;
                    // The resolver's sockets are made lazily by tasks on this runtime, so
                    // inside this namespace.
                    let resolver = rt.block_on(async {
                        if name_servers.is_empty() {
                            HickoryUpstream::from_system_conf()
                        } else {
                            HickoryUpstream::with_name_servers(&name_servers)
                        }
                    });
                    Ok((rt, resolver))
                })();
                match started {
                    Ok((rt, Ok(resolver))) => {
                        let _ = ready_tx.send(Ok((rt.handle().clone(), resolver)));
                        rt.block_on(async {
                            let _ = stop_rx.await;
                        });
                    }
                    Ok((_, Err(e))) => {
                        let _ = ready_tx.send(Err(NetError::Command {
                            command: "uplink resolver".into(),
                            message: e.to_string(),
                        }));
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| NetError::Io {
                what: "spawn the uplink thread".into(),
                source: e,
            })?;
        let (handle, resolver) = ready_rx.recv().map_err(|_| NetError::Command {
            command: "uplink thread".into(),
            message: "ended before it was ready".into(),
        })??;
        Ok(NetnsUplink {
            handle,
            resolver: Arc::new(resolver),
            ceiling,
            sockets,
            _stop: Arc::new(stop_tx),
        })
    }

    /// Refuses `addr` if it lies beyond the ceiling.
    fn within_ceiling(&self, addr: SocketAddr) -> std::io::Result<()> {
        match self.ceiling.forbids(addr.ip()) {
            None => Ok(()),
            Some(forbidden) => {
                tracing::warn!(%addr, %forbidden, "egress: the uplink refused a destination beyond the egress ceiling");
                Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{addr} is beyond the egress ceiling: {forbidden}"),
                ))
            }
        }
    }

    fn run<T, F>(&self, f: F) -> impl Future<Output = Result<T, String>> + Send + 'static
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let task = self.handle.spawn(f);
        async move { task.await.map_err(|e| format!("uplink task: {e}")) }
    }
}

impl Uplink for NetnsUplink {
    fn connect(&self, addr: SocketAddr) -> ConnectFuture<'_> {
        if let Err(e) = self.within_ceiling(addr) {
            return Box::pin(async move { Err(e) });
        }
        let socket = self.sockets.socket(UplinkSocketKind::of(&addr, true));
        Box::pin(async move {
            let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(socket?));
            tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr))
                .await
                .map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
                })?
        })
    }

    fn udp(&self, addr: SocketAddr) -> crate::proxy::UdpFuture<'_> {
        if let Err(e) = self.within_ceiling(addr) {
            return Box::pin(async move { Err(e) });
        }
        let socket = self.sockets.socket(UplinkSocketKind::of(&addr, false));
        Box::pin(async move {
            let socket = std::net::UdpSocket::from(socket?);
            // Connecting binds it (to an ephemeral port) too.
            socket.connect(addr)?;
            tokio::net::UdpSocket::from_std(socket)
        })
    }
}

impl Upstream for NetnsUplink {
    fn lookup(
        &self,
        name: &Hostname,
        record_type: RecordType,
    ) -> impl Future<Output = Result<Vec<UpstreamAddr>, UpstreamError>> + Send {
        let resolver = self.resolver.clone();
        let name = name.clone();
        let fut = self.run(async move { resolver.lookup(&name, record_type).await });
        async move { fut.await.map_err(UpstreamError::Failed)? }
    }
}

/// Every address of the interfaces of this thread's network namespace (empty if they
/// cannot be listed). Of the host's namespace: the node's own addresses.
pub fn interface_addresses() -> Vec<std::net::IpAddr> {
    let Ok(ifaces) = nix::ifaddrs::getifaddrs() else {
        tracing::warn!("cannot list the interfaces' addresses");
        return Vec::new();
    };
    let mut out: Vec<std::net::IpAddr> = ifaces
        .filter_map(|i| i.address)
        .filter_map(|a| {
            a.as_sockaddr_in()
                .map(|v4| std::net::IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

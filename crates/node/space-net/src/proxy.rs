//! The gateway's transparent TCP proxy: every TCP connection a sandbox opens ends here.
//!
//! The sandbox namespace's nftables rules `REDIRECT` each guest TCP connection (to any
//! destination but the gateway) to a listener the node created inside that namespace; the
//! node hands the listener to [`SandboxProxy::serve`], which reads each connection's original
//! destination ([`original_dst`]) and runs it ([`SandboxProxy::handle`]). The proxy never
//! connects from the sandbox's namespace: every upstream socket comes from the injected
//! [`Uplink`].
//!
//! # One connection
//!
//! 1. **Sniff.** The proxy reads the first bytes (at most [`crate::sniff::MAX_SNIFF_LEN`],
//!    within [`ProxyLimits::sniff_timeout`]) and asks [`crate::sniff::Sniffer`] for the TLS
//!    ClientHello's server name or the HTTP/1 `Host`. HTTP `CONNECT` is refused (**405**).
//!    Everything else that yields no valid host name — TLS without SNI or with an IP
//!    address, an IP-literal `Host`, bytes that are neither TLS nor HTTP (an SSH banner is
//!    recognised on its first line), cleartext HTTP/2 with prior knowledge (whose host
//!    hides in HPACK-coded frames, which the proxy does not decode), a sniff error, silence —
//!    is a stream **without a name**.
//! 2. **Decide** (`route`), with the policy as it is at that moment:
//!    - *With a name*: the name must be one the resolver would answer
//!      ([`EgressPolicy::allows_name`]); the original destination address must be one the
//!      resolver pinned for that name ([`PinTable::addresses_for`]): the guest resolved the
//!      name through the gateway, as real clients do, and connected to what it was told;
//!      and the policy must allow (name, pinned address, port) ([`EgressPolicy::decide`],
//!      which also refuses non-public addresses no CIDR rule unlocks). The upstream
//!      address is that pinned address. For cleartext HTTP the `Host` port (80 when absent)
//!      must be the destination port (**421**).
//!    - *Without a name*: allowed only when a CIDR rule allows the destination address and
//!      port explicitly (`decide` with no host, allowed by a CIDR rule — not by the
//!      `denylist` default); then the proxy connects to the original destination as is.
//!      This is the only case where the guest picks the address, and only because the
//!      policy names it. Such a destination also gets [`ProxyLimits::server_first_wait`] of
//!      silence before the stream is taken as a server-speaks-first protocol.
//!
//!    A name is always judged as a name: a stream naming a host the resolver did not pin
//!    for its destination is refused even when a CIDR rule allows that address (the name
//!    is then only a claim the proxy cannot back, and credentials follow names).
//!
//!    Refusals close the connection; one whose first bytes were an HTTP/1 request gets an
//!    HTTP response first (400 malformed, 403 `egress_denied`, 405 `CONNECT`, 421 port).
//!    Each is logged at `info` with the sandbox, the host name if any and the destination,
//!    never a header value.
//! 3. **Serve.**
//!    - *Pass-through* (TLS the decision does not terminate — every matching domain rule
//!      asks for `pass_through`, or no name rule is involved — and no credential applies
//!      to, and streams without a name): connect through the uplink, replay the first
//!      bytes verbatim, splice both ways.
//!    - *Cleartext HTTP/1* is always parsed (hyper server towards the guest, hyper client
//!      towards upstream) rather than spliced: a later request on a kept-alive connection
//!      could name another `Host`, and parsing is what lets the credential manager judge
//!      every cleartext request (it refuses credentials that require TLS, and injects those
//!      that do not).
//!    - *Termination*, the default for TLS a domain rule allows, when the policy's
//!      decision asks for it ([`Decision::inspect`]) or a credential may apply to the host: TLS is accepted with a leaf of the sandbox CA
//!      ([`crate::ca::server_config`], offering `h2` and `http/1.1`), replaying the
//!      ClientHello already read; the server name rustls saw must be the sniffed one. The
//!      guest is served HTTP/2 or HTTP/1.1 by ALPN; requests go upstream over TLS verified
//!      (against [`ProxyContext::upstream_tls`]) for the sniffed name, to the pinned address.
//!
//!    Each HTTP request is checked again (`http`): its `Host` / `:authority` must be the
//!    connection's host and port (**421** otherwise), the policy must still allow it, and
//!    [`CredentialManager::authorize_request`] rewrites it (strips the guest's own
//!    credentials, injects ours, refuses TRACE and cleartext for TLS-only credentials,
//!    audits) or refuses it (**403** `{"code":"egress_denied","message":…}`). HTTP/1.1
//!    WebSocket upgrades are forwarded, then spliced; other `Upgrade`s (`h2c`) are dropped.
//!
//! # Bounds
//!
//! See [`ProxyLimits`]: open connections per sandbox (excess closed at accept), sniff and
//! TLS handshake time, upstream connect time and connection count, idle time (both ways
//! quiet closes the connection), the HTTP/1 request head ([`crate::sniff::MAX_HTTP_HEAD_LEN`],
//! [`crate::sniff::MAX_HTTP_HEADERS`]) and HTTP/2 header list and stream count. Nothing the
//! guest sends can panic the proxy; a connection's tasks end with it.
//!
//! Policy changes apply to every new connection and every new HTTP request; a spliced
//! connection already open keeps going until it closes or idles out.
//!
//! [`PinTable::addresses_for`]: crate::dns::PinTable::addresses_for
//! [`EgressPolicy::allows_name`]: space_core::egress::EgressPolicy::allows_name
//! [`EgressPolicy::decide`]: space_core::egress::EgressPolicy::decide
//! [`Decision::inspect`]: space_core::egress::Decision::inspect

mod conn;
mod first_bytes;
mod http;
mod io;
mod original_dst;
mod route;
mod scrubbed;
pub mod tenant_connections;
mod upstream;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConfig, ServerConfig};
use space_core::egress::Hostname;
use space_core::{SandboxId, TenantId};
use space_secrets::{CredentialManager, ProjectId};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::ca::{self, Alpn, LeafCache};
use crate::dns::{PinTable, PolicyHandle};
use tenant_connections::{TenantConnectionPermit, TenantConnections};

pub use first_bytes::Unnamed;
pub use original_dst::original_dst;
pub use route::Refusal;
pub use upstream::{upstream_tls_config, ConnectFuture, UdpFuture, Uplink};

/// The proxy's bounds, per sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Open guest connections; more are closed as they are accepted.
    pub max_connections: usize,
    /// Time to read enough of a connection to name its host; past it, the stream counts as
    /// one without a name.
    pub sniff_timeout: Duration,
    /// How long a connection that has sent nothing waits before it is taken as a protocol
    /// where the server speaks first (only for destinations a CIDR rule allows).
    pub server_first_wait: Duration,
    /// Time for the TLS handshake with the guest, when terminating.
    pub handshake_timeout: Duration,
    /// Time for one upstream connection: a free upstream slot, TCP, and TLS if any.
    pub connect_timeout: Duration,
    /// A connection on which no byte moved either way for this long is closed.
    pub idle_timeout: Duration,
    /// Open upstream connections of the sandbox (spliced, and those the HTTP clients pool).
    pub max_upstream_connections: usize,
    /// Concurrent HTTP/2 streams per terminated guest connection.
    pub max_h2_streams: u32,
    /// Largest HTTP/2 header list (bytes, as HTTP/2 counts them) a guest request may have.
    pub max_h2_header_list: u32,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            max_connections: 256,
            sniff_timeout: Duration::from_secs(10),
            server_first_wait: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            max_upstream_connections: 512,
            max_h2_streams: 100,
            max_h2_header_list: 64 * 1024,
        }
    }
}

/// Everything one sandbox's proxy works with.
pub struct ProxyContext {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// Its tenant (credential scopes).
    pub tenant: TenantId,
    /// Its project, if any (credential scopes).
    pub project: Option<ProjectId>,
    /// The sandboxes its memory came from (see [`RequestContext::inherited_from`]).
    pub inherited_from: Vec<SandboxId>,
    /// Its egress policy, shared with its resolver.
    pub policy: PolicyHandle,
    /// Its pins, shared with its resolver.
    pub pins: Arc<PinTable>,
    /// Leaves of its CA, for TLS termination.
    pub leaves: Arc<LeafCache>,
    /// The node's credential manager; `None`: no injection (and cleartext and terminated
    /// requests are forwarded as they are).
    pub credentials: Option<Arc<CredentialManager>>,
    /// How upstream TLS is verified ([`upstream_tls_config`]); the proxy sets ALPN itself.
    pub upstream_tls: Arc<ClientConfig>,
    /// Bounds.
    pub limits: ProxyLimits,
    /// The tenant's open connections on this node, shared by all its sandboxes' proxies.
    pub tenant_connections: Arc<TenantConnections>,
}

impl std::fmt::Debug for ProxyContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyContext")
            .field("sandbox", &self.sandbox)
            .field("tenant", &self.tenant)
            .field("project", &self.project)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Why a connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The proxy refused it (already logged and counted).
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    /// Connecting or writing upstream failed.
    #[error("upstream: {0}")]
    Upstream(#[source] std::io::Error),
    /// Reading from or writing to the guest failed.
    #[error("guest connection: {0}")]
    Io(#[source] std::io::Error),
}

/// The proxy's counters for one sandbox, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Guest connections accepted (or handed to [`SandboxProxy::handle`]).
    pub connections_accepted: u64,
    /// Guest connections refused (the connection limit included).
    pub connections_refused: u64,
    /// Bytes read from the guest (on the wire, TLS included).
    pub bytes_up: u64,
    /// Bytes written to the guest.
    pub bytes_down: u64,
    /// HTTP requests seen on parsed connections.
    pub requests: u64,
    /// HTTP requests the proxy answered itself with an error (400, 403, 405, 421, 502).
    pub requests_refused: u64,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    requests: AtomicU64,
    requests_refused: AtomicU64,
}

fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
}

impl Counters {
    fn add_accepted(&self) {
        add(&self.accepted, 1);
    }
    fn add_refused(&self) {
        add(&self.refused, 1);
    }
    fn add_up(&self, n: usize) {
        add(&self.bytes_up, n);
    }
    fn add_down(&self, n: usize) {
        add(&self.bytes_down, n);
    }
    fn add_request(&self) {
        add(&self.requests, 1);
    }
    fn add_request_refused(&self) {
        add(&self.requests_refused, 1);
    }

    fn snapshot(&self) -> ProxyStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProxyStats {
            connections_accepted: get(&self.accepted),
            connections_refused: get(&self.refused),
            bytes_up: get(&self.bytes_up),
            bytes_down: get(&self.bytes_down),
            requests: get(&self.requests),
            requests_refused: get(&self.requests_refused),
        }
    }
}

/// What every connection of the sandbox shares.
struct Shared {
    sandbox: SandboxId,
    tenant: TenantId,
    project: Option<ProjectId>,
    inherited_from: Vec<SandboxId>,
    policy: PolicyHandle,
    pins: Arc<PinTable>,
    credentials: Option<Arc<CredentialManager>>,
    limits: ProxyLimits,
    uplink: Arc<dyn Uplink>,
    /// The terminating TLS configuration (built once, so sessions resume), or why not.
    server_tls: Result<Arc<ServerConfig>, String>,
    /// Upstream TLS offering `http/1.1`, for HTTP/1.1 guests.
    upstream_h1: Arc<ClientConfig>,
    /// Upstream TLS offering `h2` then `http/1.1`, for HTTP/2 guests.
    upstream_h2: Arc<ClientConfig>,
    connections: Arc<Semaphore>,
    tenant_connections: Arc<TenantConnections>,
    upstream_slots: Arc<Semaphore>,
    counters: Arc<Counters>,
}

impl Shared {
    /// Whether a credential visible to this sandbox (the most specific scope per name) names
    /// `host` among its host patterns, expired ones included: requests to that host must be
    /// judged, and refused, rather than pass through without them. See
    /// [`CredentialManager::applies_to_host`] (in memory: no fetch, audit or rate-limit token).
    fn credentials_may_apply(&self, host: &Hostname) -> bool {
        self.credentials.as_ref().is_some_and(|manager| {
            manager.applies_to_host(&self.tenant, self.project.as_ref(), &self.sandbox, host)
        })
    }
}

/// One sandbox's transparent proxy (see the module docs).
pub struct SandboxProxy {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SandboxProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxProxy")
            .field("sandbox", &self.shared.sandbox)
            .field("limits", &self.shared.limits)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl SandboxProxy {
    /// The proxy of `ctx.sandbox`, connecting out through `uplink`.
    pub fn new(ctx: ProxyContext, uplink: Arc<dyn Uplink>) -> Self {
        let server_tls =
            ca::server_config(Arc::clone(&ctx.leaves), &[Alpn::H2, Alpn::Http11]).map_err(|e| {
                warn!(sandbox = %ctx.sandbox, error = %e, "egress: no TLS termination for this sandbox");
                e.to_string()
            });
        let upstream_h1 = upstream::with_alpn(&ctx.upstream_tls, &[Alpn::Http11.id()]);
        let upstream_h2 =
            upstream::with_alpn(&ctx.upstream_tls, &[Alpn::H2.id(), Alpn::Http11.id()]);
        let limits = ctx.limits;
        SandboxProxy {
            shared: Arc::new(Shared {
                sandbox: ctx.sandbox,
                tenant: ctx.tenant,
                project: ctx.project,
                inherited_from: ctx.inherited_from,
                policy: ctx.policy,
                pins: ctx.pins,
                credentials: ctx.credentials,
                uplink,
                server_tls,
                upstream_h1,
                upstream_h2,
                connections: Arc::new(Semaphore::new(limits.max_connections.max(1))),
                tenant_connections: ctx.tenant_connections,
                upstream_slots: Arc::new(Semaphore::new(limits.max_upstream_connections.max(1))),
                counters: Arc::default(),
                limits,
            }),
        }
    }

    /// The sandbox served.
    pub fn sandbox(&self) -> &SandboxId {
        &self.shared.sandbox
    }

    /// The counters so far.
    pub fn stats(&self) -> ProxyStats {
        self.shared.counters.snapshot()
    }

    /// Accepts guest connections on `listener` (created by the node inside the sandbox's
    /// namespace, where nftables redirects guest TCP to it) until the future is dropped or
    /// its task aborted; the connection tasks end with it. Each connection's original
    /// destination is read with [`original_dst`]; one without (not redirected) is closed.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let mut tasks = JoinSet::new();
        loop {
            tokio::select! {
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let dst = match original_dst(&stream) {
                            Ok(dst) => dst,
                            Err(e) => {
                                self.shared.counters.add_accepted();
                                let local = stream.local_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
                                let _ = conn::refused(&self.shared, local, None, Refusal::NoOriginalDestination(e.to_string()));
                                continue;
                            }
                        };
                        let Ok(permit) = self.admit(dst) else { continue };
                        let shared = Arc::clone(&self.shared);
                        tasks.spawn(async move {
                            let _permit = permit;
                            let _ = conn::run(&shared, stream, dst).await;
                        });
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: do not spin.
                        debug!(sandbox = %self.shared.sandbox, error = %e, "egress: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
            }
        }
    }

    /// Runs one guest connection whose original destination is `original_dst`, to its end
    /// (what [`SandboxProxy::serve`] does for each accepted connection; tests call it
    /// directly). Refusals are logged, counted and returned.
    pub async fn handle(
        &self,
        guest: TcpStream,
        original_dst: SocketAddr,
    ) -> Result<(), ProxyError> {
        let _permit = self.admit(original_dst)?;
        conn::run(&self.shared, guest, original_dst).await
    }

    /// Counts a new connection and takes one of the sandbox's connection slots and one of
    /// its tenant's for it.
    fn admit(&self, dst: SocketAddr) -> Result<ConnectionPermits, ProxyError> {
        self.shared.counters.add_accepted();
        let refused = |refusal| conn::refused(&self.shared, dst, None, refusal);
        let sandbox = Arc::clone(&self.shared.connections)
            .try_acquire_owned()
            .map_err(|_| {
                refused(Refusal::TooManyConnections {
                    limit: self.shared.limits.max_connections,
                })
            })?;
        let tenant = self
            .shared
            .tenant_connections
            .try_take()
            .map_err(|limit| refused(Refusal::TooManyTenantConnections { limit }))?;
        Ok(ConnectionPermits {
            _sandbox: sandbox,
            _tenant: tenant,
        })
    }
}

/// The slots one guest connection holds while it is open.
struct ConnectionPermits {
    _sandbox: OwnedSemaphorePermit,
    _tenant: TenantConnectionPermit,
}

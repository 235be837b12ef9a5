//! One guest connection, from its first byte to its end: sniff, decide, then splice,
//! serve cleartext HTTP, or terminate TLS and serve HTTP inside it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use space_core::egress::Hostname;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info};

use super::first_bytes::{self, First, FirstBytes, Unnamed};
use super::http::{self, Origin};
use super::io::{splice, Activity, Metered, PlaceholderGuard, Prefixed};
use super::route::{self, Plan, Refusal};
use super::upstream::{Connector, UpstreamTls};
use super::{ProxyError, Shared};

/// How long the proxy tries to deliver its refusal response to a guest that does not read.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs one admitted guest connection to its end.
pub(super) async fn run(
    shared: &Arc<Shared>,
    mut guest: TcpStream,
    dst: SocketAddr,
) -> Result<(), ProxyError> {
    if guest.local_addr().ok() == Some(dst) {
        return Err(refused(shared, dst, None, Refusal::Loop));
    }
    let _ = guest.set_nodelay(true);
    // Only a destination reachable without a name may wait for a server that speaks first.
    let silent_wait = route::address_allowed(&shared.policy.load(), dst)
        .is_ok()
        .then_some(shared.limits.server_first_wait);
    let first = first_bytes::read(&mut guest, shared.limits.sniff_timeout, silent_wait)
        .await
        .map_err(ProxyError::Io)?;
    shared.counters.add_up(first.buf.len());
    if first.buf.is_empty() && first.what == FirstBytes::Unnamed(Unnamed::Closed) {
        return Ok(());
    }
    let host = match &first.what {
        FirstBytes::Tls { sni, .. } => Some(sni.clone()),
        FirstBytes::Http { host, .. } => Some(host.clone()),
        FirstBytes::Connect | FirstBytes::Unnamed(_) => None,
    };
    let planned = route::plan(
        &shared.policy.load(),
        &shared.pins,
        &first.what,
        dst,
        |host| shared.credentials_may_apply(host),
    );
    let plan = match planned {
        Ok(plan) => plan,
        Err(refusal) => {
            answer_refusal(&mut guest, &first, &refusal).await;
            return Err(refused(shared, dst, host.as_ref(), refusal));
        }
    };
    debug!(sandbox = %shared.sandbox, host = ?host.as_ref().map(Hostname::as_str), %dst, ?plan, "egress: connection admitted");
    let activity = Activity::new();
    let guest = Metered::new(guest, Arc::clone(&shared.counters), Arc::clone(&activity));
    match plan {
        Plan::Splice { addr } => {
            // A stream without a name, to an address: cleartext the proxy does not read as
            // HTTP, where no credential is injected, so a placeholder in it is refused (TLS
            // passed through by name is ciphertext: nothing to look for).
            let guard =
                shared.credentials.is_some() && matches!(first.what, FirstBytes::Unnamed(_));
            pass_through(shared, guest, first.buf, addr, &activity, guard).await
        }
        Plan::Http { host, addr } => {
            let origin = Origin {
                host,
                addr,
                tls: false,
            };
            let connector = connector(shared, addr, None);
            let io = Prefixed::new(first.buf, guest);
            http::serve(Arc::clone(shared), io, false, origin, connector, activity).await;
            Ok(())
        }
        Plan::Terminate { host, addr } => {
            terminate(shared, guest, first.buf, host, addr, dst, activity).await
        }
    }
}

/// Logs and counts a refusal; returns it as the connection's error.
pub(super) fn refused(
    shared: &Shared,
    dst: SocketAddr,
    host: Option<&Hostname>,
    refusal: Refusal,
) -> ProxyError {
    shared.counters.add_refused();
    info!(
        sandbox = %shared.sandbox,
        host = host.map_or("-", Hostname::as_str),
        %dst,
        reason = %refusal,
        "egress: connection refused"
    );
    ProxyError::Refused(refusal)
}

/// Answers an HTTP/1-looking refused stream with an HTTP error (best effort, bounded).
async fn answer_refusal(guest: &mut TcpStream, first: &First, refusal: &Refusal) {
    if !first.looks_like_http1() {
        return;
    }
    let response = http::refusal_response(refusal);
    let write = async {
        guest.write_all(&response).await?;
        guest.shutdown().await
    };
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
}

fn connector(shared: &Shared, addr: SocketAddr, tls: Option<UpstreamTls>) -> Connector {
    Connector {
        uplink: Arc::clone(&shared.uplink),
        slots: Arc::clone(&shared.upstream_slots),
        addr,
        tls,
        timeout: shared.limits.connect_timeout,
    }
}

/// Connects to `addr`, replays the first bytes, then copies both ways.
async fn pass_through(
    shared: &Shared,
    guest: Metered<TcpStream>,
    first: Vec<u8>,
    addr: SocketAddr,
    activity: &Activity,
    guard_placeholders: bool,
) -> Result<(), ProxyError> {
    let mut guest = PlaceholderGuard::new(guest, guard_placeholders);
    if guest.scan(&first) {
        return Err(placeholder_refused(shared, addr));
    }
    let mut upstream = connector(shared, addr, None)
        .connect()
        .await
        .map_err(|error| {
            debug!(sandbox = %shared.sandbox, %addr, %error, "egress: upstream connect failed");
            ProxyError::Upstream(error)
        })?;
    upstream
        .write_all(&first)
        .await
        .map_err(ProxyError::Upstream)?;
    let copied = splice(
        &mut guest,
        &mut upstream,
        activity,
        shared.limits.idle_timeout,
    )
    .await;
    if guest.tripped() {
        return Err(placeholder_refused(shared, addr));
    }
    copied.map_err(ProxyError::Io)
}

/// Audits a stream cut for a placeholder; the connection's error.
fn placeholder_refused(shared: &Shared, addr: SocketAddr) -> ProxyError {
    if let Some(credentials) = &shared.credentials {
        credentials.deny_placeholder_in_stream(
            &shared.tenant,
            &shared.sandbox,
            addr,
            super::http::now_ms(),
        );
    }
    refused(shared, addr, None, Refusal::PlaceholderInStream)
}

/// Terminates the guest's TLS (replaying its ClientHello) with a leaf for `host`, then
/// serves HTTP inside it, forwarding over TLS verified for `host`.
async fn terminate(
    shared: &Arc<Shared>,
    guest: Metered<TcpStream>,
    first: Vec<u8>,
    host: Hostname,
    addr: SocketAddr,
    dst: SocketAddr,
    activity: Arc<Activity>,
) -> Result<(), ProxyError> {
    let refuse = |refusal| refused(shared, dst, Some(&host), refusal);
    let config = match &shared.server_tls {
        Ok(config) => Arc::clone(config),
        Err(error) => return Err(refuse(Refusal::TerminationUnavailable(error.clone()))),
    };
    let Ok(name) = ServerName::try_from(host.as_str().to_owned()) else {
        return Err(refuse(Refusal::TerminationUnavailable(
            "the host is not a TLS server name".into(),
        )));
    };
    let accept = TlsAcceptor::from(config).accept(Prefixed::new(first, guest));
    let tls = match tokio::time::timeout(shared.limits.handshake_timeout, accept).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => return Err(refuse(Refusal::Handshake(error.to_string()))),
        Err(_) => return Err(refuse(Refusal::Handshake("timed out".into()))),
    };
    let (_, session) = tls.get_ref();
    let same_name = session
        .server_name()
        .and_then(|sni| Hostname::from_sni(sni.as_bytes()).ok())
        .is_some_and(|sni| sni == host);
    if !same_name {
        return Err(refuse(Refusal::SniMismatch));
    }
    let h2 = session.alpn_protocol() == Some(b"h2".as_slice());
    let upstream = UpstreamTls {
        // Upstream HTTP/2 only for a guest that speaks it; an HTTP/1.1 guest keeps HTTP/1.1
        // end to end (upgrades need it).
        config: Arc::clone(if h2 {
            &shared.upstream_h2
        } else {
            &shared.upstream_h1
        }),
        name,
    };
    let origin = Origin {
        host,
        addr,
        tls: true,
    };
    let connector = connector(shared, addr, Some(upstream));
    http::serve(Arc::clone(shared), tls, h2, origin, connector, activity).await;
    Ok(())
}

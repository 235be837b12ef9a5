//! Host-routed ports: a request for `{port}-{sandbox id}.{domain}` (or with
//! `E2b-Sandbox-Port`) reaches the server the agent runs on that port inside the sandbox,
//! as E2B's `get_host(port)` promises. Each request gets a TCP connection opened by the
//! guest daemon to `localhost:{port}` in the guest and carried over the sandbox's private
//! channel (`GuestClient::connect_port`); the daemon itself listens on nothing. HTTP/1.1
//! is spoken over that connection whatever the client spoke, and upgrades (WebSocket)
//! become a byte pipe both ways.
//!
//! Ports are **private** by default, unlike E2B's (`allowPublicTraffic` defaults to true
//! there): a request needs the sandbox's traffic token in `e2b-traffic-access-token`, or an
//! API key of the sandbox's tenant (`X-API-Key`, or `Authorization: Bearer`), unless the
//! sandbox's `public_ports` names the port (E2B's `allowPublicTraffic: true`: all of them).
//! The check comes before anything that could wake a paused sandbox, and the platform's own
//! credentials (traffic and access tokens, API keys) are taken out of the request before it
//! reaches the guest ([`strip_platform_credentials`]): a server in the sandbox never sees
//! what would let it act on the sandbox, or on the tenant.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONNECTION, UPGRADE};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::Response;
use axum::Router;
use hyper_util::rt::TokioIo;
use space_core::{ErrorCode, SandboxId};

use space_control::api::auth::bearer_token;
use space_control::db::SandboxRow;
use space_control::keys;

use crate::envd::access::{live_sandbox_row, AccessError, EnvdTarget, ACCESS_TOKEN_HEADER};
use crate::envd::errors::http_error;
use crate::rest::auth::{api_key, API_KEY_HEADER};
use crate::state::E2bState;

/// The sandbox port a request is for (put into the request by the dispatcher).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortTarget {
    /// The sandbox.
    pub id: SandboxId,
    /// The TCP port inside it.
    pub port: u16,
}

/// Header with a sandbox's traffic token, when ports are private.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Headers that describe one hop only and are not forwarded (RFC 9110, 7.6.1), besides
/// those `Connection` names. `Connection` and `Upgrade` go through for an upgrade.
const HOP_BY_HOP: &[&str] = &[
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Every request of a host route.
pub fn router(st: E2bState) -> Router {
    Router::new().fallback(forward).with_state(st)
}

/// What the proxy answers when nothing listens.
fn port_closed(target: &PortTarget) -> Response {
    http_error(
        502,
        format!(
            "the sandbox {} is running but there is no service on port {}: port is not open",
            target.id, target.port
        ),
    )
}

async fn forward(State(st): State<E2bState>, mut req: Request) -> Response {
    let Some(target) = req.extensions().get::<PortTarget>().cloned() else {
        return http_error(502, "the request names no sandbox port");
    };
    let row = match live_sandbox_row(&st, &EnvdTarget(target.id.clone())).await {
        Ok(row) => row,
        Err(AccessError::SandboxNotFound(id)) => {
            return http_error(502, format!("sandbox {id} was not found"))
        }
        Err(e) => return http_error(500, e.to_string()),
    };
    // Before anything that could wake the sandbox: an unauthenticated request costs nothing.
    match may_reach(&st, &row, &target, req.headers()).await {
        Ok(()) => {}
        Err(PortRefusal::Private) => {
            return http_error(
                403,
                format!(
                    "port {} of sandbox {} is private: send its traffic access token in \
                     {TRAFFIC_TOKEN_HEADER}, or an API key of its tenant in X-API-Key",
                    target.port, target.id
                ),
            )
        }
        Err(PortRefusal::Database) => {
            return http_error(500, "internal error (see the server log)")
        }
    }
    strip_platform_credentials(req.headers_mut());
    let guest = match st.app.guest(&row.tenant_id, &target.id).await {
        Ok(g) => g,
        Err(e) => {
            return http_error(
                502,
                format!("sandbox {} was not found: {}", target.id, e.body.message),
            )
        }
    };
    let stream = match guest.connect_port(target.port).await {
        Ok(s) => s,
        Err(e) if e.code() == ErrorCode::PortClosed => return port_closed(&target),
        Err(e) => return http_error(502, format!("reaching port {}: {e}", target.port)),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return http_error(502, format!("talking to port {}: {e}", target.port)),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "port connection ended");
        }
    });
    let wants_upgrade = req.headers().contains_key(UPGRADE);
    let client_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    parts.version = axum::http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers, wants_upgrade);
    // HTTP/2 clients carry the host in the authority; HTTP/1.1 needs the header.
    if let Some(authority) = parts.uri.authority().cloned() {
        if let Ok(v) = authority.as_str().parse() {
            parts.headers.insert(axum::http::header::HOST, v);
        }
    }
    if let Some(pq) = parts.uri.path_and_query().cloned() {
        parts.uri = pq.into();
    }
    let upstream = Request::from_parts(parts, body);
    let mut response = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => return http_error(502, format!("port {} answered badly: {e}", target.port)),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let server_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                match tokio::try_join!(client_upgrade, server_upgrade) {
                    Ok((client, server)) => {
                        let mut client = TokioIo::new(client);
                        let mut server = TokioIo::new(server);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                    Err(e) => tracing::debug!(error = %e, "port upgrade failed"),
                }
            });
        }
    }
    let (mut parts, body) = response.into_parts();
    if parts.status != StatusCode::SWITCHING_PROTOCOLS {
        strip_hop_by_hop(&mut parts.headers, false);
    }
    Response::from_parts(parts, Body::new(body))
}

/// Why a port request may not reach the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortRefusal {
    /// The port is private and the request carries no credential for it.
    Private,
    /// Checking an API key failed.
    Database,
}

/// Whether a request may reach `target`: the port is public, or the request carries the
/// sandbox's traffic token, or an API key of the sandbox's tenant.
async fn may_reach(
    st: &E2bState,
    row: &SandboxRow,
    target: &PortTarget,
    headers: &HeaderMap,
) -> Result<(), PortRefusal> {
    if row.spec.public_ports.allows(target.port) {
        return Ok(());
    }
    let traffic_token = headers
        .get(TRAFFIC_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            let now = space_control::db::now_ms();
            st.tokens.verify_traffic(&target.id, row.tokens, now, t)
        });
    if traffic_token {
        return Ok(());
    }
    let Some(key) = api_key(headers) else {
        return Err(PortRefusal::Private);
    };
    match st.app.db.authenticate(key).await {
        Ok(Some(tenant)) if tenant.id == row.tenant_id => Ok(()),
        Ok(_) => Err(PortRefusal::Private),
        Err(e) => {
            tracing::error!(error = %e, "checking the API key of a port request");
            Err(PortRefusal::Database)
        }
    }
}

/// Takes the platform's credentials out of a request bound for the guest: the traffic and
/// envd access tokens (headers only the platform defines), and an `X-API-Key` or
/// `Authorization: Bearer` that holds an API key. Another `Authorization` (the agent's own
/// server may want one) goes through.
fn strip_platform_credentials(headers: &mut HeaderMap) {
    headers.remove(TRAFFIC_TOKEN_HEADER);
    headers.remove(ACCESS_TOKEN_HEADER);
    let is_key =
        |v: &axum::http::HeaderValue| v.to_str().is_ok_and(|v| keys::is_well_formed(v.trim()));
    if headers.get(API_KEY_HEADER).is_some_and(is_key) {
        headers.remove(API_KEY_HEADER);
    }
    let bearer_key = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| bearer_token(Some(v)))
        .is_some_and(keys::is_well_formed);
    if bearer_key {
        headers.remove(AUTHORIZATION);
    }
}

/// Removes the hop-by-hop headers (keeping `Connection: upgrade` and `Upgrade` for an
/// upgrade).
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| !(upgrade && name == UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
    if !upgrade {
        headers.remove(CONNECTION);
        headers.remove(UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_platforms_credentials_never_reach_the_guest() {
        let key = format!("space_{}", "ab".repeat(32));
        let mut h = HeaderMap::new();
        h.insert(TRAFFIC_TOKEN_HEADER, HeaderValue::from_static("t"));
        h.insert(ACCESS_TOKEN_HEADER, HeaderValue::from_static("a"));
        h.insert(API_KEY_HEADER, HeaderValue::from_str(&key).unwrap());
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
        );
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_platform_credentials(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        // The agent's own credentials go through.
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_static("Basic dXNlcjpwdw=="),
        );
        h.insert(API_KEY_HEADER, HeaderValue::from_static("the-apps-own-key"));
        strip_platform_credentials(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
    }

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert(
            CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        strip_hop_by_hop(&mut h, true);
        assert!(h.contains_key(UPGRADE) && h.contains_key(CONNECTION));
    }
}

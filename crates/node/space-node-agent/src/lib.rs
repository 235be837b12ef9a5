//! The node agent: serves the node protocol (`space_node_proto::wire`) for one node to the
//! control plane, over mutual TLS.
//!
//! - Every connection has finished a TLS handshake with a certificate of the cluster CA
//!   (rustls checks chain and dates); every request is then served only if that
//!   certificate's role is the control plane's ([`peer`]): a node's certificate, valid as
//!   it may be, gets `403 forbidden` and changes nothing.
//! - Typed calls ([`dispatch`]) are bounded in size and parsed strictly (an unknown call is
//!   `400`); the node validates their content again.
//! - The guest relay ([`relay`]) forwards a guest route to the sandbox's daemon with both
//!   bodies streamed, nothing buffered.
//!
//! The agent holds no state of its own: it is the node's [`NodeApi`] on the network.

pub mod dispatch;
pub mod fence;
pub mod membership;
pub mod peer;
pub mod relay;

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use futures::StreamExt;
use space_core::{ErrorBody, ErrorCode};
use space_node_proto::api::{EventNotice, NodeApi};
use space_node_proto::wire::{
    NodeRequest, WireEvent, CALL_PATH, EVENTS_PATH, GUEST_ROUTE, MAX_CALL_BODY,
};
use space_tls::TlsListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What every handler reaches.
#[derive(Clone)]
pub struct AgentState {
    /// The node served.
    pub node: Arc<dyn NodeApi>,
}

/// An error answer of the protocol itself (not a node's refusal, which is a `WireReply`).
pub(crate) fn protocol_error(
    status: StatusCode,
    code: ErrorCode,
    message: impl Into<String>,
) -> Response {
    (status, axum::Json(ErrorBody::new(code, message))).into_response()
}

/// The agent's routes, each behind the control-plane role check.
pub fn router(state: AgentState) -> Router {
    Router::new()
        .route(CALL_PATH, post(call))
        .route(EVENTS_PATH, get(events))
        .route(GUEST_ROUTE, any(relay::relay))
        .layer(axum::middleware::from_fn(peer::require_control_plane))
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

async fn call(State(st): State<AgentState>, body: Body) -> Response {
    let bytes = match axum::body::to_bytes(body, MAX_CALL_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return protocol_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                format!("a node call is at most {MAX_CALL_BODY} bytes"),
            )
        }
    };
    let req: NodeRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return protocol_error(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                format!(
                    "not a node call of protocol {}: {e}",
                    space_node_proto::PROTOCOL_VERSION
                ),
            )
        }
    };
    // In a task of its own: a control plane that hangs up (or dies) must not cancel a
    // create or a checkpoint half-way; the node finishes it and the reconciler sees it.
    let node = st.node.clone();
    let answer =
        match tokio::spawn(async move { dispatch::dispatch(node.as_ref(), req).await }).await {
            Ok(answer) => answer,
            Err(e) => {
                return protocol_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    ErrorCode::Internal,
                    format!("the node call task failed: {e}"),
                )
            }
        };
    (
        [(header::CONTENT_TYPE, "application/json")],
        Bytes::from(answer),
    )
        .into_response()
}

async fn events(State(st): State<AgentState>) -> Response {
    let feed = match st.node.subscribe_events().await {
        Ok(f) => f,
        Err(e) => {
            return protocol_error(StatusCode::SERVICE_UNAVAILABLE, e.code(), e.to_string());
        }
    };
    let lines = feed.map(|notice| {
        let wire = match notice {
            EventNotice::Entry(e) => WireEvent::Entry(e),
            EventNotice::Lagged => WireEvent::Lagged,
        };
        let mut line = serde_json::to_vec(&wire).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, Infallible>(Bytes::from(line))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

/// Serves `node` on `listener` (a mutual-TLS listener: see
/// `space_node_proto::identity::server_config`) until `stop` turns true.
pub fn spawn(
    node: Arc<dyn NodeApi>,
    listener: TlsListener,
    stop: watch::Receiver<bool>,
) -> JoinHandle<std::io::Result<()>> {
    space_tls::serve_with_peers(listener, router(AgentState { node }), stop)
}

/// A node serving the cluster: its agent on a mutual-TLS listener and its heartbeats to
/// the control plane (what `space node run` runs around the node).
pub struct NodeAgent {
    addr: std::net::SocketAddr,
    stop: watch::Sender<bool>,
    agent: JoinHandle<std::io::Result<()>>,
    heartbeat: JoinHandle<()>,
}

impl NodeAgent {
    /// Serves `node`, which joined as `joined`, on `listen`, and heartbeats every
    /// `heartbeat`.
    pub async fn start(
        node: Arc<dyn NodeApi>,
        joined: membership::Joined,
        listen: std::net::SocketAddr,
        heartbeat: std::time::Duration,
    ) -> Result<NodeAgent, membership::MembershipError> {
        let tls = space_node_proto::identity::server_config(&joined.identity, &joined.ca_pem)?;
        let io = |source| membership::MembershipError::Io {
            path: std::path::PathBuf::from(listen.to_string()),
            source,
        };
        let tcp = tokio::net::TcpListener::bind(listen).await.map_err(io)?;
        let addr = tcp.local_addr().map_err(io)?;
        let listener = TlsListener::new(tcp, tls).map_err(io)?;
        let (stop, stop_rx) = watch::channel(false);
        let agent = spawn(node.clone(), listener, stop_rx.clone());
        let heartbeat = membership::spawn_heartbeat(joined, node, heartbeat, stop_rx).await?;
        Ok(NodeAgent {
            addr,
            stop,
            agent,
            heartbeat,
        })
    }

    /// Where the agent listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Stops heartbeating and serving: open connections get `grace`, then are cut.
    pub async fn shutdown(mut self, grace: std::time::Duration) {
        let _ = self.stop.send(true);
        let _ = (&mut self.heartbeat).await;
        if tokio::time::timeout(grace, &mut self.agent).await.is_err() {
            tracing::info!("agent connections did not finish in time; closing them");
            self.agent.abort();
        }
    }
}

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
    let answer = dispatch::dispatch(st.node.as_ref(), req).await;
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
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<std::io::Result<()>> {
    let app = router(AgentState { node }).into_make_service_with_connect_info::<peer::Peer>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                while !*stop.borrow() {
                    if stop.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await
    })
}

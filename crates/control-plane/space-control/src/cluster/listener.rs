//! The cluster listener's routes (see `space_node_proto::cluster`): TLS with the cluster
//! CA, client certificates optional at the handshake (a joining node has none) and
//! required by every route but the join. Bodies are bounded and parsed strictly.

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;
use space_core::{ErrorBody, ErrorCode};
use space_node_proto::cluster::{HEARTBEAT_PATH, JOIN_PATH, MAX_MEMBERSHIP_BODY, REJOIN_PATH};
use space_tls::TlsPeer;

use super::membership::{Membership, Refusal};

/// The routes, over `membership`.
pub fn router(membership: Membership) -> Router {
    Router::new()
        .route(JOIN_PATH, post(join))
        .route(HEARTBEAT_PATH, post(heartbeat))
        .route(REJOIN_PATH, post(rejoin))
        .fallback(|| async {
            answer::<()>(Err(Refusal(ErrorBody::new(
                ErrorCode::NotFound,
                "no such cluster route",
            ))))
        })
        .with_state(membership)
}

fn answer<T: Serialize>(result: Result<T, Refusal>) -> Response {
    match result {
        Ok(v) => (StatusCode::OK, Json(v)).into_response(),
        Err(Refusal(body)) => {
            let status = StatusCode::from_u16(body.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, Json(body)).into_response()
        }
    }
}

async fn parse<T: DeserializeOwned>(body: Body) -> Result<T, Refusal> {
    let bytes = axum::body::to_bytes(body, MAX_MEMBERSHIP_BODY)
        .await
        .map_err(|_| {
            Refusal(ErrorBody::new(
                ErrorCode::PayloadTooLarge,
                format!("a membership request is at most {MAX_MEMBERSHIP_BODY} bytes"),
            ))
        })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Refusal(ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("malformed request: {e}"),
        ))
    })
}

/// Parses the body, runs `op` on it with the peer's certificate, answers; a refusal is
/// logged with the route it refused (`what`).
async fn handle<Req, Resp, F, Fut>(what: &'static str, peer: TlsPeer, body: Body, op: F) -> Response
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: FnOnce(Req, Option<Vec<u8>>) -> Fut,
    Fut: std::future::Future<Output = Result<Resp, Refusal>>,
{
    let result = match parse(body).await {
        Ok(req) => op(req, peer.leaf.map(|l| l.to_vec())).await,
        Err(e) => Err(e),
    };
    if let Err(Refusal(e)) = &result {
        tracing::warn!(peer = %peer.addr, code = %e.code.as_str(), message = %e.message, "{what} refused");
    }
    answer(result)
}

async fn join(
    State(m): State<Membership>,
    ConnectInfo(peer): ConnectInfo<TlsPeer>,
    body: Body,
) -> Response {
    handle(
        "join",
        peer,
        body,
        |req, _| async move { m.join(req).await },
    )
    .await
}

async fn heartbeat(
    State(m): State<Membership>,
    ConnectInfo(peer): ConnectInfo<TlsPeer>,
    body: Body,
) -> Response {
    handle("heartbeat", peer, body, |hb, leaf| async move {
        m.heartbeat(leaf.as_deref(), hb).await
    })
    .await
}

async fn rejoin(
    State(m): State<Membership>,
    ConnectInfo(peer): ConnectInfo<TlsPeer>,
    body: Body,
) -> Response {
    handle("rejoin", peer, body, |req, leaf| async move {
        m.rejoin(leaf.as_deref(), req).await
    })
    .await
}

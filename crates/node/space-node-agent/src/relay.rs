//! The guest relay: a guest route of one sandbox, forwarded to its daemon with both bodies
//! streamed (`GuestClient::forward`).

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use space_core::{ErrorCode, SandboxId};

use crate::{protocol_error, AgentState};

/// Longest relayed path and query.
const MAX_TARGET: usize = 8 * 1024;

/// `* /node/v1/sandboxes/{id}/guest/{route}`.
pub async fn relay(
    State(st): State<AgentState>,
    Path((id, route)): Path<(String, String)>,
    req: Request,
) -> Response {
    let Ok(id) = id.parse::<SandboxId>() else {
        return protocol_error(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            "malformed sandbox id",
        );
    };
    let target = match req.uri().query() {
        Some(q) => format!("/{route}?{q}"),
        None => format!("/{route}"),
    };
    if target.len() > MAX_TARGET {
        return protocol_error(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            "relayed target too long",
        );
    }
    let guest = match st.node.guest(&id).await {
        Ok(g) => g,
        Err(e) => {
            let status =
                StatusCode::from_u16(e.code().http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
            return protocol_error(status, e.code(), e.to_string());
        }
    };
    let (parts, body) = req.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = body
        .into_data_stream()
        .map(|chunk| chunk.map_err(std::io::Error::other))
        .boxed();
    match guest
        .forward(parts.method, &target, content_type.as_deref(), body)
        .await
    {
        Ok(resp) => {
            let (parts, stream) = resp.into_parts();
            Response::from_parts(parts, Body::from_stream(stream)).into_response()
        }
        Err(e) => {
            let body = e.to_error_body().sanitised();
            let status =
                StatusCode::from_u16(body.code.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, axum::Json(body)).into_response()
        }
    }
}

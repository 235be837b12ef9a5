//! `POST /v1/ports/{port}/connect`: one TCP connection to a server in the guest, full duplex
//! over the request's HTTP/2 stream (see `ports`).

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use space_core::ErrorCode;
use space_guest_proto::limits::MAX_PORT_CONNECTIONS;

use super::St;
use crate::error::ApiError;
use crate::ports;

/// The `{port}` of a port route: 1..=65535.
#[derive(Debug)]
pub struct PortNumber(pub u16);

impl<S: Send + Sync> FromRequestParts<S> for PortNumber {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<u16>::from_request_parts(parts, state)
            .await
            .ok()
            .filter(|p| p.0 != 0)
            .map(|p| PortNumber(p.0))
            .ok_or_else(|| ApiError::invalid("port must be a number 1..=65535"))
    }
}

pub(super) async fn connect(
    State(st): St,
    PortNumber(port): PortNumber,
    body: Body,
) -> Result<Response, ApiError> {
    let permit = st
        .port_connections
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            ApiError::new(
                ErrorCode::TooManyRequests,
                format!("at most {MAX_PORT_CONNECTIONS} port connections may be open at once"),
            )
        })?;
    let tcp = ports::connect(port).await?;
    let out = ports::splice(tcp, body, permit);
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(out),
    )
        .into_response())
}

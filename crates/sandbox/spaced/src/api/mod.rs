//! The HTTP/2 routes of `space_guest_proto::routes` as an axum router.
//!
//! Every error is a JSON `ErrorBody` with the status of its code, including malformed JSON,
//! bad query strings, unknown routes and oversized bodies.

mod activity;
mod configure;
mod files;
mod freeze;
mod identity;
mod metrics;
mod ports;
mod processes;

pub use configure::DAEMON_VERSION;

use std::sync::Arc;

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::Router;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use space_core::ErrorCode;
use space_guest_proto::limits::MAX_JSON_BODY;
use space_guest_proto::routes;

use crate::error::ApiError;
use crate::state::AppState;

/// Shared state as handlers see it.
pub type St = axum::extract::State<Arc<AppState>>;

/// The router for all routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(routes::HEALTH, get(configure::health))
        .route(routes::CONFIGURE, post(configure::configure))
        .route(routes::IDENTITY, post(identity::identity))
        .route(routes::FS_FREEZE, post(freeze::fs_freeze))
        .route(routes::FS_THAW, post(freeze::fs_thaw))
        .route(routes::WORKLOAD_FREEZE, post(freeze::workload_freeze))
        .route(routes::WORKLOAD_THAW, post(freeze::workload_thaw))
        .route(routes::ACTIVITY, get(activity::activity))
        .route(routes::METRICS, get(metrics::metrics))
        .route(
            routes::PROCESSES,
            post(processes::start).get(processes::list),
        )
        .route("/v1/processes/{id}", get(processes::get))
        .route("/v1/processes/{id}/output", get(processes::output))
        .route("/v1/processes/{id}/stdin", post(processes::stdin))
        .route("/v1/processes/{id}/signal", post(processes::signal))
        .route("/v1/processes/{id}/resize", post(processes::resize))
        .route(
            routes::FILES,
            get(files::read).put(files::write).delete(files::remove),
        )
        .route(routes::FILES_STAT, get(files::stat))
        .route(routes::FILES_LIST, get(files::list))
        .route(routes::FILES_MKDIR, post(files::mkdir))
        .route(routes::FILES_RENAME, post(files::rename))
        .route(routes::FILES_WATCH, get(files::watch))
        .route(routes::FILES_ARCHIVE, put(files::unpack_archive))
        .route("/v1/ports/{port}/connect", post(ports::connect))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            activity::count_requests,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::invalid("method not allowed on this route")
}

/// A JSON body (any content type), at most `MAX_JSON_BODY` bytes.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e: BytesRejection| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        ErrorCode::PayloadTooLarge,
                        format!("JSON body larger than {MAX_JSON_BODY} bytes"),
                    )
                } else {
                    ApiError::invalid(e.body_text())
                }
            })?;
        serde_json::from_slice(&bytes)
            .map(ApiJson)
            .map_err(|e| ApiError::invalid(format!("bad JSON body: {e}")))
    }
}

/// A query string.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| ApiError::invalid(e.body_text()))
    }
}

/// The `{id}` of a process route.
#[derive(Debug)]
pub struct ProcId(pub u64);

impl<S: Send + Sync> FromRequestParts<S> for ProcId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<u64>::from_request_parts(parts, state)
            .await
            .map(|p| ProcId(p.0))
            .map_err(|_| ApiError::invalid("process id must be a number"))
    }
}

//! `GET /v1/activity`, and the request counter it reports.

use std::sync::atomic::Ordering;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use space_guest_proto::{routes, Activity};

use super::St;
use crate::activity;

pub(super) async fn activity(
    axum::extract::State(st): St,
) -> Result<Json<Activity>, crate::error::ApiError> {
    let requests = st.api_requests.load(Ordering::Relaxed);
    let running = st.processes.running();
    let workload = st.workload.clone();
    let a =
        tokio::task::spawn_blocking(move || activity::sample(&workload, running, requests)).await?;
    Ok(Json(a))
}

/// Counts every request but the platform's own housekeeping ([`routes::NOT_ACTIVITY`]).
pub(super) async fn count_requests(
    axum::extract::State(st): St,
    req: Request,
    next: Next,
) -> Response {
    if !routes::NOT_ACTIVITY.contains(&req.uri().path()) {
        st.api_requests.fetch_add(1, Ordering::Relaxed);
    }
    next.run(req).await
}

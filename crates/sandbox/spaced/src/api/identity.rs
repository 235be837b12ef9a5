//! `POST /v1/identity`: restore a guest's uniqueness after a snapshot restore or a fork.

use axum::http::StatusCode;
use space_guest_proto::IdentityRequest;

use super::configure::apply_hostname_and_clock;
use super::{ApiJson, St};
use crate::error::ApiError;
use crate::system;

pub(super) async fn identity(
    axum::extract::State(st): St,
    ApiJson(req): ApiJson<IdentityRequest>,
) -> Result<StatusCode, ApiError> {
    let entropy = req
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if st.host_safe {
        tracing::info!(hostname = %req.hostname, "development channel: not changing the RNG, hostname or clock");
        return Ok(StatusCode::NO_CONTENT);
    }
    // The RNG first: anything that runs after this answer must not repeat a sibling's bytes.
    tokio::task::spawn_blocking(move || system::reseed_rng(&entropy))
        .await?
        .map_err(|e| ApiError::internal(format!("reseed the kernel RNG: {e}")))?;
    apply_hostname_and_clock(&req.hostname, req.time_unix_ms).await?;
    tracing::info!(hostname = %req.hostname, "identity restored: RNG reseeded, hostname and clock set");
    Ok(StatusCode::NO_CONTENT)
}

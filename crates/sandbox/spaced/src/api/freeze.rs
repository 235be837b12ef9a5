//! `POST /v1/fs/freeze`, `POST /v1/fs/thaw`, `POST /v1/workload/freeze`,
//! `POST /v1/workload/thaw`.

use std::time::Duration;

use axum::http::StatusCode;
use space_core::ErrorCode;
use space_guest_proto::FreezeRequest;

use super::{ApiJson, St};
use crate::error::ApiError;
use crate::fsfreeze::FreezeError;
use crate::workload::WorkloadError;

impl From<FreezeError> for ApiError {
    fn from(e: FreezeError) -> Self {
        match e {
            FreezeError::AlreadyFrozen { .. } => ApiError::new(ErrorCode::Conflict, e.to_string()),
            e => ApiError::internal(e.to_string()),
        }
    }
}

impl From<WorkloadError> for ApiError {
    fn from(e: WorkloadError) -> Self {
        let code = match e {
            WorkloadError::Unavailable => ErrorCode::Conflict,
            WorkloadError::FreezeTimeout => ErrorCode::Timeout,
            WorkloadError::Io { .. } | WorkloadError::Worker(_) => ErrorCode::Internal,
        };
        ApiError::new(code, e.to_string())
    }
}

pub(super) async fn fs_freeze(
    axum::extract::State(st): St,
    ApiJson(req): ApiJson<FreezeRequest>,
) -> Result<StatusCode, ApiError> {
    req.validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if st.host_safe {
        tracing::info!("development channel: not freezing file systems");
        return Ok(StatusCode::NO_CONTENT);
    }
    let timeout = Duration::from_millis(u64::from(req.timeout_ms));
    let frozen = st.freezer.freeze(timeout).await?;
    tracing::info!(?frozen, timeout_ms = req.timeout_ms, "file systems frozen");
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn fs_thaw(axum::extract::State(st): St) -> Result<StatusCode, ApiError> {
    let n = st.freezer.thaw().await?;
    if n > 0 {
        tracing::info!(file_systems = n, "file systems thawed");
    }
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn workload_freeze(axum::extract::State(st): St) -> Result<StatusCode, ApiError> {
    st.workload.freeze().await?;
    tracing::info!("workload frozen");
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn workload_thaw(axum::extract::State(st): St) -> Result<StatusCode, ApiError> {
    st.workload.thaw().await?;
    Ok(StatusCode::NO_CONTENT)
}

//! `GET /v1/audit`: the caller's action log (recorded by [`super::action_log`]), filtered
//! and paged, with the anchor its chain starts from, so a client can verify the chain
//! itself (`space audit verify`, [`space_core::audit::verify`]).

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use space_core::audit::{AuditAnchor, AuditRecord};
use space_core::error::ErrorBody;
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ApiResult};
use super::extract::ApiQuery;
use super::AppState;
use crate::db::{AuditQuery, MAX_AUDIT_FIELD, MAX_AUDIT_PAGE};
use crate::service::Caller;

/// Filters and paging of `GET /v1/audit`.
#[derive(Debug, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditLogParams {
    /// Only records after this position: the `next_after_seq` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_seq: Option<i64>,
    /// Only records at or after this instant (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Only records before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
    /// Only this action, e.g. `POST /v1/sandboxes/{id}/pause` or `api_key.revoke`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Only targets starting with this, e.g. `/v1/sandboxes/sbx-…` for one sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Only this outcome: `ok` or an error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Only what this API key (by id) did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_id: Option<String>,
    /// At most this many (default 100, at most 1000), in chain order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// A page of the action log.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditLog {
    /// The tenant whose chain this is (its id is part of every record's hash).
    pub tenant: String,
    /// Records in chain order (oldest first).
    pub records: Vec<AuditRecord>,
    /// Where the kept chain starts (`null`: at its first record ever): older records aged
    /// out (`space server --audit-retention-days`).
    pub anchor: Option<AuditAnchor>,
    /// Pass as `after_seq` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after_seq: Option<i64>,
}

fn bounded(what: &str, v: Option<String>) -> ApiResult<Option<String>> {
    match v {
        Some(s) if s.len() > MAX_AUDIT_FIELD => Err(ApiError::invalid(format!(
            "{what} is longer than {MAX_AUDIT_FIELD} bytes"
        ))),
        other => Ok(other),
    }
}

/// The caller's action log: every control-plane action of its tenant (API calls that
/// change something, key creations and revocations, the platform's timeouts), with the
/// acting key's id, target, outcome and time, hash-chained.
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "audit",
    params(AuditLogParams),
    responses(
        (status = 200, description = "A page of records", body = AuditLog),
        (status = 400, description = "Bad filter", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn audit_log(
    State(st): State<AppState>,
    tenant: Caller,
    ApiQuery(p): ApiQuery<AuditLogParams>,
) -> ApiResult<Json<AuditLog>> {
    let limit = p.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_AUDIT_PAGE {
        return Err(ApiError::invalid(format!(
            "limit must be 1 to {MAX_AUDIT_PAGE}"
        )));
    }
    let q = AuditQuery {
        after_seq: p.after_seq,
        since_ms: p.since_ms,
        until_ms: p.until_ms,
        action: bounded("action", p.action)?,
        target_prefix: bounded("target", p.target)?,
        outcome: bounded("outcome", p.outcome)?,
        api_key_id: bounded("api_key_id", p.api_key_id)?,
        limit,
    };
    let anchor = st.db.audit_anchor(&tenant.id).await?;
    let records = st.db.audit_records(&tenant.id, &q).await?;
    let next_after_seq = (records.len() == limit)
        .then(|| records.last().map(|r| r.seq))
        .flatten();
    Ok(Json(AuditLog {
        tenant: tenant.id.to_string(),
        records,
        anchor,
        next_after_seq,
    }))
}

//! E2B snapshots are SPACE's persistent snapshots (they outlive their sandbox, as on
//! E2B): `create_snapshot` takes a persistent checkpoint (or, with `memory: false`, a
//! persistent disk snapshot) labelled with its name; `list_snapshots` lists the caller's
//! persistent snapshots, newest first; `delete_snapshot` (`DELETE /templates/{id}`) deletes
//! one; and a create whose `templateID` is a snapshot id starts a sandbox from it (SPACE's
//! create from a snapshot).

use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use space_control::service::snapshots;
use space_control::service::Caller;
use space_core::sandbox::CreateSnapshotRequest;
use space_core::{SnapshotId, SnapshotInfo, SnapshotKind};

use super::error::{RestError, RestResult};
use super::list::{DEFAULT_LIMIT, MAX_LIMIT};
use super::sandboxes::sandbox_id;
use super::JsonOrEmpty;
use crate::state::E2bState;
use space_core::error::excerpt;

/// Body of `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize)]
pub struct SnapshotRequest {
    /// A name to find it by (SPACE's label).
    #[serde(default)]
    name: Option<String>,
    /// `false`: the file system only (a disk snapshot); default: memory too (a checkpoint).
    #[serde(default)]
    memory: Option<bool>,
}

/// A snapshot as E2B lists it.
#[derive(Debug, Clone, Serialize)]
pub struct E2bSnapshot {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

impl E2bSnapshot {
    fn of(info: &SnapshotInfo) -> Self {
        E2bSnapshot {
            snapshot_id: info.id.to_string(),
            names: info.label.iter().cloned().collect(),
        }
    }
}

/// `POST /sandboxes/{id}/snapshots`.
pub async fn create(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    JsonOrEmpty(req): JsonOrEmpty<SnapshotRequest>,
) -> RestResult<(StatusCode, Json<E2bSnapshot>)> {
    let id = sandbox_id(&raw)?;
    let kind = if req.memory.unwrap_or(true) {
        SnapshotKind::Checkpoint
    } else {
        SnapshotKind::Disk
    };
    let taken = snapshots::take(
        &st.app,
        &tenant,
        &id,
        CreateSnapshotRequest {
            kind,
            label: req.name,
            persistent: true,
        },
    )
    .await?;
    Ok((StatusCode::CREATED, Json(E2bSnapshot::of(&taken.snapshot))))
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: one page of the caller's persistent
/// snapshots, newest first; the next page's token in `x-next-token`.
pub async fn list(State(st): State<E2bState>, tenant: Caller, uri: Uri) -> RestResult<Response> {
    let (mut sandbox, mut label) = (None, None);
    let mut limit = DEFAULT_LIMIT;
    let mut after: Option<(i64, SnapshotId)> = None;
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*k {
            "sandboxID" => sandbox = Some(sandbox_id(&v)?),
            "name" => label = Some(v.into_owned()),
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|l| (1..=MAX_LIMIT).contains(l))
                    .ok_or_else(|| {
                        RestError::bad_request(format!("limit: want 1 to {MAX_LIMIT}"))
                    })?;
            }
            "nextToken" if !v.is_empty() => {
                after = Some(decode_cursor(&v).ok_or_else(|| {
                    RestError::bad_request("nextToken: not a token this server made")
                })?);
            }
            "nextToken" => {}
            other => {
                return Err(RestError::bad_request(format!(
                    "{}: not supported",
                    excerpt(other, 32)
                )))
            }
        }
    }
    let all = snapshots::list_tenant(&st.app, &tenant, sandbox.as_ref(), label.as_deref()).await?;
    let mut page = Vec::new();
    let mut more = false;
    // Newest first, as the native list is.
    for snap in all.into_iter().filter(|s| s.persistent) {
        if after
            .as_ref()
            .is_some_and(|(ms, id)| (snap.created_at_ms, snap.id.as_str()) >= (*ms, id.as_str()))
        {
            continue;
        }
        if page.len() == limit {
            more = true;
            break;
        }
        page.push(snap);
    }
    let next = more
        .then(|| page.last().map(|s| encode_cursor(s.created_at_ms, &s.id)))
        .flatten();
    let items: Vec<E2bSnapshot> = page.iter().map(E2bSnapshot::of).collect();
    Ok(super::list::page_response(items, next))
}

fn encode_cursor(ms: i64, id: &SnapshotId) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{ms}/{id}"))
}

fn decode_cursor(token: &str) -> Option<(i64, SnapshotId)> {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim().as_bytes())
        .ok()?;
    let (ms, id) = std::str::from_utf8(&raw).ok()?.split_once('/')?;
    Some((ms.parse().ok()?, id.parse().ok()?))
}

/// `DELETE /templates/{id}`: deletes a snapshot (204; 404 when there is none, which the SDKs
/// turn into `false`). SPACE's templates are built by the operator, not through this API.
pub async fn delete(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
) -> RestResult<StatusCode> {
    let Ok(snap_id) = raw.parse::<SnapshotId>() else {
        return Err(RestError::not_found(format!(
            "snapshot {} not found (SPACE's templates are managed with `space template`)",
            excerpt(&raw, 64)
        )));
    };
    snapshots::delete_tenant(&st.app, &tenant, &snap_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_cursors_round_trip() {
        let id = SnapshotId::generate();
        assert_eq!(decode_cursor(&encode_cursor(5, &id)), Some((5, id)));
        assert_eq!(decode_cursor("!!"), None);
    }
}

//! A sandbox's resource use, as E2B reports it, from SPACE's samples (taken every few
//! seconds by the node while the sandbox runs): `GET /sandboxes/{id}/metrics?start=&end=`
//! (Unix seconds) and, for several sandboxes at once, the latest sample of each
//! (`GET /sandboxes/metrics?sandbox_ids=a,b`).

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::Uri;
use axum::Json;
use serde::Serialize;
use space_control::service::metrics;
use space_control::service::Caller;
use space_core::metrics::SandboxMetric;

use super::error::{RestError, RestResult};
use super::sandboxes::sandbox_id;
use crate::state::E2bState;
use crate::timestamp::rfc3339;

/// Most sandboxes one `GET /sandboxes/metrics` may name.
pub const MAX_SANDBOXES_PER_QUERY: usize = 100;

/// One sample, as E2B names its parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bMetric {
    timestamp: String,
    timestamp_unix: i64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

impl E2bMetric {
    /// E2B's form of a SPACE sample.
    pub fn of(m: &SandboxMetric) -> Self {
        E2bMetric {
            timestamp: rfc3339(m.timestamp_ms),
            timestamp_unix: m.timestamp_ms.div_euclid(1000),
            cpu_count: m.cpu_count,
            cpu_used_pct: m.cpu_used_pct,
            mem_used: m.mem_used,
            mem_total: m.mem_total,
            mem_cache: m.mem_cache,
            disk_used: m.disk_used,
            disk_total: m.disk_total,
        }
    }
}

fn seconds(k: &str, v: &str) -> RestResult<i64> {
    v.parse::<i64>()
        .ok()
        .and_then(|s| s.checked_mul(1000))
        .ok_or_else(|| RestError::bad_request(format!("{k}: want Unix seconds")))
}

async fn samples(
    st: &E2bState,
    tenant: Caller,
    raw: &str,
    start_ms: Option<i64>,
    end_ms: Option<i64>,
) -> RestResult<Vec<SandboxMetric>> {
    let id = sandbox_id(raw)?;
    Ok(metrics::samples(&st.app, &tenant, &id, start_ms, end_ms).await?)
}

/// `GET /sandboxes/{id}/metrics?start=&end=`: the samples in that window, oldest first.
pub async fn sandbox(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    uri: Uri,
) -> RestResult<Json<Vec<E2bMetric>>> {
    let (mut start, mut end) = (None, None);
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*k {
            "start" => start = Some(seconds(&k, &v)?),
            // Inclusive of the whole last second.
            "end" => end = Some(seconds(&k, &v)?.saturating_add(999)),
            _ => return Err(RestError::bad_request(format!("{k}: not supported"))),
        }
    }
    let found = samples(&st, tenant, &raw, start, end).await?;
    Ok(Json(found.iter().map(E2bMetric::of).collect()))
}

/// Body of `GET /sandboxes/metrics`.
#[derive(Debug, Serialize)]
pub struct SandboxesWithMetrics {
    sandboxes: BTreeMap<String, E2bMetric>,
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: the latest sample of each (sandboxes that have
/// none, or are not the caller's, are left out).
pub async fn latest(
    State(st): State<E2bState>,
    tenant: Caller,
    uri: Uri,
) -> RestResult<Json<SandboxesWithMetrics>> {
    let mut ids: Vec<String> = Vec::new();
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*k {
            "sandbox_ids" => ids.extend(v.split(',').filter(|s| !s.is_empty()).map(str::to_owned)),
            _ => return Err(RestError::bad_request(format!("{k}: not supported"))),
        }
    }
    if ids.len() > MAX_SANDBOXES_PER_QUERY {
        return Err(RestError::bad_request(format!(
            "sandbox_ids: at most {MAX_SANDBOXES_PER_QUERY}"
        )));
    }
    let mut sandboxes = BTreeMap::new();
    for raw in ids {
        match samples(&st, tenant.clone(), &raw, None, None).await {
            Ok(found) => {
                if let Some(last) = found.last() {
                    sandboxes.insert(raw, E2bMetric::of(last));
                }
            }
            Err(e) if e.0.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Json(SandboxesWithMetrics { sandboxes }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_use_e2b_names_and_units() {
        let m = SandboxMetric {
            timestamp_ms: 1_764_417_600_500,
            cpu_count: 2,
            cpu_used_pct: 12.5,
            mem_total: 256 << 20,
            mem_used: 40 << 20,
            mem_cache: 10 << 20,
            disk_total: 1 << 30,
            disk_used: 1 << 20,
        };
        let json = serde_json::to_value(E2bMetric::of(&m)).unwrap();
        assert_eq!(json["timestamp"], "2025-11-29T12:00:00.5Z");
        assert_eq!(json["timestampUnix"], 1_764_417_600);
        assert_eq!(json["cpuUsedPct"], 12.5);
        assert_eq!(json["memTotal"], 256 << 20);
        assert_eq!(json["diskUsed"], 1 << 20);
        assert!(seconds("start", "x").is_err());
        assert_eq!(seconds("start", "2").unwrap(), 2000);
    }
}

//! Calls for snapshots, forks and idleness: freeze and thaw the guest's file systems and
//! its workload, restore its identity after a restore or fork, and sample its activity and
//! resource use.
//!
//! Requests are checked against the bounds in `space_guest_proto` before they are sent (the
//! guest checks them again).

use std::time::Duration;

use http::Method;
use space_core::ErrorCode;
use space_guest_proto::limits::{MAX_FREEZE_TIMEOUT_MS, MAX_JSON_BODY, MIN_FREEZE_TIMEOUT_MS};
use space_guest_proto::{routes, Activity, FreezeRequest, GuestMetrics, IdentityRequest};

use crate::error::GuestError;
use crate::query::Target;
use crate::transport::Body;
use crate::GuestClient;

/// The freeze request for `timeout`, refused locally outside
/// `MIN_FREEZE_TIMEOUT_MS..=MAX_FREEZE_TIMEOUT_MS`.
fn freeze_request(timeout: Duration) -> Result<FreezeRequest, GuestError> {
    let req = FreezeRequest {
        timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
    };
    req.validate().map_err(|_| {
        GuestError::local(
            ErrorCode::InvalidRequest,
            format!(
                "freeze timeout must be {MIN_FREEZE_TIMEOUT_MS}..={MAX_FREEZE_TIMEOUT_MS} ms, got {timeout:?}"
            ),
        )
    })?;
    Ok(req)
}

impl GuestClient {
    /// `POST /v1/fs/freeze`: freezes the guest's disk file systems (FIFREEZE); returns once
    /// they are frozen. The guest thaws by itself after `timeout` (1 ms..=30 s) unless
    /// [`GuestClient::thaw_fs`] comes first; freezing again while frozen re-arms that timer.
    /// A file system frozen by someone else inside the guest is a [`GuestError::Remote`]
    /// with code `conflict` (and nothing is left frozen).
    pub async fn freeze_fs(&self, timeout: Duration) -> Result<(), GuestError> {
        let req = freeze_request(timeout)?;
        self.transport()
            .unit(
                Method::POST,
                Target::new(routes::FS_FREEZE),
                Body::json(&req)?,
            )
            .await
    }

    /// `POST /v1/fs/thaw`: thaws what [`GuestClient::freeze_fs`] froze; fine when nothing is.
    pub async fn thaw_fs(&self) -> Result<(), GuestError> {
        self.transport()
            .unit(Method::POST, Target::new(routes::FS_THAW), Body::Empty)
            .await
    }

    /// `POST /v1/identity`: after a snapshot restore or a fork, mixes fresh host entropy
    /// into the guest's kernel RNG and reseeds it, sets the hostname and the clock.
    pub async fn set_identity(&self, req: &IdentityRequest) -> Result<(), GuestError> {
        req.validate()
            .map_err(|e| GuestError::local(ErrorCode::InvalidRequest, e.to_string()))?;
        self.transport()
            .unit(
                Method::POST,
                Target::new(routes::IDENTITY),
                Body::json(req)?,
            )
            .await
    }

    /// `POST /v1/workload/freeze`: freezes every process the daemon started (the workload
    /// cgroup); returns once the kernel reports it frozen. A workload that does not freeze
    /// within 2 s is thawed again and the call fails with code `timeout`; a guest without a
    /// workload cgroup answers `conflict`. While frozen, starting a process answers `conflict`.
    pub async fn freeze_workload(&self) -> Result<(), GuestError> {
        self.transport()
            .unit(
                Method::POST,
                Target::new(routes::WORKLOAD_FREEZE),
                Body::Empty,
            )
            .await
    }

    /// `POST /v1/workload/thaw`: thaws the workload; fine when it is not frozen.
    pub async fn thaw_workload(&self) -> Result<(), GuestError> {
        self.transport()
            .unit(
                Method::POST,
                Target::new(routes::WORKLOAD_THAW),
                Body::Empty,
            )
            .await
    }

    /// `GET /v1/activity`: the guest's cumulative activity counters; compare two samples.
    pub async fn activity(&self) -> Result<Activity, GuestError> {
        self.transport()
            .json(
                Method::GET,
                Target::new(routes::ACTIVITY),
                Body::Empty,
                MAX_JSON_BODY,
            )
            .await
    }

    /// `GET /v1/metrics`: the guest's CPU (cumulative ticks), memory and root-disk use.
    /// Housekeeping: it does not count as activity.
    pub async fn metrics(&self) -> Result<GuestMetrics, GuestError> {
        self.transport()
            .json(
                Method::GET,
                Target::new(routes::METRICS),
                Body::Empty,
                MAX_JSON_BODY,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freeze_timeout_is_checked_locally() {
        assert_eq!(
            freeze_request(Duration::from_secs(5)).unwrap().timeout_ms,
            5000
        );
        for bad in [
            Duration::ZERO,
            Duration::from_micros(999),
            Duration::from_millis(30_001),
            Duration::from_secs(u64::MAX),
        ] {
            let e = freeze_request(bad).unwrap_err();
            assert!(matches!(e, GuestError::Local(_)), "{bad:?}: {e}");
            assert_eq!(e.code(), ErrorCode::InvalidRequest);
        }
        assert_eq!(
            freeze_request(Duration::from_millis(30_000))
                .unwrap()
                .timeout_ms,
            30_000
        );
    }
}

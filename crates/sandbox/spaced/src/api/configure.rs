//! `GET /v1/health` and `POST /v1/configure`.

use axum::http::StatusCode;
use axum::Json;
use space_core::process::{validate_env, validate_user_name};
use space_guest_proto::{GuestConfig, Health};

use super::{ApiJson, St};
use crate::error::ApiError;
use crate::{resize, system};

/// Daemon version reported in READY and health.
pub const DAEMON_VERSION: &str = env!("CARGO_PKG_VERSION");

pub(super) async fn health(axum::extract::State(st): St) -> Json<Health> {
    Json(Health {
        version: DAEMON_VERSION.to_owned(),
        boot_id: st.boot_id.clone(),
        uptime_ms: st.started.elapsed().as_millis() as u64,
        processes: st.processes.running() as u32,
    })
}

pub(super) async fn configure(
    axum::extract::State(st): St,
    ApiJson(cfg): ApiJson<GuestConfig>,
) -> Result<StatusCode, ApiError> {
    cfg.validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    validate_env(&cfg.env)
        .map_err(|k| ApiError::invalid(format!("bad environment variable '{k}'")))?;
    validate_user_name(&cfg.default_user).map_err(|_| ApiError::invalid("bad default_user"))?;

    {
        let mut env = cfg.env;
        if cfg.trusted_ca_pem.is_some() {
            for (k, v) in crate::trust::TRUST_ENV {
                env.entry((*k).to_owned())
                    .or_insert_with(|| (*v).to_owned());
            }
        }
        let mut c = st.config.write().unwrap_or_else(|p| p.into_inner());
        c.env = env;
        c.default_user = cfg.default_user.clone();
        c.default_workdir = cfg.default_workdir.clone();
    }
    if crate::users::lookup(&cfg.default_user).is_err() {
        tracing::warn!(user = %cfg.default_user, "default user does not exist; processes will run as root");
    }

    if st.host_safe {
        tracing::info!(hostname = %cfg.hostname, resize_root = cfg.resize_root, "development channel: not changing hostname, clock or disks");
        return Ok(StatusCode::NO_CONTENT);
    }
    apply_hostname_and_clock(&cfg.hostname, cfg.time_unix_ms).await?;
    if let Some(net) = cfg.network.clone() {
        // /etc/resolv.conf is on the root disk, which may be frozen: not on a runtime thread.
        let ifname = tokio::task::spawn_blocking(move || crate::netconfig::apply(&net))
            .await?
            .map_err(|e| ApiError::internal(format!("configure the network: {e}")))?;
        tracing::info!(interface = %ifname, "network configured");
    }
    if let Some(pem) = cfg.trusted_ca_pem {
        // The trust store is on the root disk, which may be frozen: not on a runtime thread.
        tokio::task::spawn_blocking(move || crate::trust::install(&pem))
            .await?
            .map_err(|e| ApiError::internal(format!("install the sandbox CA: {e}")))?;
        tracing::info!("sandbox CA trusted");
    }
    if cfg.resize_root {
        let res = tokio::task::spawn_blocking(|| resize::grow(std::path::Path::new("/"))).await?;
        match res {
            Ok(r) => {
                tracing::info!(device = %r.device, bytes = r.device_bytes, blocks = r.blocks, "root file system resized")
            }
            Err(e @ resize::ResizeError::NotExt4 { .. }) => {
                tracing::warn!(error = %e, "root not resized")
            }
            Err(e) => return Err(ApiError::internal(format!("resize root file system: {e}"))),
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Sets the hostname (and its `/etc/hosts` entry) and, when `time_unix_ms` is positive, the
/// wall clock: what configure and identity both do. The hostname must be valid already.
pub(super) async fn apply_hostname_and_clock(
    hostname: &str,
    time_unix_ms: i64,
) -> Result<(), ApiError> {
    let name = hostname.to_owned();
    // /etc/hosts is on the root disk, which may be frozen: not on a runtime thread.
    tokio::task::spawn_blocking(move || system::apply_hostname(&name))
        .await?
        .map_err(|e| ApiError::internal(format!("sethostname: {e}")))?;
    if time_unix_ms > 0 {
        system::set_clock(time_unix_ms)
            .map_err(|e| ApiError::internal(format!("clock_settime: {e}")))?;
    }
    Ok(())
}

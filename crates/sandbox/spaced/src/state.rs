//! State shared by every session of one daemon run: identity, configuration from the node,
//! and the process table. Sessions come and go; this outlives them, so a host that
//! reconnects finds its processes and their output.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use space_core::process::validate_user_name;
use space_core::ErrorCode;
use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::files::paths;
use crate::fsfreeze::FsFreezer;
use crate::process::ProcessManager;
use crate::users::{self, UserError, UserInfo};
use crate::workload::Workload;

/// The template's conventional default user (see `ProcessSpec::user`).
pub const INITIAL_DEFAULT_USER: &str = "user";

/// What `POST /v1/configure` changes at run time.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Environment every process gets.
    pub env: BTreeMap<String, String>,
    /// User when a request names none.
    pub default_user: String,
    /// Working directory when a request names none (else the user's home).
    pub default_workdir: Option<String>,
}

/// Shared state.
#[derive(Debug)]
pub struct AppState {
    /// Random id of this boot.
    pub boot_id: String,
    /// When the daemon started.
    pub started: Instant,
    /// Development channel (Unix socket on a host): never change the machine's hostname,
    /// clock or disks.
    pub host_safe: bool,
    /// Configuration.
    pub config: RwLock<RuntimeConfig>,
    /// Processes.
    pub processes: Arc<ProcessManager>,
    /// The workload cgroup every process runs in.
    pub workload: Arc<Workload>,
    /// The file-system freeze this daemon holds.
    pub freezer: Arc<FsFreezer>,
    /// Requests served, housekeeping excepted (`GET /v1/activity`).
    pub api_requests: AtomicU64,
    /// Permits for directory watches (`MAX_WATCH_STREAMS`).
    pub watches: Arc<Semaphore>,
    /// Permits for connections to guest ports (`MAX_PORT_CONNECTIONS`).
    pub port_connections: Arc<Semaphore>,
}

impl AppState {
    /// A copy of the current configuration.
    pub fn config(&self) -> RuntimeConfig {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The acting user: the named one (which must exist), else the configured default
    /// (falling back to root if the default does not exist).
    pub fn user(&self, requested: Option<&str>) -> Result<UserInfo, ApiError> {
        let io_err = |e: UserError| ApiError::internal(e.to_string());
        match requested {
            Some(name) => {
                validate_user_name(name).map_err(|_| {
                    ApiError::invalid(format!("bad user name '{}'", name.escape_debug()))
                })?;
                users::lookup(name).map_err(|e| match e {
                    UserError::NotFound(_) => ApiError::new(ErrorCode::UnknownUser, e.to_string()),
                    e => io_err(e),
                })
            }
            None => {
                let default = self.config().default_user;
                match users::lookup(&default) {
                    Ok(u) => Ok(u),
                    Err(UserError::NotFound(_)) => match users::lookup("root") {
                        Ok(u) => Ok(u),
                        Err(UserError::NotFound(_)) => Ok(UserInfo::root()),
                        Err(e) => Err(io_err(e)),
                    },
                    Err(e) => Err(io_err(e)),
                }
            }
        }
    }

    /// Validates a request path and resolves it for `user`.
    pub fn path_for(&self, user: &UserInfo, path: &str) -> Result<PathBuf, ApiError> {
        space_core::files::validate_path(path)
            .map_err(|e| ApiError::new(ErrorCode::InvalidPath, e.to_string()))?;
        Ok(paths::resolve(&user.home, path))
    }
}

//! The HTTP API: state, router, and one module per resource.
//!
//! Every `/v1` route is authenticated by the [`auth`] middleware (a route cannot forget it),
//! scoped to the caller's tenant, accepts an `Idempotency-Key` on mutating requests
//! ([`idempotency`]), and is documented: the router and the OpenAPI document are
//! built from the same annotated handlers ([`openapi`]), so they cannot drift apart.

pub mod action_log;
pub mod audit;
pub mod auth;
pub mod credentials;
pub mod customer_keys;
pub mod egress;
pub mod error;
pub mod extract;
pub mod files;
pub mod idempotency;
pub mod lifecycle;
pub mod metrics;
pub mod nodes;
pub mod openapi;
pub mod processes;
pub mod quota;
pub mod sandboxes;
pub mod snapshots;
pub mod templates;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Router;
use space_core::process::ProcessSpec;
use space_core::{ErrorCode, SandboxId, SandboxState, TenantId};
use space_guest_client::GuestClient;

use crate::nodes::{NodeApi, Nodes, PauseCause};

use crate::db::{Db, DesiredState, SandboxRow};
use error::ApiError;

/// Default upper bound on a file upload.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 1024 * 1024 * 1024;

/// Shortest deadline a sandbox woken by a call (`auto_resume`) is given, seconds: the wake
/// must leave the call that caused it, and the next ones, time to run. E2B gives traffic-woken
/// sandboxes the same floor (its `minimum-autoresume-timeout`, 300 s).
pub const WAKE_MIN_SECS: u64 = 300;

/// Everything a handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Desired state, tenants, keys.
    pub db: Db,
    /// The nodes sandboxes run on (live state, guests).
    pub nodes: Nodes,
    /// Largest file upload accepted.
    pub max_upload_bytes: u64,
    /// This process as a replica of the control plane (its id names what it claims).
    pub replica: crate::replica::Replica,
    /// Tenants' quotas and request rates.
    pub quotas: crate::quotas::Quotas,
    /// The cluster CA's fingerprint, on a cluster replica (join tokens pin it).
    pub cluster_ca_fingerprint: Option<String>,
    /// Seals credential values for the catalog (the control plane's credential key).
    pub credential_sealer: Arc<crate::service::credentials::CredentialSealer>,
    /// The nodes whose credentials this replica is syncing now.
    pub credential_syncs: crate::service::credentials::SyncsUnderWay,
    /// Where suspended sandboxes' snapshots are (checked at each suspend, collected by the
    /// leader); `None`: no suspend.
    pub objects: Option<space_objects::Objects>,
    /// The operator's key services and recent checks of tenants' customer keys.
    pub customer_keys: Arc<crate::service::customer_keys::CustomerKeys>,
}

impl AppState {
    /// State for a set of nodes and a database, as `replica`, sealing credential values
    /// with `credential_key`.
    pub fn new(
        db: Db,
        nodes: Nodes,
        replica: crate::replica::Replica,
        credential_key: space_secrets::keyfile::KeyBytes,
        max_upload_bytes: u64,
    ) -> Self {
        let quotas = crate::quotas::Quotas::new(
            db.clone(),
            replica.id().clone(),
            space_core::quota::TenantQuota::embedded_default(),
        );
        Self {
            db,
            nodes,
            max_upload_bytes,
            replica,
            quotas,
            cluster_ca_fingerprint: None,
            credential_sealer: Arc::new(crate::service::credentials::CredentialSealer::new(
                credential_key,
            )),
            credential_syncs: Default::default(),
            objects: None,
            customer_keys: Arc::new(crate::service::customer_keys::CustomerKeys::new(
                Default::default(),
                crate::service::customer_keys::DEFAULT_CHECK_TTL,
            )),
        }
    }

    /// The same, with `defaults` as the operator's quota for every tenant.
    pub fn with_default_quota(mut self, defaults: space_core::quota::TenantQuota) -> Self {
        self.quotas.defaults = defaults;
        self
    }

    /// A tenant's sandbox in any desired state, or 404 (also for another tenant's).
    pub async fn find_sandbox(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Result<SandboxRow, ApiError> {
        self.db
            .sandbox(tenant, id)
            .await?
            .ok_or_else(|| ApiError::sandbox_not_found(id))
    }

    /// The node that holds the sandbox of `row`; a suspended sandbox is held by none
    /// (`409`: resume it first).
    pub async fn node_of(&self, row: &SandboxRow) -> Result<Arc<dyn NodeApi>, ApiError> {
        if row.suspended_snapshot.is_some() {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "sandbox {} is suspended: resume it first (POST /v1/sandboxes/{}/resume)",
                    row.id, row.id
                ),
            ));
        }
        self.refresh_if_unavailable(&row.node).await?;
        Ok(self.nodes.get(&row.node)?)
    }

    /// After node `name` did not answer: whether the database has declared it lost (another
    /// replica's sweep may have, a moment ago); reloads the node set to know.
    pub async fn lost_since_asked(&self, name: &str) -> Result<bool, ApiError> {
        if !self.nodes.is_cluster() {
            return Ok(false);
        }
        self.nodes.refresh(&self.db.nodes().await?);
        Ok(self.nodes.state(name) == Some(crate::scheduler::NodeState::Lost))
    }

    /// In a cluster, reloads the node set when this replica believes node `name` lost or
    /// unknown: another replica may have let it back (or in) a moment ago, and a sandbox
    /// must not be refused for a stale cache. Ready nodes cost nothing.
    pub async fn refresh_if_unavailable(&self, name: &str) -> Result<(), ApiError> {
        if self.nodes.is_cluster()
            && matches!(
                self.nodes.state(name),
                None | Some(crate::scheduler::NodeState::Lost)
            )
        {
            self.nodes.refresh(&self.db.nodes().await?);
        }
        Ok(())
    }

    /// A tenant's sandbox that has not been deleted, or 404.
    pub async fn live_sandbox(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Result<SandboxRow, ApiError> {
        let row = self.find_sandbox(tenant, id).await?;
        if row.desired_state != DesiredState::Running {
            return Err(ApiError::sandbox_not_found(id));
        }
        Ok(row)
    }

    /// The channel to a tenant's live sandbox; a sandbox that idleness paused is resumed
    /// first (the call that needs the guest is what wakes it), and so, with `auto_resume`,
    /// is one its timeout paused (or started, one its timeout stopped). A sandbox woken so
    /// runs again: its deadline is renewed. A sandbox a client paused or stopped, or a
    /// timed-out one without `auto_resume`, is `409 conflict` naming its state.
    pub async fn guest(&self, tenant: &TenantId, id: &SandboxId) -> Result<GuestClient, ApiError> {
        let mut row = self.live_sandbox(tenant, id).await?;
        if row.suspended_snapshot.is_some() && row.auto_resume {
            // Suspended with auto_resume: the call that needs the guest brings it back
            // (through the customer-key gate, as every resume).
            crate::service::suspend::resume(self, row).await?;
            self.db
                .renew_timeout_at_least(id, crate::db::now_ms(), WAKE_MIN_SECS)
                .await?;
            row = self.live_sandbox(tenant, id).await?;
        }
        // In its own task: a client that hangs up must not cancel a resume half-way.
        let st = self.clone();
        let node = self.node_of(&row).await?;
        let id = id.clone();
        let tenant = tenant.clone();
        tokio::spawn(async move {
            let record = node.sandbox(&id).await?;
            // A sandbox that must be woken passes the customer-key gate first, as every
            // resume does; one that runs is served (revocation does not stop it).
            if record.as_ref().is_some_and(|r| r.state != SandboxState::Running) {
                crate::service::customer_keys::require_usable(&st, &tenant).await?;
            }
            let timed_out = row.auto_resume && node.wake_timed_out(&id).await?;
            let idle = record.is_some_and(|r| {
                r.state == SandboxState::Paused && r.paused_by == Some(PauseCause::Idle)
            });
            let guest = node.guest(&id).await?;
            if timed_out {
                // Its timeout may be seconds (an E2B client's `set_timeout(2)`): renewed by
                // that alone, it would pause again under the call that woke it.
                st.db
                    .renew_timeout_at_least(&id, crate::db::now_ms(), WAKE_MIN_SECS)
                    .await?;
                tracing::info!(sandbox = %id, "woke the timed-out sandbox; its deadline is renewed");
            } else if idle {
                st.db.renew_timeout(&id, crate::db::now_ms()).await?;
                tracing::info!(sandbox = %id, "woke the idle sandbox; its deadline is renewed");
            }
            Ok(guest)
        })
        .await
        .map_err(ApiError::internal)?
    }
}

impl AppState {
    /// `spec` as it is started in sandbox `id`: with what the node adds to every process's
    /// environment (the sandbox's credential placeholders, as they are now), below the
    /// spec's own variables. Every process start goes through here.
    pub async fn process_spec(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        spec: &ProcessSpec,
    ) -> Result<ProcessSpec, ApiError> {
        let row = self.live_sandbox(tenant, id).await?;
        let mut spec = spec.clone();
        for (name, value) in self.node_of(&row).await?.process_env(id).await? {
            spec.env.entry(name).or_insert(value);
        }
        Ok(spec)
    }
}

/// The whole application: documented routes, auth, error-format fallbacks.
pub fn build_app(state: AppState) -> Router {
    let (router, doc) = openapi::router_and_doc(state.clone());
    let doc = Arc::new(doc);
    router
        .layer(axum::Extension(openapi::OpenApiDocument(doc)))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

async fn fallback(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> impl IntoResponse {
    // No error code means "method not allowed"; keep the body format and the honest status.
    let mut err = ApiError::new(
        ErrorCode::InvalidRequest,
        format!(
            "method {} is not allowed on {}",
            req.method(),
            req.uri().path()
        ),
    );
    err.status = StatusCode::METHOD_NOT_ALLOWED;
    err
}

//! `/v1/credentials` (the secrets the egress gateways inject into sandbox requests:
//! [`crate::service::credentials`]) and `/v1/audit/credentials`, their decision log. Values
//! are write-only: they go in with a create or replace and never come out of the API (nor
//! into any sandbox, log or audit entry). A tenant sees and manages only its own
//! credentials; the scope names the tenant implicitly (the caller's), optionally a project
//! or one of its sandboxes.

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use space_core::{ErrorBody, SandboxId};
use space_secrets::rule::CredentialRule;
use space_secrets::{AuditEvent, AuditFilter, Credential, CredentialId, Scope};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, ApiQuery};
use super::AppState;
use crate::service::credentials::{self, NewCredential, ScopeRequest};
use crate::service::Caller;
use space_core::error::excerpt;

/// Whom a credential is for, within the caller's tenant.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CredentialScope {
    /// Every sandbox of the tenant.
    #[default]
    Tenant,
    /// The tenant's sandboxes created in this project.
    Project {
        /// Project name.
        project: String,
    },
    /// One sandbox.
    Sandbox {
        /// Sandbox id.
        #[schema(value_type = String)]
        sandbox: SandboxId,
    },
}

/// `POST /v1/credentials`, `PUT /v1/credentials/{id}`.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialRequest {
    /// Name, unique within the scope (`[A-Za-z][A-Za-z0-9_-]*`); with a placeholder it is
    /// also the guest's environment variable.
    pub name: String,
    /// Default: the whole tenant. For one name, the most specific scope covering a sandbox
    /// wins (sandbox > project > tenant).
    #[serde(default)]
    pub scope: CredentialScope,
    /// Where it may go and how it is injected: `{"hosts": ["api.example.com"],
    /// "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
    /// "methods": ["GET"], "paths": ["/v1/*"], "require_tls": true,
    /// "rate_limit": {"requests": 100, "per_secs": 60}, "placeholder": false}`. A
    /// credential for image registries lists them: `"registries": ["ghcr.io"]` with a
    /// `basic_auth` injection (the registry user); `hosts` may then be empty.
    #[schema(value_type = Object)]
    pub rule: CredentialRule,
    /// After this instant (ms since the Unix epoch) every request that would use it is denied.
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    /// The secret value. Write-only: never returned.
    pub value: String,
}

impl std::fmt::Debug for CredentialRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialRequest")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// A credential as the API shows it: everything but the value.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CredentialInfo {
    /// Id (`crd-…`).
    pub id: String,
    /// Name.
    pub name: String,
    /// Whom it is for.
    pub scope: CredentialScope,
    /// Where and how it is injected.
    #[schema(value_type = Object)]
    pub rule: CredentialRule,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
    /// Expiry, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

/// `GET /v1/credentials`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CredentialList {
    /// By name, then scope.
    pub credentials: Vec<CredentialInfo>,
}

fn info(c: Credential) -> CredentialInfo {
    CredentialInfo {
        id: c.id.to_string(),
        name: c.name.to_string(),
        scope: match c.scope {
            Scope::Tenant { .. } => CredentialScope::Tenant,
            Scope::Project { project, .. } => CredentialScope::Project {
                project: project.to_string(),
            },
            Scope::Sandbox { sandbox, .. } => CredentialScope::Sandbox { sandbox },
        },
        rule: c.rule,
        created_at_ms: c.created_at_ms,
        expires_at_ms: c.expires_at_ms,
    }
}

impl CredentialRequest {
    fn into_new(self) -> NewCredential {
        NewCredential {
            name: self.name,
            scope: match self.scope {
                CredentialScope::Tenant => ScopeRequest::Tenant,
                CredentialScope::Project { project } => ScopeRequest::Project(project),
                CredentialScope::Sandbox { sandbox } => ScopeRequest::Sandbox(sandbox),
            },
            rule: self.rule,
            expires_at_ms: self.expires_at_ms,
            value: self.value,
        }
    }
}

/// The `{id}` of `/v1/credentials/{id}`, parsed.
pub struct CredentialPath(pub CredentialId);

impl<S: Send + Sync> FromRequestParts<S> for CredentialPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        id.parse::<CredentialId>().map(CredentialPath).map_err(|_| {
            ApiError::invalid(format!("malformed credential id {:?}", excerpt(&id, 64)))
        })
    }
}

/// Create a credential.
#[utoipa::path(
    post,
    path = "/v1/credentials",
    tag = "credentials",
    request_body = CredentialRequest,
    responses(
        (status = 201, description = "Stored (the value is not echoed)", body = CredentialInfo),
        (status = 400, description = "Invalid name, scope, rule or value", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "The scope's sandbox does not exist", body = ErrorBody),
        (status = 409, description = "The name is taken in that scope", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_credential(
    State(st): State<AppState>,
    tenant: Caller,
    ApiJson(req): ApiJson<CredentialRequest>,
) -> ApiResult<(StatusCode, Json<CredentialInfo>)> {
    let credential = credentials::create(&st, &tenant, req.into_new()).await?;
    Ok((StatusCode::CREATED, Json(info(credential))))
}

/// Replace a credential's name, scope, rule, expiry and value.
#[utoipa::path(
    put,
    path = "/v1/credentials/{id}",
    tag = "credentials",
    params(("id" = String, Path, description = "Credential id")),
    request_body = CredentialRequest,
    responses(
        (status = 200, description = "Replaced", body = CredentialInfo),
        (status = 400, description = "Invalid name, scope, rule or value", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such credential", body = ErrorBody),
        (status = 409, description = "The name is taken in that scope", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn replace_credential(
    State(st): State<AppState>,
    tenant: Caller,
    CredentialPath(id): CredentialPath,
    ApiJson(req): ApiJson<CredentialRequest>,
) -> ApiResult<Json<CredentialInfo>> {
    let credential = credentials::replace(&st, &tenant, &id, req.into_new()).await?;
    Ok(Json(info(credential)))
}

/// The caller's credentials (metadata only).
#[utoipa::path(
    get,
    path = "/v1/credentials",
    tag = "credentials",
    responses(
        (status = 200, description = "Credentials", body = CredentialList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_credentials(
    State(st): State<AppState>,
    tenant: Caller,
) -> ApiResult<Json<CredentialList>> {
    let credentials = credentials::list(&st, &tenant)
        .await?
        .into_iter()
        .map(info)
        .collect();
    Ok(Json(CredentialList { credentials }))
}

/// One credential (metadata only).
#[utoipa::path(
    get,
    path = "/v1/credentials/{id}",
    tag = "credentials",
    params(("id" = String, Path, description = "Credential id")),
    responses(
        (status = 200, description = "The credential", body = CredentialInfo),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such credential", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_credential(
    State(st): State<AppState>,
    tenant: Caller,
    CredentialPath(id): CredentialPath,
) -> ApiResult<Json<CredentialInfo>> {
    Ok(Json(info(credentials::get(&st, &tenant, &id).await?)))
}

/// Delete a credential: from now on no request gets it.
#[utoipa::path(
    delete,
    path = "/v1/credentials/{id}",
    tag = "credentials",
    params(("id" = String, Path, description = "Credential id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such credential", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_credential(
    State(st): State<AppState>,
    tenant: Caller,
    CredentialPath(id): CredentialPath,
) -> ApiResult<StatusCode> {
    credentials::delete(&st, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Filters of `GET /v1/audit/credentials`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// Only this sandbox's entries.
    #[param(value_type = Option<String>)]
    sandbox: Option<SandboxId>,
    /// Only this credential's entries.
    #[param(value_type = Option<String>)]
    credential: Option<CredentialId>,
    /// Only entries at or after this instant (ms since the Unix epoch).
    since_ms: Option<i64>,
    /// At most this many (default 100, at most 1000), the most recent.
    limit: Option<usize>,
}

/// `GET /v1/audit/credentials`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    /// Oldest first: `{ts_ms, event: resolve|inject|deny, tenant, sandbox, credential_id,
    /// credential_name, host, method, path, decision: allow|deny, reason}`.
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<AuditEvent>,
}

/// The caller's credential audit log: every resolution, injection and denial (never a value).
#[utoipa::path(
    get,
    path = "/v1/audit/credentials",
    tag = "credentials",
    params(AuditParams),
    responses(
        (status = 200, description = "Entries, newest first (repeated denials collapsed into one line with `repeated`)", body = AuditList),
        (status = 400, description = "Bad filter", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn audit(
    State(st): State<AppState>,
    tenant: Caller,
    ApiQuery(q): ApiQuery<AuditParams>,
) -> ApiResult<Json<AuditList>> {
    let filter = AuditFilter {
        tenant: Some(tenant.id.clone()),
        sandbox: q.sandbox,
        credential: q.credential,
        since_ms: q.since_ms,
        limit: q
            .limit
            .unwrap_or(100)
            .min(space_secrets::audit::MAX_AUDIT_QUERY_LIMIT),
    };
    let events = st.nodes.audit(&filter).await?;
    Ok(Json(AuditList { events }))
}

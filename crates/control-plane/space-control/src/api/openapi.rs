//! The OpenAPI document and the router, built together from the annotated handlers, plus the
//! two unauthenticated endpoints (`/healthz`, `/openapi.json`).
//!
//! Every route is registered through `utoipa_axum::routes!`, which takes its method and path
//! from the handler's `#[utoipa::path]`: a route cannot exist without being documented.

use std::sync::Arc;

use axum::extract::Extension;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::{middleware, Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{
    action_log, audit, auth, credentials, customer_keys, egress, files, idempotency, lifecycle,
    metrics, nodes, processes, quota, sandboxes, snapshots, templates, AppState,
};

/// The generated document, shared with the `/openapi.json` handler.
#[derive(Clone)]
pub struct OpenApiDocument(pub Arc<OpenApiDoc>);

#[derive(OpenApi)]
#[openapi(
    info(
        title = "SPACE API",
        description = "Sandboxes for AI agents: each sandbox is a microVM. Authenticate with `Authorization: Bearer <api key>`. Every error is `{\"code\": ..., \"message\": ...}`. Mutating requests (POST, PUT, PATCH, DELETE) accept an `Idempotency-Key` header that makes retries safe.",
        license(name = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "meta", description = "Health and this document"),
        (name = "templates", description = "Templates sandboxes start from"),
        (name = "sandboxes", description = "Sandbox lifecycle: create, pause/resume, stop/start, rollback, fork, events"),
        (name = "snapshots", description = "Disk snapshots and full checkpoints of a sandbox, and the tenant's, persistent ones of deleted sandboxes included"),
        (name = "pool", description = "The node's warm pool"),
        (name = "processes", description = "Processes inside a sandbox"),
        (name = "files", description = "Files inside a sandbox"),
        (name = "egress", description = "What may leave a sandbox: per-sandbox egress policies and the tenant's default"),
        (name = "credentials", description = "Secrets the egress gateway injects into sandbox requests (write-only values) and their audit log"),
        (name = "customer keys", description = "The tenant's own key at the operator's key services (KMIP, PKCS#11, a helper, the local one): what its data at rest is sealed under, its rotation and revocation"),
        (name = "nodes", description = "The cluster's nodes and the one-time tokens that join them (the operator's tenant)"),
    ),
    components(schemas(space_core::ErrorBody, space_core::ErrorCode))
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the server answers.
    pub status: String,
    /// Server version.
    pub version: String,
}

/// Liveness check (no authentication).
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, description = "Serving", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

/// This document (no authentication).
#[utoipa::path(get, path = "/openapi.json", tag = "meta", responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json")))]
pub async fn openapi_json(Extension(doc): Extension<OpenApiDocument>) -> Response {
    match doc.0.to_json() {
        Ok(json) => ([(CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => super::error::ApiError::internal(e).into_response(),
    }
}

/// The authenticated `/v1` routes.
fn v1_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(
            templates::list_templates,
            templates::build_template
        ))
        .routes(routes!(templates::get_template, templates::delete_template))
        .routes(routes!(templates::get_build))
        .routes(routes!(templates::list_template_cache))
        .routes(routes!(templates::prune_template_cache))
        .routes(routes!(
            templates::put_build_files,
            templates::get_build_files
        ))
        .routes(routes!(
            sandboxes::create_sandbox,
            sandboxes::list_sandboxes
        ))
        .routes(routes!(sandboxes::get_sandbox, sandboxes::delete_sandbox))
        .routes(routes!(sandboxes::set_timeout))
        .routes(routes!(sandboxes::revoke_tokens))
        .routes(routes!(sandboxes::console))
        .routes(routes!(metrics::metrics))
        .routes(routes!(lifecycle::pause))
        .routes(routes!(lifecycle::resume))
        .routes(routes!(lifecycle::suspend))
        .routes(routes!(lifecycle::stop))
        .routes(routes!(lifecycle::start))
        .routes(routes!(lifecycle::rollback))
        .routes(routes!(lifecycle::fork))
        .routes(routes!(lifecycle::events))
        .routes(routes!(lifecycle::pool))
        .routes(routes!(
            snapshots::list_snapshots,
            snapshots::create_snapshot
        ))
        .routes(routes!(snapshots::delete_snapshot))
        .routes(routes!(snapshots::diff_snapshots))
        .routes(routes!(snapshots::list_tenant_snapshots))
        .routes(routes!(
            snapshots::get_tenant_snapshot,
            snapshots::delete_tenant_snapshot
        ))
        .routes(routes!(processes::start_process, processes::list_processes))
        .routes(routes!(processes::get_process))
        .routes(routes!(processes::output))
        .routes(routes!(processes::stdin))
        .routes(routes!(processes::signal))
        .routes(routes!(processes::resize))
        .routes(routes!(processes::exec))
        .routes(routes!(files::read_file, files::write_file, files::remove))
        .routes(routes!(files::stat))
        .routes(routes!(files::list))
        .routes(routes!(files::mkdir))
        .routes(routes!(files::rename))
        .routes(routes!(files::watch))
        .routes(routes!(
            egress::get_sandbox_egress,
            egress::set_sandbox_egress
        ))
        .routes(routes!(
            egress::get_tenant_egress,
            egress::set_tenant_egress,
            egress::clear_tenant_egress
        ))
        .routes(routes!(
            credentials::create_credential,
            credentials::list_credentials
        ))
        .routes(routes!(
            credentials::get_credential,
            credentials::replace_credential,
            credentials::delete_credential
        ))
        .routes(routes!(credentials::audit))
        .routes(routes!(
            customer_keys::get_customer_key,
            customer_keys::put_customer_key,
            customer_keys::delete_customer_key
        ))
        .routes(routes!(customer_keys::list_key_services))
        .routes(routes!(customer_keys::check_customer_key))
        .routes(routes!(customer_keys::rotate_customer_key))
        .routes(routes!(audit::audit_log))
        .routes(routes!(nodes::list_nodes))
        .routes(routes!(nodes::create_join_token))
        .routes(routes!(nodes::cordon_node))
        .routes(routes!(nodes::uncordon_node))
        .routes(routes!(nodes::drain_node))
        .routes(routes!(nodes::remove_node))
        .routes(routes!(quota::my_quota))
        .routes(routes!(
            quota::get_tenant_quota,
            quota::set_tenant_quota,
            quota::clear_tenant_quota
        ))
}

/// The public routes.
fn public_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(openapi_json))
}

/// The router (with state applied) and its OpenAPI document.
pub fn router_and_doc(state: AppState) -> (Router, OpenApiDoc) {
    let (v1, v1_doc) = v1_routes().split_for_parts();
    // route_layer: only matched routes authenticate, so unknown paths stay 404. The layer
    // added last runs first: authentication, the key's request rate, idempotency keys
    // (scoped to the tenant), then the action log (so a replay is not recorded twice).
    let v1 = v1
        .route_layer(middleware::from_fn_with_state(
            state.db.clone(),
            action_log::record,
        ))
        .route_layer(middleware::from_fn_with_state(
            idempotency::Idempotency::new(state.db.clone(), state.replica.clone()),
            idempotency::idempotency,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            quota::rate_limit,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_api_key,
        ));
    let (public, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(public_routes())
        .split_for_parts();
    doc.merge(v1_doc);
    idempotency::document(&mut doc);
    (public.merge(v1).with_state(state), doc)
}

/// The document alone (for tooling and tests).
pub fn document() -> OpenApiDoc {
    let (_, v1_doc) = v1_routes().split_for_parts();
    let (_, mut doc) = OpenApiRouter::<AppState>::with_openapi(ApiDoc::openapi())
        .merge(public_routes())
        .split_for_parts();
    doc.merge(v1_doc);
    idempotency::document(&mut doc);
    doc
}

//! `/v1/customer-key`: the tenant's own key at one of the operator's key services, which
//! everything SPACE keeps of the tenant at rest is sealed under
//! ([`crate::service::customer_keys`]). Credentials are write-only.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use space_core::ErrorBody;

use super::error::ApiResult;
use super::extract::ApiJson;
use super::AppState;
use crate::service::customer_keys::{
    self, CustomerKeyRequest, CustomerKeyView, KeyServiceInfo, RotateRequest, Rotation,
};
use crate::service::Caller;

/// The operator's key services a customer key may be at.
#[utoipa::path(
    get,
    path = "/v1/customer-key/services",
    tag = "customer keys",
    responses(
        (status = 200, description = "Name and kind (`kmip`, `pkcs11`, `command`, `local`) of each", body = Vec<KeyServiceInfo>),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_key_services(
    State(st): State<AppState>,
    _caller: Caller,
) -> ApiResult<Json<Vec<KeyServiceInfo>>> {
    Ok(Json(customer_keys::services(&st)))
}

/// The tenant's customer key: its versions, and how many data keys each wraps.
#[utoipa::path(
    get,
    path = "/v1/customer-key",
    tag = "customer keys",
    responses(
        (status = 200, description = "The key (credentials never shown)", body = CustomerKeyView),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "The tenant has none", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_customer_key(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<CustomerKeyView>> {
    Ok(Json(customer_keys::get(&st, &caller).await?))
}

/// Register the tenant's customer key. It must wrap and unwrap a throwaway data key at its
/// key service first. From then on, the tenant's snapshots, checkpoints, suspended and
/// persistent snapshots and credentials are sealed under data keys it wraps, and every
/// start, resume, restore and create-from-snapshot checks it.
#[utoipa::path(
    put,
    path = "/v1/customer-key",
    tag = "customer keys",
    request_body = CustomerKeyRequest,
    responses(
        (status = 200, description = "Registered", body = CustomerKeyView),
        (status = 400, description = "No such key service, or a malformed key id or credentials", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "`key_unavailable`: the key service refused the key (not found, revoked, credentials refused)", body = ErrorBody),
        (status = 409, description = "The tenant has one already: rotate it", body = ErrorBody),
        (status = 503, description = "`key_service_unavailable`: the key service did not answer", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn put_customer_key(
    State(st): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<CustomerKeyRequest>,
) -> ApiResult<Json<CustomerKeyView>> {
    Ok(Json(customer_keys::register(&st, &caller, req).await?))
}

/// Remove the tenant's customer key: only once nothing is sealed under it.
#[utoipa::path(
    delete,
    path = "/v1/customer-key",
    tag = "customer keys",
    responses(
        (status = 204, description = "Removed"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "The tenant has none", body = ErrorBody),
        (status = 409, description = "Artifacts are still sealed under it", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_customer_key(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<StatusCode> {
    customer_keys::remove(&st, &caller).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Check the tenant's customer key with its key service now (a wrap and an unwrap).
#[utoipa::path(
    post,
    path = "/v1/customer-key/check",
    tag = "customer keys",
    responses(
        (status = 200, description = "Usable", body = CustomerKeyView),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "`key_unavailable`: revoked, disabled, destroyed, or access withdrawn", body = ErrorBody),
        (status = 404, description = "The tenant has none", body = ErrorBody),
        (status = 503, description = "`key_service_unavailable`", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn check_customer_key(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<CustomerKeyView>> {
    Ok(Json(customer_keys::check_now(&st, &caller).await?))
}

/// Rotate: a new version (another key, or the same with new credentials) becomes current
/// and every data key is re-wrapped under it, online, without re-encrypting any artifact.
#[utoipa::path(
    post,
    path = "/v1/customer-key/rotate",
    tag = "customer keys",
    request_body = RotateRequest,
    responses(
        (status = 200, description = "Rotated; how many data keys were re-wrapped", body = Rotation),
        (status = 400, description = "No such key service, or a malformed key id or credentials", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "`key_unavailable`: the new version's key service refused it", body = ErrorBody),
        (status = 404, description = "The tenant has none", body = ErrorBody),
        (status = 409, description = "Another rotation won meanwhile", body = ErrorBody),
        (status = 503, description = "`key_service_unavailable`", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn rotate_customer_key(
    State(st): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<RotateRequest>,
) -> ApiResult<Json<Rotation>> {
    Ok(Json(customer_keys::rotate(&st, &caller, req).await?))
}

//! `GET /v1/templates`: the templates sandboxes can be created from.

use axum::extract::State;
use axum::Json;
use space_core::template::TemplateInfo;
use space_core::ErrorBody;

use super::error::ApiResult;
use super::AppState;
use crate::service::Caller;

/// List the templates on the node.
#[utoipa::path(
    get,
    path = "/v1/templates",
    tag = "templates",
    responses(
        (status = 200, description = "Templates, by name", body = [TemplateInfo]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_templates(
    State(st): State<AppState>,
    _tenant: Caller,
) -> ApiResult<Json<Vec<TemplateInfo>>> {
    // Every node's, once each (nodes of one cluster are given the same templates).
    let mut templates: Vec<TemplateInfo> = Vec::new();
    for node in st.nodes.all() {
        for t in node.templates().await? {
            if !templates.iter().any(|have| have.digest == t.digest) {
                templates.push(t);
            }
        }
    }
    templates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(templates))
}

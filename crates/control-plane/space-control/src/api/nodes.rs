//! `/v1/nodes`: the cluster's nodes and the tokens that join them (the operator's tenant
//! only). On the single-machine default there is no membership: the list shows the one
//! in-process node, and join tokens are refused.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rand::RngCore;
use space_core::cluster::{
    CreateJoinTokenRequest, DrainReport, JoinTokenCreated, NodeInfo, NodeList, NodeState,
};
use space_core::{ErrorBody, ErrorCode};
use space_node_proto::cluster::JoinToken;

use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
use super::AppState;
use crate::cluster::{DEFAULT_JOIN_TOKEN_TTL, MAX_JOIN_TOKEN_TTL};
use crate::db::{now_ms, NodeLiveness, NodeRow, RemoveNode};
use crate::service::Caller;

fn info(row: &NodeRow) -> NodeInfo {
    NodeInfo {
        name: row.name.clone(),
        address: row.address.clone(),
        state: match (row.liveness, row.cordoned) {
            (NodeLiveness::Lost, _) => NodeState::Lost,
            (NodeLiveness::Ready, true) => NodeState::Cordoned,
            (NodeLiveness::Ready, false) => NodeState::Ready,
        },
        generation: row.generation,
        capacity: row.status.as_ref().map(|s| s.capacity),
        used: row.status.as_ref().map(|s| s.used),
        sandboxes: row.status.as_ref().map(|s| s.sandboxes),
        joined_at_ms: row.joined_at_ms,
        heartbeat_at_ms: row.heartbeat_at_ms,
    }
}

fn not_a_cluster() -> ApiError {
    ApiError::new(
        ErrorCode::Conflict,
        "this control plane runs its own node (the single-machine default), not a cluster: start it with --cluster-dir to manage nodes",
    )
}

fn no_such_node(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "node {} not found",
        space_core::error::excerpt(name, 64)
    ))
}

/// Every node of the cluster.
#[utoipa::path(
    get,
    path = "/v1/nodes",
    tag = "nodes",
    responses(
        (status = 200, description = "The nodes, by name", body = NodeList),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_nodes(State(st): State<AppState>, caller: Caller) -> ApiResult<Json<NodeList>> {
    caller.require_operator()?;
    if !st.nodes.is_cluster() {
        // The one in-process node, as it says of itself now.
        let node = st.nodes.any()?;
        let status = node.status().await?;
        let now = now_ms();
        return Ok(Json(NodeList {
            nodes: vec![NodeInfo {
                name: node.name().to_owned(),
                address: "in-process".into(),
                state: NodeState::Ready,
                generation: 1,
                capacity: Some(status.capacity),
                used: Some(status.used),
                sandboxes: Some(status.sandboxes),
                joined_at_ms: now,
                heartbeat_at_ms: now,
            }],
        }));
    }
    let nodes = st.db.nodes().await?.iter().map(info).collect();
    Ok(Json(NodeList { nodes }))
}

/// A one-time token that joins one node to the cluster (`space node join --token`).
#[utoipa::path(
    post,
    path = "/v1/nodes/join-tokens",
    tag = "nodes",
    request_body = CreateJoinTokenRequest,
    responses(
        (status = 201, description = "The token, shown this once", body = JoinTokenCreated),
        (status = 400, description = "Bad lifetime", body = ErrorBody),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 409, description = "Not a cluster", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_join_token(
    State(st): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateJoinTokenRequest>,
) -> ApiResult<(StatusCode, Json<JoinTokenCreated>)> {
    caller.require_operator()?;
    let fingerprint = st
        .cluster_ca_fingerprint
        .clone()
        .ok_or_else(not_a_cluster)?;
    let ttl = req
        .ttl_secs
        .map_or(DEFAULT_JOIN_TOKEN_TTL, Duration::from_secs);
    if ttl.is_zero() || ttl > MAX_JOIN_TOKEN_TTL {
        return Err(ApiError::invalid(format!(
            "ttl_secs must be between 1 and {}",
            MAX_JOIN_TOKEN_TTL.as_secs()
        )));
    }
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut id);
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let token = JoinToken {
        id: hex::encode(id),
        secret: hex::encode(secret),
        ca_fingerprint: fingerprint,
    };
    let expires_at_ms = now_ms().saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
    st.db
        .create_join_token(&token.id, &crate::keys::hash(&token.secret), expires_at_ms)
        .await?;
    tracing::info!(token = %token.id, ?ttl, "join token created");
    Ok((
        StatusCode::CREATED,
        Json(JoinTokenCreated {
            id: token.id.clone(),
            token: token.write(),
            expires_at_ms,
        }),
    ))
}

async fn set_cordoned(st: &AppState, name: &str, cordoned: bool) -> ApiResult<Json<NodeInfo>> {
    if !st.nodes.is_cluster() {
        return Err(not_a_cluster());
    }
    if !st.db.set_node_cordoned(name, cordoned).await? {
        return Err(no_such_node(name));
    }
    let rows = st.db.nodes().await?;
    st.nodes.refresh(&rows);
    let row = rows
        .iter()
        .find(|r| r.name == name)
        .ok_or_else(|| no_such_node(name))?;
    tracing::info!(node = %name, cordoned, "node cordon changed");
    Ok(Json(info(row)))
}

/// Closes a node to new sandboxes (its sandboxes keep running).
#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/cordon",
    tag = "nodes",
    params(("name" = String, Path, description = "Node name")),
    responses(
        (status = 200, description = "Cordoned", body = NodeInfo),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn cordon_node(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<NodeInfo>> {
    caller.require_operator()?;
    set_cordoned(&st, &name, true).await
}

/// Opens a cordoned node to new sandboxes again.
#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/uncordon",
    tag = "nodes",
    params(("name" = String, Path, description = "Node name")),
    responses(
        (status = 200, description = "Open again", body = NodeInfo),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn uncordon_node(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<NodeInfo>> {
    caller.require_operator()?;
    set_cordoned(&st, &name, false).await
}

/// Drains a node: cordons it, then moves every sandbox it holds to the other nodes
/// (suspended to object storage, resumed where the scheduler puts it, as it was: running
/// or paused). Returns once each has moved or failed to; one that fails stays where it was
/// (or suspended, if only its resume failed) and the others go on.
#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/drain",
    tag = "nodes",
    params(("name" = String, Path, description = "Node name")),
    responses(
        (status = 200, description = "What moved, and what did not and why", body = DrainReport),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 409, description = "Not a cluster, or no object store", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn drain_node(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<DrainReport>> {
    caller.require_operator()?;
    if !st.nodes.is_cluster() {
        return Err(not_a_cluster());
    }
    // In its own task: a client that hangs up does not stop a drain half-way.
    let task_state = st.clone();
    let report =
        tokio::spawn(async move { crate::service::drain::drain(&task_state, &name).await })
            .await
            .map_err(ApiError::internal)??;
    Ok(Json(report))
}

/// Removes a node that holds no sandbox from the cluster (its certificate is no longer
/// heard; it must join again with a new token).
#[utoipa::path(
    delete,
    path = "/v1/nodes/{name}",
    tag = "nodes",
    params(("name" = String, Path, description = "Node name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 409, description = "It still holds sandboxes", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn remove_node(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require_operator()?;
    if !st.nodes.is_cluster() {
        return Err(not_a_cluster());
    }
    match st.db.remove_node(&name).await? {
        RemoveNode::Removed => {
            st.nodes.refresh(&st.db.nodes().await?);
            tracing::info!(node = %name, "node removed from the cluster");
            Ok(StatusCode::NO_CONTENT)
        }
        RemoveNode::NotFound => Err(no_such_node(&name)),
        RemoveNode::HoldsSandboxes(n) => Err(ApiError::new(
            ErrorCode::Conflict,
            format!("node {name} still holds {n} sandbox(es): delete them first"),
        )),
    }
}

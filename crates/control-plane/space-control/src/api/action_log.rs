//! Records every control-plane action in its tenant's action log ([`crate::db::audit`],
//! hash-chained, see [`space_core::audit`]): a middleware on the authenticated routes of
//! `/v1` and of the E2B surface, for every `POST`, `PUT`, `PATCH` and `DELETE` — sandbox
//! create, delete and lifecycle, snapshots, egress policies, credentials, token revocations —
//! with the acting key's id, the route, the target, the outcome and the time.
//!
//! Not recorded: reads, and the data plane (processes and files inside a sandbox), whose
//! volume is the workload's own. A request replayed from its `Idempotency-Key` is not
//! recorded again (the idempotency layer answers it before this one).
//!
//! The record is written once the handler answered; writing it failing is logged and
//! counted, and does not change the answer (the action is done by then).

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::LOCATION;
use axum::middleware::Next;
use axum::response::Response;
use space_core::ErrorCode;

use super::idempotency::applies_to;
use crate::db::{now_ms, Db, NewAuditRecord};
use crate::service::Caller;

/// Path parts of the data plane, whose requests are not recorded.
const DATA_PLANE: [&str; 3] = ["/files", "/processes", "/exec"];

/// Whether a request to route `route` with `method` is an action to record.
pub fn is_action(method: &axum::http::Method, route: &str) -> bool {
    applies_to(method) && !DATA_PLANE.iter().any(|p| route.contains(p))
}

/// The outcome of a response: `ok`, or its error code.
fn outcome(response: &Response) -> String {
    if response.status().is_success() || response.status().is_redirection() {
        return "ok".to_owned();
    }
    match response.extensions().get::<ErrorCode>() {
        Some(code) => code.as_str().to_owned(),
        None => format!("http_{}", response.status().as_u16()),
    }
}

/// The middleware (layer it inside authentication and idempotency).
pub async fn record(State(db): State<Db>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let (Some(route), Some(auth)) = (route, req.extensions().get::<Caller>().cloned()) else {
        return next.run(req).await;
    };
    if !is_action(req.method(), &route) {
        return next.run(req).await;
    }
    let action = format!("{} {route}", req.method());
    let path = req.uri().path().to_owned();
    let ts_ms = now_ms();
    let response = next.run(req).await;
    let target = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .filter(|_| response.status().is_success())
        .unwrap_or(&path)
        .to_owned();
    let record = NewAuditRecord {
        tenant: &auth.id,
        ts_ms,
        api_key_id: Some(&auth.key_id),
        action: &action,
        target: &target,
        outcome: &outcome(&response),
        status: response.status().as_u16(),
    };
    if let Err(e) = db.append_audit(&record).await {
        tracing::error!(tenant = %auth.name, %action, %target, error = %e, "the action log could not record an action");
    }
    response
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;

    #[test]
    fn control_plane_writes_are_actions_the_data_plane_and_reads_are_not() {
        assert!(is_action(&Method::POST, "/v1/sandboxes"));
        assert!(is_action(&Method::DELETE, "/v1/sandboxes/{id}"));
        assert!(is_action(&Method::PUT, "/v1/egress-policy"));
        assert!(is_action(&Method::POST, "/sandboxes/{id}/pause"));
        assert!(!is_action(&Method::GET, "/v1/sandboxes"));
        assert!(!is_action(&Method::POST, "/v1/sandboxes/{id}/exec"));
        assert!(!is_action(&Method::PUT, "/v1/sandboxes/{id}/files"));
        assert!(!is_action(
            &Method::POST,
            "/v1/sandboxes/{id}/processes/{pid}/stdin"
        ));
    }
}

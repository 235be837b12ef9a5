//! Who is calling: the role in the certificate the connection's TLS handshake verified, and
//! the check that serves only the control plane.

use axum::extract::connect_info::ConnectInfo;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use space_core::ErrorCode;
use space_node_proto::identity::{peer_role, PeerRole};
use space_tls::TlsPeer;

/// Serves the request only if the peer is the control plane; anything else is `403`.
pub async fn require_control_plane(
    ConnectInfo(peer): ConnectInfo<TlsPeer>,
    req: Request,
    next: Next,
) -> Response {
    let role = match &peer.leaf {
        Some(leaf) => peer_role(leaf).map_err(|e| e.to_string()),
        // The agent's verifier requires a certificate; this cannot be reached with it.
        None => Err("no client certificate".to_owned()),
    };
    match &role {
        Ok(PeerRole::ControlPlane) => next.run(req).await,
        Ok(PeerRole::Node(name)) => {
            tracing::warn!(peer = %peer.addr, node = %name, path = %req.uri().path(), "refused: a node's certificate cannot act as the control plane");
            crate::protocol_error(
                StatusCode::FORBIDDEN,
                ErrorCode::Forbidden,
                format!("the certificate of node {name} cannot act as the control plane"),
            )
        }
        Err(why) => {
            tracing::warn!(peer = %peer.addr, reason = %why, "refused: no SPACE role");
            crate::protocol_error(
                StatusCode::FORBIDDEN,
                ErrorCode::Forbidden,
                format!("the client certificate names no control-plane role: {why}"),
            )
        }
    }
}

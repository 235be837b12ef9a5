//! Who is calling: the role in the certificate the connection's TLS handshake verified, and
//! the check that serves only the control plane.

use std::net::SocketAddr;

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::IncomingStream;
use space_core::ErrorCode;
use space_node_proto::identity::{peer_role, PeerRole};
use space_tls::TlsListener;

/// The peer of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its address.
    pub addr: SocketAddr,
    /// Its certificate's role, or why it has none.
    pub role: Result<PeerRole, String>,
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        let (_, tls) = stream.io().get_ref();
        let role = match tls.peer_certificates().and_then(|c| c.first()) {
            Some(leaf) => peer_role(leaf).map_err(|e| e.to_string()),
            // The verifier requires a certificate; this cannot be reached with it.
            None => Err("no client certificate".to_owned()),
        };
        Peer {
            addr: *stream.remote_addr(),
            role,
        }
    }
}

/// Serves the request only if the peer is the control plane; anything else is `403`.
pub async fn require_control_plane(
    ConnectInfo(peer): ConnectInfo<Peer>,
    req: Request,
    next: Next,
) -> Response {
    match &peer.role {
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

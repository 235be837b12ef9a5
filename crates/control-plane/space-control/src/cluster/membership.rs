//! What the cluster listener does for a node: join, heartbeat, rejoin. Each refusal is a
//! clear error with its own code, and changes nothing:
//! - a malformed request: `400 invalid_request`;
//! - a forged, spent or expired join token: `401 unauthenticated`, saying which;
//! - a heartbeat or rejoin without a node's certificate, or with one other than the one
//!   the node was last issued: `403 forbidden`;
//! - a heartbeat from a generation the node no longer has: `409 node_fenced`;
//! - an unknown node: `404 not_found`.

use space_core::{ErrorBody, ErrorCode};
use space_node_proto::cluster::{
    Heartbeat, HeartbeatReply, JoinRequest, JoinResponse, RejoinRequest, RejoinResponse,
    MAX_ADVERTISE, MAX_HEARTBEAT_SANDBOXES,
};
use space_node_proto::identity::{cert_fingerprint, check_node_name, peer_role, PeerRole};
use space_node_proto::identity::{MAX_CSR_PEM, PEER_VALIDITY};

use super::authority::Authority;
use crate::api::AppState;
use crate::db::{DbError, JoinTokenError, MembershipError, NewNode};
use crate::reconciler::Reconciler;

/// A refusal (or failure) of a membership request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub ErrorBody);

impl Refusal {
    fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal(ErrorBody::new(code, message))
    }
}

impl From<DbError> for Refusal {
    fn from(e: DbError) -> Refusal {
        tracing::error!(error = %e, "membership: database error");
        Refusal::new(ErrorCode::Internal, "internal error (see the server log)")
    }
}

impl From<JoinTokenError> for Refusal {
    fn from(e: JoinTokenError) -> Refusal {
        Refusal::new(ErrorCode::Unauthenticated, e.to_string())
    }
}

impl From<MembershipError> for Refusal {
    fn from(e: MembershipError) -> Refusal {
        let code = match &e {
            MembershipError::UnknownNode(_) => ErrorCode::NotFound,
            MembershipError::StaleCertificate(_) => ErrorCode::Forbidden,
            MembershipError::Fenced { .. } => ErrorCode::NodeFenced,
        };
        Refusal::new(code, e.to_string())
    }
}

/// The node a verified client certificate belongs to, and that certificate's fingerprint.
pub fn node_of_certificate(leaf: Option<&[u8]>) -> Result<(String, String), Refusal> {
    let leaf = leaf.ok_or_else(|| {
        Refusal::new(
            ErrorCode::Forbidden,
            "this route needs a node's certificate (join first)",
        )
    })?;
    match peer_role(leaf) {
        Ok(PeerRole::Node(name)) => Ok((name, cert_fingerprint(leaf))),
        Ok(PeerRole::ControlPlane) => Err(Refusal::new(
            ErrorCode::Forbidden,
            "a control-plane certificate cannot act as a node",
        )),
        Err(e) => Err(Refusal::new(ErrorCode::Forbidden, e.to_string())),
    }
}

/// Checks a `host:port` a node advertises for its agent.
fn check_advertise(addr: &str) -> Result<(), Refusal> {
    let bad = |why: &str| {
        Err(Refusal::new(
            ErrorCode::InvalidRequest,
            format!("advertise address {:?}: {why}", excerpt(addr)),
        ))
    };
    if addr.is_empty() || addr.len() > MAX_ADVERTISE {
        return bad("must be host:port, at most 255 bytes");
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return bad("must be host:port");
    };
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return bad("the port must be 1 to 65535");
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let hostname = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if host.parse::<std::net::IpAddr>().is_err() && !hostname {
        return bad("the host must be an IP address or a DNS name");
    }
    Ok(())
}

fn excerpt(s: &str) -> String {
    s.chars().take(80).collect()
}

/// The membership service of one replica.
#[derive(Clone)]
pub struct Membership {
    state: AppState,
    authority: Authority,
    reconciler: Reconciler,
    /// How long after its last heartbeat a node is declared lost (told to nodes, which
    /// fence themselves before then).
    lost_after: std::time::Duration,
}

impl Membership {
    /// Over the replica's state (database and nodes), CA and reconciler; nodes are declared
    /// lost `lost_after` after their last heartbeat.
    pub fn new(
        state: AppState,
        authority: Authority,
        reconciler: Reconciler,
        lost_after: std::time::Duration,
    ) -> Membership {
        Membership {
            state,
            authority,
            reconciler,
            lost_after,
        }
    }

    /// A node joins: checks the request, signs its key, spends the token and records the
    /// node, in that order (a bad request spends nothing).
    pub async fn join(&self, req: JoinRequest) -> Result<JoinResponse, Refusal> {
        check_node_name(&req.name)
            .map_err(|e| Refusal::new(ErrorCode::InvalidRequest, e.to_string()))?;
        check_advertise(&req.advertise)?;
        if req.token_id.len() > 64 || req.token_secret.len() > 128 {
            return Err(JoinTokenError::Invalid.into());
        }
        if req.csr_pem.len() > MAX_CSR_PEM {
            return Err(Refusal::new(
                ErrorCode::InvalidRequest,
                format!("a certificate request is at most {MAX_CSR_PEM} bytes"),
            ));
        }
        let cert_pem = self
            .authority
            .ca
            .sign_node_request(&req.csr_pem, &req.name, PEER_VALIDITY)
            .map_err(|e| Refusal::new(ErrorCode::InvalidRequest, e.to_string()))?;
        let fingerprint = space_node_proto::identity::ca_fingerprint(&cert_pem)
            .map_err(|e| Refusal::new(ErrorCode::Internal, e.to_string()))?;
        let node = self
            .state
            .db
            .join_node(
                &req.token_id,
                &crate::keys::hash(&req.token_secret),
                &NewNode {
                    name: &req.name,
                    address: &req.advertise,
                    cert_fingerprint: &fingerprint,
                },
            )
            .await??;
        tracing::info!(node = %node.name, address = %node.address, generation = node.generation, "node joined");
        self.refresh().await?;
        Ok(JoinResponse {
            cert_pem,
            ca_pem: self.authority.ca.cert_pem().to_owned(),
            generation: node.generation,
            placeholder_key: hex::encode(
                self.state
                    .credential_sealer
                    .placeholder_key()
                    .expose_bytes(),
            ),
        })
    }

    /// A heartbeat of the node whose certificate is `leaf`.
    pub async fn heartbeat(
        &self,
        leaf: Option<&[u8]>,
        hb: Heartbeat,
    ) -> Result<HeartbeatReply, Refusal> {
        let (name, fingerprint) = node_of_certificate(leaf)?;
        if hb.sandboxes.len() > MAX_HEARTBEAT_SANDBOXES {
            return Err(Refusal::new(
                ErrorCode::InvalidRequest,
                format!("a heartbeat reports at most {MAX_HEARTBEAT_SANDBOXES} sandboxes"),
            ));
        }
        let live: Vec<_> = hb
            .sandboxes
            .iter()
            .map(|s| (s.id.clone(), s.state))
            .collect();
        let started = std::time::Instant::now();
        let not_yours = self
            .state
            .db
            .node_heartbeat(&name, hb.generation, &fingerprint, &hb.status, &live)
            .await??;
        // The heartbeat counts when it is recorded: a slow database eats into the node's
        // lost timeout.
        if started.elapsed() > self.lost_after / 4 {
            tracing::warn!(node = %name, took = ?started.elapsed(), "recording a heartbeat was slow");
        }
        if !not_yours.is_empty() {
            tracing::warn!(node = %name, claimed = ?not_yours, "a node reported sandboxes not placed on it; left them alone");
        }
        // A node whose credentials are behind the catalog (it just joined or restarted, or
        // missed a change) is synced in the background.
        if let Some(api) = self.state.nodes.get_any_state(&name) {
            crate::service::credentials::sync_if_behind(
                &self.state,
                api,
                hb.status.credentials_revision,
            )
            .await;
        }
        let restorable = self.state.db.restorable_on(&name).await?;
        Ok(HeartbeatReply {
            not_yours,
            lost_after_ms: u64::try_from(self.lost_after.as_millis()).unwrap_or(u64::MAX),
            restorable,
        })
    }

    /// A fenced node asks to serve again: it is reconciled first (its sandboxes deleted
    /// meanwhile go, timeouts that passed are acted on), then let back at its current
    /// generation.
    pub async fn rejoin(
        &self,
        leaf: Option<&[u8]>,
        req: RejoinRequest,
    ) -> Result<RejoinResponse, Refusal> {
        let (name, fingerprint) = node_of_certificate(leaf)?;
        let node = self
            .state
            .db
            .check_rejoin(&name, req.generation, &fingerprint)
            .await??;
        self.refresh().await?;
        let api = self.state.nodes.get_any_state(&name).ok_or_else(|| {
            Refusal::new(
                ErrorCode::NodeUnavailable,
                format!("node {name} cannot be addressed"),
            )
        })?;
        let actions = self
            .reconciler
            .reconcile_node(api.as_ref())
            .await
            .map_err(|e| {
                tracing::warn!(node = %name, error = %e, "rejoin: reconciling the node failed");
                Refusal::new(
                    ErrorCode::NodeUnavailable,
                    format!("the control plane could not reconcile node {name}: {e}"),
                )
            })?;
        if !self.state.db.finish_rejoin(&name, node.generation).await? {
            return Err(MembershipError::Fenced {
                name,
                presented: req.generation,
                current: node.generation,
            }
            .into());
        }
        tracing::info!(node = %name, generation = node.generation, actions = actions.len(), "node rejoined after being lost");
        self.refresh().await?;
        Ok(RejoinResponse {
            generation: node.generation,
        })
    }

    /// Reloads this replica's node set from the database.
    pub async fn refresh(&self) -> Result<(), DbError> {
        let rows = self.state.db.nodes().await?;
        self.state.nodes.refresh(&rows);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertise_addresses_are_host_and_port() {
        for ok in ["10.0.0.1:7443", "node-a.example:1", "[fd00::1]:7443"] {
            assert!(check_advertise(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "10.0.0.1",
            "10.0.0.1:0",
            "10.0.0.1:70000",
            ":7443",
            "a b:1",
            "x/y:1",
            &format!("{}:1", "a".repeat(300)),
        ] {
            assert!(check_advertise(bad).is_err(), "{bad}");
        }
    }
}

//! The membership protocol: what a node sends the control plane's cluster listener (the
//! other direction from [`crate::wire`], where the control plane calls the node).
//!
//! - `POST /cluster/v1/join` (no client certificate yet): a one-time [`JoinToken`] and a
//!   certificate request; answered with the node's certificate and its first generation.
//!   The node dials with [`crate::identity::join_client_config`], so the token only ever
//!   reaches a server holding a certificate of the CA the token pins.
//! - `POST /cluster/v1/heartbeat` (the node's certificate): its [`NodeStatus`] and the
//!   live states of its sandboxes, with the generation it was given. A node declared lost
//!   since has an older generation and is refused (`409 node_fenced`).
//! - `POST /cluster/v1/rejoin` (the node's certificate): a fenced node asks to serve again;
//!   the control plane reconciles its sandboxes first, then answers with the generation
//!   it must heartbeat with.
//!
//! Bodies are JSON, at most [`MAX_MEMBERSHIP_BODY`], unknown fields refused.

use serde::{Deserialize, Serialize};
use space_core::{SandboxId, SandboxState};

use crate::NodeStatus;

/// Joins a node to the cluster.
pub const JOIN_PATH: &str = "/cluster/v1/join";
/// A node's heartbeat.
pub const HEARTBEAT_PATH: &str = "/cluster/v1/heartbeat";
/// A fenced node asks to serve again.
pub const REJOIN_PATH: &str = "/cluster/v1/rejoin";
/// Largest membership request body (a heartbeat of many sandboxes included).
pub const MAX_MEMBERSHIP_BODY: usize = 4 << 20;
/// Most sandboxes one heartbeat may report.
pub const MAX_HEARTBEAT_SANDBOXES: usize = 10_000;
/// Longest `host:port` a node may advertise.
pub const MAX_ADVERTISE: usize = 255;

/// What `space node join` is given: `spacejoin_<id>.<secret>.<CA fingerprint hex>`. The id
/// finds the token's row, the secret (only its hash is stored) proves it, and the
/// fingerprint pins the cluster CA the node must find at the other end.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// Names the token (not secret).
    pub id: String,
    /// 32 random bytes, hex: the secret.
    pub secret: String,
    /// `sha256:<hex>` of the cluster CA's certificate.
    pub ca_fingerprint: String,
}

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinToken")
            .field("id", &self.id)
            .field("ca_fingerprint", &self.ca_fingerprint)
            .finish_non_exhaustive()
    }
}

/// The prefix of a written join token.
pub const JOIN_TOKEN_PREFIX: &str = "spacejoin_";

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl JoinToken {
    /// Reads a written token; anything malformed is refused before any network call.
    pub fn parse(s: &str) -> Result<JoinToken, String> {
        let bad = || "not a join token (spacejoin_<id>.<secret>.<CA fingerprint>)".to_owned();
        let body = s.trim().strip_prefix(JOIN_TOKEN_PREFIX).ok_or_else(bad)?;
        let mut parts = body.split('.');
        let (Some(id), Some(secret), Some(fp), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        if !is_hex(id, 16) || !is_hex(secret, 64) || !is_hex(fp, 64) {
            return Err(bad());
        }
        Ok(JoinToken {
            id: id.to_owned(),
            secret: secret.to_owned(),
            ca_fingerprint: format!("sha256:{fp}"),
        })
    }

    /// The token as `space node join` takes it.
    pub fn write(&self) -> String {
        format!(
            "{JOIN_TOKEN_PREFIX}{}.{}.{}",
            self.id,
            self.secret,
            self.ca_fingerprint.trim_start_matches("sha256:")
        )
    }
}

/// `POST /cluster/v1/join`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    /// The token's id.
    pub token_id: String,
    /// The token's secret.
    pub token_secret: String,
    /// The node's name (a DNS label; unique in the cluster).
    pub name: String,
    /// `host:port` where the control plane reaches its agent.
    pub advertise: String,
    /// PEM certificate request over the node's own key.
    pub csr_pem: String,
}

impl std::fmt::Debug for JoinRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinRequest")
            .field("token_id", &self.token_id)
            .field("name", &self.name)
            .field("advertise", &self.advertise)
            .finish_non_exhaustive()
    }
}

/// The answer to a join.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinResponse {
    /// The node's certificate, PEM.
    pub cert_pem: String,
    /// The cluster CA's certificate, PEM.
    pub ca_pem: String,
    /// The generation to heartbeat with.
    pub generation: u64,
    /// The cluster's credential placeholder key, hex (32 bytes): every node derives a
    /// sandbox's placeholders from it, so a sandbox keeps them when it moves. A secret.
    pub placeholder_key: String,
}

impl std::fmt::Debug for JoinResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinResponse")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// One sandbox as a heartbeat reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveSandbox {
    /// The sandbox.
    pub id: SandboxId,
    /// Its state on the node.
    pub state: SandboxState,
}

/// `POST /cluster/v1/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// The generation the node was given (at join or rejoin).
    pub generation: u64,
    /// What it has and holds.
    pub status: NodeStatus,
    /// Its sandboxes (deleted ones left out).
    pub sandboxes: Vec<LiveSandbox>,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatReply {
    /// Sandboxes the heartbeat named that are not placed on this node: their rows were
    /// left alone (a node cannot claim another's sandbox).
    pub not_yours: Vec<SandboxId>,
    /// How long after its last counted heartbeat the control plane declares this node
    /// lost, ms.
    #[serde(default)]
    pub lost_after_ms: u64,
    /// This node's sandboxes that are restored elsewhere if it is declared lost
    /// (`on_node_loss: restore`): cut off from the control plane for most of
    /// `lost_after_ms`, the node pauses them itself, so that a restored copy never runs
    /// beside this one.
    #[serde(default)]
    pub restorable: Vec<SandboxId>,
}

/// `POST /cluster/v1/rejoin`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejoinRequest {
    /// The generation the node last had.
    pub generation: u64,
}

/// The answer to a rejoin (the node was reconciled).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejoinResponse {
    /// The generation to heartbeat with from now on.
    pub generation: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_tokens_round_trip_and_refuse_anything_else() {
        let t = JoinToken {
            id: "0123456789abcdef".into(),
            secret: "a".repeat(64),
            ca_fingerprint: format!("sha256:{}", "b".repeat(64)),
        };
        assert_eq!(JoinToken::parse(&t.write()).unwrap(), t);
        assert!(!format!("{t:?}").contains(&t.secret));
        for bad in [
            "",
            "spacejoin_",
            &t.write().replace("spacejoin_", "space_"),
            &format!("{}.x", t.write()),
            &t.write().to_uppercase(),
            &t.write()[..t.write().len() - 1],
        ] {
            assert!(JoinToken::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_refuse_unknown_fields() {
        let hb = r#"{"generation":1,"status":{"capacity":{"vcpus":1,"memory_mib":1,"disk_mib":1},"used":{"vcpus":0,"memory_mib":0,"disk_mib":0},"sandboxes":0,"memory_images":[],"pool_ready":{}},"sandboxes":[],"extra":1}"#;
        assert!(serde_json::from_str::<Heartbeat>(hb).is_err());
    }
}

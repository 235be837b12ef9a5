//! envd access tokens: what a sandbox's envd requests must carry in `X-Access-Token`. The
//! Python SDK treats every sandbox as secured, and `connect` must return the same token as
//! `create`, so a token is derived, not stored: HMAC-SHA256 under a node key of the
//! sandbox id, hex. Checked in constant time. Traffic tokens (what private ports need) are
//! derived the same way under another context.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use space_core::SandboxId;

/// Bytes of the node key.
pub const KEY_LEN: usize = 32;
/// Domain separation, so the key can never produce another kind of MAC with the same input.
const CONTEXT: &[u8] = b"space-e2b/envd-access-token/v1\0";
/// Domain separation of traffic tokens (private ports) from access tokens.
const TRAFFIC_CONTEXT: &[u8] = b"space-e2b/traffic-access-token/v1\0";

/// Derives sandboxes' tokens from a node key.
#[derive(Clone)]
pub struct TokenKey([u8; KEY_LEN]);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(***)")
    }
}

impl TokenKey {
    /// A key from its bytes (kept in a key file by the node).
    pub fn new(bytes: [u8; KEY_LEN]) -> Self {
        TokenKey(bytes)
    }

    fn mac(&self, context: &[u8], id: &SandboxId) -> Hmac<Sha256> {
        // HMAC takes keys of any length: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(context);
        mac.update(id.as_str().as_bytes());
        mac
    }

    fn check(&self, context: &[u8], id: &SandboxId, presented: &str) -> bool {
        match hex::decode(presented.trim()) {
            Ok(bytes) => self.mac(context, id).verify_slice(&bytes).is_ok(),
            Err(_) => false,
        }
    }

    /// The envd access token of sandbox `id`.
    pub fn token(&self, id: &SandboxId) -> String {
        hex::encode(self.mac(CONTEXT, id).finalize().into_bytes())
    }

    /// Whether `presented` is the access token of `id` (constant time in its content).
    pub fn verify(&self, id: &SandboxId, presented: &str) -> bool {
        self.check(CONTEXT, id, presented)
    }

    /// The traffic token of sandbox `id`: what its ports need when they are private.
    pub fn traffic_token(&self, id: &SandboxId) -> String {
        hex::encode(self.mac(TRAFFIC_CONTEXT, id).finalize().into_bytes())
    }

    /// Whether `presented` is the traffic token of `id`.
    pub fn verify_traffic(&self, id: &SandboxId, presented: &str) -> bool {
        self.check(TRAFFIC_CONTEXT, id, presented)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_stable_per_sandbox_and_key() {
        let key = TokenKey::new([7; KEY_LEN]);
        let a: SandboxId = "sbx-abcdefghij0123456789".parse().unwrap();
        let b = SandboxId::generate();
        let t = key.token(&a);
        assert_eq!(t.len(), 64);
        assert_eq!(key.token(&a), t, "create and connect give the same token");
        assert!(key.verify(&a, &t));
        assert!(!key.verify(&b, &t), "another sandbox's token");
        assert!(
            !TokenKey::new([8; KEY_LEN]).verify(&a, &t),
            "another node key"
        );
        for bad in ["", "zz", &t[..62], "x".repeat(64).as_str()] {
            assert!(!key.verify(&a, bad), "{bad:?}");
        }
        assert_eq!(format!("{key:?}"), "TokenKey(***)");
        let traffic = key.traffic_token(&a);
        assert_ne!(traffic, t, "the two tokens are not interchangeable");
        assert!(key.verify_traffic(&a, &traffic) && !key.verify(&a, &traffic));
    }
}

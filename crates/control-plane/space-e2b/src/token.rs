//! envd access tokens: what a sandbox's envd requests must carry in `X-Access-Token`. The
//! SDKs compute signed URLs from the token, and the server must check a signature without
//! knowing which sandbox it is for, so a token is derived, not stored: HMAC-SHA256 under a
//! node key of the sandbox id and the sandbox's token **epoch** (`SandboxTokens`, in the
//! database), hex. Bumping the epoch (`POST /v1/sandboxes/{id}/revoke-tokens`, or revoking
//! an API key of the tenant) makes every token handed out before it fail at once; and a
//! token is only valid until the `valid_until_ms` of its epoch, renewed each time it is
//! handed out (create, connect, get). Checked in constant time. Traffic tokens (what private
//! ports need) are derived the same way under another context.
//!
//! An access token reads `<sandbox id>.<64 hex of the MAC>`: the id names the sandbox a
//! request is for when nothing else does (JS SDK releases before 2.10 send `/files` and
//! `/health` to `E2B_SANDBOX_URL` with the token alone). The id is no secret and routing is
//! not authentication: the MAC is checked against that id. A bare MAC (what SPACE handed out
//! before the id was added) is still accepted where the request names its sandbox.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use space_control::db::SandboxTokens;
use space_core::SandboxId;

/// Bytes of the node key.
pub const KEY_LEN: usize = 32;
/// Domain separation, so the key can never produce another kind of MAC with the same input.
const CONTEXT: &[u8] = b"space-e2b/envd-access-token/v2\0";
/// Domain separation of traffic tokens (private ports) from access tokens.
const TRAFFIC_CONTEXT: &[u8] = b"space-e2b/traffic-access-token/v2\0";

/// Domain separation of template file upload URLs.
const UPLOAD_CONTEXT: &[u8] = b"space-e2b/template-files-upload/v1\0";

/// Between the sandbox id and the MAC of an access token (in neither's alphabet).
const ID_SEPARATOR: char = '.';

/// The sandbox an access token names, if it names one (not checked: see [`TokenKey::verify`]).
pub fn sandbox_of(presented: &str) -> Option<SandboxId> {
    let (id, _mac) = presented.trim().split_once(ID_SEPARATOR)?;
    id.parse().ok()
}

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

    /// The signature of an upload URL for template files `hash` of tenant `tenant`, valid
    /// until `expires_ms` (what the SDKs PUT to carries no API key, like a presigned URL).
    pub fn upload_signature(&self, tenant: &str, hash: &str, expires_ms: i64) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(UPLOAD_CONTEXT);
        // Neither a tenant id nor a hash holds a NUL: the fields cannot run into each other.
        for field in [tenant.as_bytes(), b"\0", hash.as_bytes(), b"\0"] {
            mac.update(field);
        }
        mac.update(&expires_ms.to_be_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `signature` is [`TokenKey::upload_signature`]'s for these, unexpired at
    /// `now_ms` (compared in constant time).
    pub fn verify_upload(
        &self,
        tenant: &str,
        hash: &str,
        expires_ms: i64,
        signature: &str,
        now_ms: i64,
    ) -> bool {
        use subtle::ConstantTimeEq;
        let want = self.upload_signature(tenant, hash, expires_ms);
        now_ms <= expires_ms && bool::from(want.as_bytes().ct_eq(signature.as_bytes()))
    }

    fn mac(&self, context: &[u8], id: &SandboxId, epoch: u64) -> Hmac<Sha256> {
        // HMAC takes keys of any length: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(context);
        // The id has a fixed length, so id and epoch cannot run into each other.
        mac.update(id.as_str().as_bytes());
        mac.update(&epoch.to_be_bytes());
        mac
    }

    fn check(
        &self,
        context: &[u8],
        id: &SandboxId,
        tokens: SandboxTokens,
        now_ms: i64,
        presented: &str,
    ) -> bool {
        let genuine = match hex::decode(presented.trim()) {
            Ok(bytes) => self
                .mac(context, id, tokens.epoch)
                .verify_slice(&bytes)
                .is_ok(),
            Err(_) => false,
        };
        genuine && tokens.valid_at(now_ms)
    }

    /// The envd access token of sandbox `id` in `epoch`.
    pub fn token(&self, id: &SandboxId, epoch: u64) -> String {
        let mac = hex::encode(self.mac(CONTEXT, id, epoch).finalize().into_bytes());
        format!("{id}{ID_SEPARATOR}{mac}")
    }

    /// Whether `presented` is a valid access token of `id` at `now_ms` (constant time in
    /// its content).
    pub fn verify(
        &self,
        id: &SandboxId,
        tokens: SandboxTokens,
        now_ms: i64,
        presented: &str,
    ) -> bool {
        let presented = presented.trim();
        let mac = match presented.split_once(ID_SEPARATOR) {
            Some((named, mac)) if named == id.as_str() => mac,
            Some(_) => return false,
            None => presented,
        };
        self.check(CONTEXT, id, tokens, now_ms, mac)
    }

    /// The traffic token of sandbox `id` in `epoch`: what its private ports need.
    pub fn traffic_token(&self, id: &SandboxId, epoch: u64) -> String {
        hex::encode(self.mac(TRAFFIC_CONTEXT, id, epoch).finalize().into_bytes())
    }

    /// Whether `presented` is a valid traffic token of `id` at `now_ms`.
    pub fn verify_traffic(
        &self,
        id: &SandboxId,
        tokens: SandboxTokens,
        now_ms: i64,
        presented: &str,
    ) -> bool {
        self.check(TRAFFIC_CONTEXT, id, tokens, now_ms, presented)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn valid(epoch: u64) -> SandboxTokens {
        SandboxTokens {
            epoch,
            valid_until_ms: NOW + 1,
        }
    }

    #[test]
    fn tokens_are_stable_per_sandbox_epoch_and_key() {
        let key = TokenKey::new([7; KEY_LEN]);
        let a: SandboxId = "sbx-abcdefghij0123456789".parse().unwrap();
        let b = SandboxId::generate();
        let t = key.token(&a, 0);
        assert_eq!(sandbox_of(&t), Some(a.clone()), "{t}");
        let bare = t.split_once('.').unwrap().1;
        assert_eq!(bare.len(), 64);
        assert!(
            key.verify(&a, valid(0), NOW, bare),
            "a token from before the id"
        );
        assert!(
            !key.verify(&a, valid(0), NOW, &format!("{b}.{bare}")),
            "the MAC under another sandbox's id"
        );
        assert_eq!(
            key.token(&a, 0),
            t,
            "create and connect give the same token"
        );
        assert!(key.verify(&a, valid(0), NOW, &t));
        assert!(
            !key.verify(&b, valid(0), NOW, &t),
            "another sandbox's token"
        );
        assert!(
            !TokenKey::new([8; KEY_LEN]).verify(&a, valid(0), NOW, &t),
            "another node key"
        );
        for bad in [
            "",
            "zz",
            &t[..62],
            "x".repeat(64).as_str(),
            &bare[..62],
            ".",
        ] {
            assert!(!key.verify(&a, valid(0), NOW, bad), "{bad:?}");
        }
        assert_eq!(format!("{key:?}"), "TokenKey(***)");
        let traffic = key.traffic_token(&a, 0);
        assert_ne!(traffic, t, "the two tokens are not interchangeable");
        assert!(
            key.verify_traffic(&a, valid(0), NOW, &traffic)
                && !key.verify(&a, valid(0), NOW, &traffic)
        );
    }

    #[test]
    fn a_new_epoch_or_the_end_of_validity_refuses_a_token() {
        let key = TokenKey::new([7; KEY_LEN]);
        let a = SandboxId::generate();
        let t = key.token(&a, 3);
        assert!(key.verify(&a, valid(3), NOW, &t));
        assert!(
            !key.verify(&a, valid(4), NOW, &t),
            "revoked: the epoch moved on"
        );
        assert_ne!(key.token(&a, 4), t);
        let expired = SandboxTokens {
            epoch: 3,
            valid_until_ms: NOW,
        };
        assert!(!key.verify(&a, expired, NOW, &t), "expired");
        assert!(!key.verify(&a, SandboxTokens::default(), NOW, &key.token(&a, 0)));
        let traffic = key.traffic_token(&a, 3);
        assert!(!key.verify_traffic(&a, valid(4), NOW, &traffic));
        assert!(!key.verify_traffic(&a, expired, NOW, &traffic));
    }
}

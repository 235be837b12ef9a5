//! Placeholders: stand-ins for credential values that a sandbox may see.
//!
//! Many SDKs refuse to start without their API key in the environment. For a credential whose
//! rule has `placeholder: true`, the node puts a placeholder into the guest's environment
//! instead of the value: `space-placeholder-` followed by 24 base32 characters (120 bits),
//! derived as HMAC-SHA256(placeholder key, "space-placeholder/v1" 0 sandbox id 0 credential
//! name). It is deterministic per (sandbox, name) — the same across node restarts and value
//! rotations, so the guest's environment stays valid — and unrelated between sandboxes. The
//! placeholder key is a node secret kept in a key file like the master key
//! ([`crate::keyfile`]).
//!
//! The placeholder is not a secret and grants nothing by itself: a request is resolved from
//! the sandbox it comes from, never from the placeholder it carries, so another sandbox's
//! placeholder is simply unknown there. How the gateway treats placeholders found in a
//! request is described in [`crate::inject`].

use std::fmt;
use std::path::Path;

use hmac::digest::generic_array::GenericArray;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::Sha256;
use space_core::id::SandboxId;
use zeroize::Zeroizing;

use crate::keyfile::{self, KeyBytes, KeyFileError, KEY_LEN};
use crate::model::CredentialName;

/// What every placeholder starts with.
pub const PLACEHOLDER_PREFIX: &str = "space-placeholder-";
/// Characters after the prefix.
pub const PLACEHOLDER_BODY_LEN: usize = 24;
/// Total length of a placeholder.
pub const PLACEHOLDER_LEN: usize = PLACEHOLDER_PREFIX.len() + PLACEHOLDER_BODY_LEN;
/// Lower-case RFC 4648 base32 alphabet of the body.
const BASE32_ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
/// Block size of SHA-256, the HMAC key size.
const HMAC_BLOCK_LEN: usize = 64;
/// Domain separation for the derivation.
const DERIVATION_LABEL: &[u8] = b"space-placeholder/v1";
/// Domain separation for a placeholder key derived from a cluster secret.
const KEY_DERIVATION_LABEL: &[u8] = b"space-placeholder-key/v1";

/// The node secret placeholders are derived from. Debug prints `[redacted]`.
pub struct PlaceholderKey(KeyBytes);

impl PlaceholderKey {
    /// Loads the key file at `path`, creating it on first use (see [`crate::keyfile`]).
    pub fn load_or_create(path: &Path) -> Result<Self, KeyFileError> {
        keyfile::load_or_create_key(path).map(PlaceholderKey)
    }

    /// Loads the key file at `path`, which must exist: a key given to this node (a cluster's
    /// nodes share one, so a sandbox keeps its placeholders when it moves between them).
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        keyfile::load_key(path).map(PlaceholderKey)
    }

    /// The placeholder key derived from a cluster secret: HMAC-SHA256(secret,
    /// "space-placeholder-key/v1"). Whoever holds the secret gives the same key to every node.
    pub fn derive(secret: &[u8; KEY_LEN]) -> Self {
        let mut block = Zeroizing::new([0u8; HMAC_BLOCK_LEN]);
        block[..KEY_LEN].copy_from_slice(secret);
        let mut mac = <Hmac<Sha256> as KeyInit>::new(&GenericArray::from(*block));
        mac.update(KEY_DERIVATION_LABEL);
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        key.copy_from_slice(&mac.finalize().into_bytes());
        PlaceholderKey(key)
    }

    /// The key's bytes, to hand to a node (over an authenticated, encrypted channel only).
    pub fn expose_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// A key from bytes (tests, or a key kept elsewhere).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        PlaceholderKey(Zeroizing::new(bytes))
    }

    /// A random key that lives only in memory (placeholders then change on restart).
    pub fn generate() -> Self {
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        OsRng.fill_bytes(key.as_mut());
        PlaceholderKey(key)
    }

    /// The placeholder of credential `name` in `sandbox`.
    pub fn placeholder(&self, sandbox: &SandboxId, name: &CredentialName) -> Placeholder {
        // HMAC pads a key shorter than the hash's block with zeros; padding it ourselves to
        // the block size (64 bytes for SHA-256) makes construction infallible.
        let mut block = Zeroizing::new([0u8; HMAC_BLOCK_LEN]);
        block[..KEY_LEN].copy_from_slice(self.0.as_ref());
        let mut mac = <Hmac<Sha256> as KeyInit>::new(&GenericArray::from(*block));
        mac.update(DERIVATION_LABEL);
        mac.update(&[0]);
        mac.update(sandbox.as_str().as_bytes());
        mac.update(&[0]);
        mac.update(name.as_str().as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(PLACEHOLDER_LEN);
        out.push_str(PLACEHOLDER_PREFIX);
        // 24 characters × 5 bits = 120 bits = the first 15 bytes of the digest.
        let mut acc: u32 = 0;
        let mut bits = 0;
        for &byte in &digest[..15] {
            acc = (acc << 8) | u32::from(byte);
            bits += 8;
            while bits >= 5 {
                bits -= 5;
                out.push(BASE32_ALPHABET[((acc >> bits) & 31) as usize] as char);
            }
        }
        Placeholder(out)
    }
}

impl fmt::Debug for PlaceholderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PlaceholderKey([redacted])")
    }
}

/// A placeholder string (not a secret: the guest sees it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placeholder(String);

impl Placeholder {
    /// The placeholder text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A placeholder-like occurrence in request bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token<'a> {
    /// A well-formed placeholder at this byte offset.
    Placeholder {
        /// Offset of the prefix.
        at: usize,
        /// The whole placeholder.
        text: &'a str,
    },
    /// The prefix not followed by a valid body: a mangled placeholder.
    Malformed,
}

/// Finds every occurrence of [`PLACEHOLDER_PREFIX`] in `bytes`, in order.
pub fn scan(bytes: &[u8]) -> Vec<Token<'_>> {
    let prefix = PLACEHOLDER_PREFIX.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(pos) = find(&bytes[i..], prefix) {
        let at = i + pos;
        let end = at + PLACEHOLDER_LEN;
        let body_ok = bytes
            .get(at + prefix.len()..end)
            .is_some_and(|body| body.iter().all(|b| BASE32_ALPHABET.contains(b)));
        match (
            body_ok,
            std::str::from_utf8(bytes.get(at..end).unwrap_or_default()),
        ) {
            (true, Ok(text)) => {
                out.push(Token::Placeholder { at, text });
                i = end;
            }
            _ => {
                out.push(Token::Malformed);
                i = at + prefix.len();
            }
        }
    }
    out
}

/// Whether `bytes` contain the placeholder prefix at all (the cheap first test).
pub fn mentions_placeholder(bytes: &[u8]) -> bool {
    find(bytes, PLACEHOLDER_PREFIX.as_bytes()).is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_key_is_the_same_for_one_secret_and_unrelated_to_it() {
        let secret = [7u8; KEY_LEN];
        let a = PlaceholderKey::derive(&secret);
        let b = PlaceholderKey::derive(&secret);
        assert_eq!(a.expose_bytes(), b.expose_bytes());
        assert_ne!(a.expose_bytes(), &secret);
        assert_ne!(
            a.expose_bytes(),
            PlaceholderKey::derive(&[8u8; KEY_LEN]).expose_bytes()
        );
    }

    #[test]
    fn placeholders_are_deterministic_per_sandbox_and_name() {
        let key = PlaceholderKey::from_bytes([1u8; KEY_LEN]);
        let s1 = SandboxId::generate();
        let s2 = SandboxId::generate();
        let n: CredentialName = "OPENAI_API_KEY".parse().unwrap();
        let m: CredentialName = "github".parse().unwrap();
        let p = key.placeholder(&s1, &n);
        assert_eq!(p, key.placeholder(&s1, &n));
        assert_ne!(p, key.placeholder(&s2, &n));
        assert_ne!(p, key.placeholder(&s1, &m));
        assert_ne!(
            p,
            PlaceholderKey::from_bytes([2u8; KEY_LEN]).placeholder(&s1, &n)
        );
        assert_eq!(p.as_str().len(), PLACEHOLDER_LEN);
        assert!(p.as_str().starts_with(PLACEHOLDER_PREFIX));
        assert_eq!(
            scan(p.as_str().as_bytes()),
            vec![Token::Placeholder {
                at: 0,
                text: p.as_str()
            }]
        );
        assert_eq!(format!("{key:?}"), "PlaceholderKey([redacted])");
    }

    #[test]
    fn scanning_finds_well_formed_and_mangled_tokens() {
        let good = format!("{PLACEHOLDER_PREFIX}{}", "a2".repeat(12));
        let text = format!("Bearer {good}, x={good}; {PLACEHOLDER_PREFIX}short");
        let tokens = scan(text.as_bytes());
        assert_eq!(tokens.len(), 3);
        assert_eq!(tokens[0], Token::Placeholder { at: 7, text: &good });
        assert!(matches!(tokens[1], Token::Placeholder { .. }));
        assert_eq!(tokens[2], Token::Malformed);
        assert!(scan(b"nothing here").is_empty());
        assert_eq!(
            scan(format!("{PLACEHOLDER_PREFIX}{}", "A".repeat(24)).as_bytes()),
            vec![Token::Malformed]
        );
        assert!(mentions_placeholder(text.as_bytes()));
        assert!(!mentions_placeholder(b"space-placeholder"));
    }
}

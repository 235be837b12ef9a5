//! API keys: generation, hashing, the display prefix and the key's two formats.
//!
//! A key is 32 random bytes from the OS, shown once as `space_<64 hex>`. Only its sha256 is
//! stored: keys have 256 bits of entropy, so a fast hash cannot be brute-forced and a slow
//! password hash would only cost latency on every request. A short, non-secret prefix is kept
//! so people can tell their keys apart in listings.
//!
//! Every key can also be written `e2b_<the same 64 hex>`: E2B SDK releases that check a
//! key's shape before sending it (`e2b_` then lowercase hex) refuse `space_…`. Both formats
//! are one key (one secret, one hash, one revocation): either is parsed to the canonical
//! `space_` form before it is hashed, so every key ever issued works with every SDK, without
//! a second secret to store or rotate.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Every key starts with this, so leaked keys are easy to recognise (e.g. by secret scanners).
pub const KEY_PREFIX: &str = "space_";
/// The prefix of a key in the E2B format (what E2B's SDKs check for).
pub const E2B_KEY_PREFIX: &str = "e2b_";
/// Random bytes in a key.
pub const KEY_BYTES: usize = 32;
/// Length of a well-formed key string (canonical format).
pub const KEY_LEN: usize = KEY_PREFIX.len() + 2 * KEY_BYTES;
/// Hex characters of the key body kept for display.
const DISPLAY_CHARS: usize = 8;

/// How a key is written out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyFormat {
    /// `space_<64 hex>`, the canonical form.
    #[default]
    Space,
    /// `e2b_<64 hex>`, accepted by every E2B SDK release's local check.
    E2b,
}

impl KeyFormat {
    /// The prefix of this format.
    pub fn prefix(self) -> &'static str {
        match self {
            KeyFormat::Space => KEY_PREFIX,
            KeyFormat::E2b => E2B_KEY_PREFIX,
        }
    }
}

/// A freshly generated key: the plaintext is shown once and never stored.
#[derive(Clone)]
pub struct GeneratedKey {
    /// `space_<64 hex>`: give it to the user, then forget it.
    pub plaintext: String,
    /// sha256 of the plaintext, hex: what the database stores.
    pub hash: String,
    /// Non-secret prefix for listings, e.g. `space_1a2b3c4d`.
    pub display_prefix: String,
}

impl std::fmt::Debug for GeneratedKey {
    // Keys must never reach a log, even through a stray `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedKey")
            .field("display_prefix", &self.display_prefix)
            .finish_non_exhaustive()
    }
}

/// Generates a new key from the OS random number generator.
pub fn generate() -> GeneratedKey {
    let mut bytes = [0u8; KEY_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let plaintext = format!("{KEY_PREFIX}{}", hex::encode(bytes));
    GeneratedKey {
        hash: hash(&plaintext),
        display_prefix: display_prefix(&plaintext),
        plaintext,
    }
}

/// The stored form of a key: sha256 of its canonical format, lowercase hex.
pub fn hash(canonical: &str) -> String {
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// The non-secret prefix shown in listings (of either format).
pub fn display_prefix(key: &str) -> String {
    let prefix = if key.starts_with(E2B_KEY_PREFIX) {
        E2B_KEY_PREFIX
    } else {
        KEY_PREFIX
    };
    key.chars().take(prefix.len() + DISPLAY_CHARS).collect()
}

/// The key body (64 lowercase hex) of a key in either format; `None` for anything else.
/// A cheap syntax check before touching the database: anything else is refused outright.
fn body(key: &str) -> Option<&str> {
    let body = key
        .strip_prefix(KEY_PREFIX)
        .or_else(|| key.strip_prefix(E2B_KEY_PREFIX))?;
    let hex = body.len() == 2 * KEY_BYTES
        && body
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then_some(body)
}

/// The canonical (`space_`) form of a well-formed key in either format.
pub fn canonical(key: &str) -> Option<String> {
    body(key).map(|b| format!("{KEY_PREFIX}{b}"))
}

/// `key` (well-formed, either format) written in `format`.
pub fn in_format(key: &str, format: KeyFormat) -> Option<String> {
    body(key).map(|b| format!("{}{b}", format.prefix()))
}

/// Whether `key` is a well-formed key in either format.
pub fn is_well_formed(key: &str) -> bool {
    body(key).is_some()
}

/// The canonical display prefix (`space_1a2b3c4d`) of a display prefix in either format:
/// listings show the canonical one, a user may paste the E2B one.
pub fn canonical_display_prefix(prefix: &str) -> Option<String> {
    let body = prefix.strip_prefix(E2B_KEY_PREFIX)?;
    (body.len() == DISPLAY_CHARS).then(|| format!("{KEY_PREFIX}{body}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let a = generate();
        let b = generate();
        assert!(is_well_formed(&a.plaintext));
        assert_ne!(a.plaintext, b.plaintext);
        assert_eq!(a.hash, hash(&a.plaintext));
        assert_eq!(a.hash.len(), 64);
        assert!(a.plaintext.starts_with(&a.display_prefix));
        assert_eq!(a.display_prefix.len(), 14);
    }

    #[test]
    fn debug_does_not_leak_the_key() {
        let k = generate();
        assert!(!format!("{k:?}").contains(&k.plaintext));
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in [
            String::new(),
            "space_".into(),
            "e2b_".into(),
            format!("space_{}", "G".repeat(64)),
            format!("e2b_{}", "A".repeat(64)),
            format!("e2b_{}", "a".repeat(63)),
            format!("e2b_{}", "a".repeat(65)),
            format!("other_{}", "a".repeat(64)),
            format!(" e2b_{}", "a".repeat(64)),
        ] {
            assert!(!is_well_formed(&bad), "{bad:?}");
            assert_eq!(canonical(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn both_formats_are_one_key() {
        let k = generate();
        let e2b = in_format(&k.plaintext, KeyFormat::E2b).expect("e2b format");
        assert!(e2b.starts_with("e2b_"));
        // What E2B's SDKs check: `^e2b_[0-9a-f]+$`.
        assert!(e2b[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(canonical(&e2b).as_deref(), Some(k.plaintext.as_str()));
        assert_eq!(
            canonical(&k.plaintext).as_deref(),
            Some(k.plaintext.as_str())
        );
        assert_eq!(
            in_format(&e2b, KeyFormat::Space).as_deref(),
            Some(k.plaintext.as_str())
        );
        let shown = display_prefix(&e2b);
        assert_eq!(shown.len(), 12);
        assert_eq!(
            canonical_display_prefix(&shown).as_deref(),
            Some(k.display_prefix.as_str())
        );
        assert_eq!(canonical_display_prefix(&k.display_prefix), None);
    }
}

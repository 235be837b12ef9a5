//! API keys: generation, hashing and the display prefix.
//!
//! A key is 32 random bytes from the OS, shown once as `space_<64 hex>`. Only its sha256 is
//! stored: keys have 256 bits of entropy, so a fast hash cannot be brute-forced and a slow
//! password hash would only cost latency on every request. A short, non-secret prefix is kept
//! so people can tell their keys apart in listings.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Every key starts with this, so leaked keys are easy to recognise (e.g. by secret scanners).
pub const KEY_PREFIX: &str = "space_";
/// Random bytes in a key.
pub const KEY_BYTES: usize = 32;
/// Length of a well-formed key string.
pub const KEY_LEN: usize = KEY_PREFIX.len() + 2 * KEY_BYTES;
/// Hex characters of the key body kept for display.
const DISPLAY_CHARS: usize = 8;

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

/// The stored form of a key: sha256, lowercase hex.
pub fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The non-secret prefix shown in listings.
pub fn display_prefix(key: &str) -> String {
    key.chars().take(KEY_PREFIX.len() + DISPLAY_CHARS).collect()
}

/// Cheap syntax check before touching the database: anything else is refused outright.
pub fn is_well_formed(key: &str) -> bool {
    key.len() == KEY_LEN
        && key.starts_with(KEY_PREFIX)
        && key[KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
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
        assert!(!is_well_formed(""));
        assert!(!is_well_formed("space_"));
        assert!(!is_well_formed(&format!("space_{}", "G".repeat(64))));
        assert!(!is_well_formed(&format!("other_{}", "a".repeat(64))));
    }
}

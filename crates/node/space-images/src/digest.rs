//! Digests of build inputs: an unambiguous field-by-field sha256, and file hashing.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::ImageError;

/// Hashes labelled fields; each field is length-prefixed, so no two different field lists
/// hash alike.
pub struct InputDigest(Sha256);

impl InputDigest {
    /// A digest for one kind of artifact.
    pub fn new(kind: &str) -> Self {
        let mut d = InputDigest(Sha256::new());
        d.field("kind", kind.as_bytes());
        d
    }

    /// Adds a labelled field.
    pub fn field(&mut self, label: &str, value: &[u8]) -> &mut Self {
        for part in [label.as_bytes(), value] {
            self.0.update((part.len() as u64).to_le_bytes());
            self.0.update(part);
        }
        self
    }

    /// The digest, lowercase hex.
    pub fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// sha256 of a file's contents, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, ImageError> {
    Ok(space_storage::sha256_of(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_unambiguous() {
        let mut a = InputDigest::new("k");
        a.field("x", b"ab").field("y", b"c");
        let mut b = InputDigest::new("k");
        b.field("x", b"a").field("y", b"bc");
        assert_ne!(a.finish(), b.finish());
    }
}

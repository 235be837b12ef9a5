//! A data key: the 256-bit key one artifact is sealed under.

use rand::RngCore;
use zeroize::Zeroizing;

/// Length of a data key, bytes.
pub const DATA_KEY_LEN: usize = 32;
/// Domain separation of [`DataKey::derive`].
const DERIVE_SALT: &[u8] = b"space/artifact-key/v1";

/// A data key in plaintext. Only ever in memory: wiped when dropped, redacted in `Debug`,
/// neither `Clone` nor serializable, so a copy is always deliberate.
pub struct DataKey(Zeroizing<[u8; DATA_KEY_LEN]>);

impl DataKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> DataKey {
        let mut key = Zeroizing::new([0u8; DATA_KEY_LEN]);
        rand::rngs::OsRng.fill_bytes(key.as_mut());
        DataKey(key)
    }

    /// The key a KMS unwrapped; `None` unless it is [`DATA_KEY_LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<DataKey> {
        let mut key = Zeroizing::new([0u8; DATA_KEY_LEN]);
        if bytes.len() != DATA_KEY_LEN {
            return None;
        }
        key.copy_from_slice(bytes);
        Some(DataKey(key))
    }

    /// The key of artifact `artifact` under this one (HKDF-SHA256, the artifact's id as its
    /// info): a node holding a tenant's artifact key seals each artifact under a key of the
    /// artifact's own, with no KMS call per artifact, and keys of two artifacts are
    /// independent.
    pub fn derive(&self, artifact: &str) -> DataKey {
        let mut key = Zeroizing::new([0u8; DATA_KEY_LEN]);
        hkdf::Hkdf::<sha2::Sha256>::new(Some(DERIVE_SALT), self.0.as_ref())
            .expand(artifact.as_bytes(), key.as_mut())
            // 32 bytes is far below HKDF-SHA256's 255 × 32 bytes of output.
            .unwrap_or_else(|_| unreachable!("HKDF-SHA256 expands to 32 bytes"));
        DataKey(key)
    }

    /// A second copy of this key (for a holder that outlives the call that handed it over).
    pub fn duplicate(&self) -> DataKey {
        DataKey(self.0.clone())
    }

    /// The key's bytes, for the cipher and for wrapping by a KMS.
    pub fn expose(&self) -> &[u8; DATA_KEY_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fresh_and_never_printed() {
        let (a, b) = (DataKey::generate(), DataKey::generate());
        assert_ne!(a.expose(), b.expose());
        assert_eq!(format!("{a:?}"), "DataKey(<redacted>)");
        assert!(DataKey::from_bytes(&[1; 31]).is_none());
        assert_eq!(
            DataKey::from_bytes(a.expose()).unwrap().expose(),
            a.expose()
        );
    }

    #[test]
    fn derived_keys_are_per_artifact_and_stable() {
        let root = DataKey::generate();
        let (x, y) = (
            root.derive("snapshots/a/vm.state"),
            root.derive("snapshots/b/vm.state"),
        );
        assert_ne!(x.expose(), y.expose());
        assert_ne!(x.expose(), root.expose());
        assert_eq!(root.derive("snapshots/a/vm.state").expose(), x.expose());
        assert_ne!(
            DataKey::generate().derive("snapshots/a/vm.state").expose(),
            x.expose()
        );
    }
}

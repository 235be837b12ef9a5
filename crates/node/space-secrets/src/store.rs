//! The encrypted file store: one file per credential in a private directory on the node,
//! values encrypted with a master key kept in a separate key file (see [`crate::keyfile`]).
//!
//! File `<dir>/<credential id>.json` (ids are checked to be `crd-` and lowercase letters or
//! digits, so a name can never traverse out of the directory), mode 0600, written atomically
//! (see [`crate::fsutil`]):
//!
//! ```json
//! {
//!   "format": "space-secrets/credential/v1",
//!   "credential": { "id": "crd-…", "name": "github", "scope": {…}, "rule": {…},
//!                   "created_at_ms": 1700000000000, "expires_at_ms": 1800000000000 },
//!   "nonce": "<base64, 24 bytes>",
//!   "ciphertext": "<base64: XChaCha20-Poly1305(value) ‖ 16-byte tag>"
//! }
//! ```
//!
//! The metadata is readable but authenticated: the associated data of the encryption is
//! `"space-secrets/credential/v1" 0x00 <id from the file name> 0x00 <metadata as compact JSON>`,
//! where the compact JSON is re-serialised from the parsed `credential` object (serde_json
//! writes a parsed value back out identically). Changing any byte of the metadata (say, adding
//! a host), the nonce or the ciphertext, or renaming one credential's file to another's id,
//! makes decryption fail, and the file is refused as tampered. Listing decrypts every file for
//! that reason: metadata is never trusted unauthenticated. A corrupt or tampered file fails the
//! whole listing (fail closed, and loud), rather than silently dropping, say, a sandbox-level
//! override that narrowed a tenant-wide credential.
//!
//! File I/O is synchronous inside (`*_blocking` methods, usable without a runtime); the
//! [`SecretBackend`] implementation runs it on the blocking thread pool.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::backend::{BackendError, BoxFuture, SecretBackend};
use crate::crypto::{self, CryptoError};
use crate::fsutil;
use crate::keyfile::{self, KeyBytes, KEY_LEN};
use crate::model::{Credential, CredentialId};
use crate::secret::SecretValue;

/// The `format` field of a credential file, also the first part of its associated data.
pub const CREDENTIAL_FILE_FORMAT: &str = "space-secrets/credential/v1";
/// Largest credential file read (a maximal value is ~88 KiB of base64; metadata is small).
pub const MAX_CREDENTIAL_FILE_LEN: usize = 256 * 1024;
/// Most credential files a store may hold (listing refuses more).
pub const MAX_STORED_CREDENTIALS: usize = 10_000;
/// Extension of credential files.
pub const CREDENTIAL_FILE_EXT: &str = ".json";

/// One credential file (see the module doc).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    format: String,
    credential: serde_json::Value,
    nonce: String,
    ciphertext: String,
}

/// The associated data binding a ciphertext to its credential (see the module doc).
fn associated_data(id: &CredentialId, metadata: &serde_json::Value) -> Result<Vec<u8>, String> {
    let json = serde_json::to_vec(metadata).map_err(|e| e.to_string())?;
    let mut aad =
        Vec::with_capacity(CREDENTIAL_FILE_FORMAT.len() + id.as_str().len() + json.len() + 2);
    aad.extend_from_slice(CREDENTIAL_FILE_FORMAT.as_bytes());
    aad.push(0);
    aad.extend_from_slice(id.as_str().as_bytes());
    aad.push(0);
    aad.extend_from_slice(&json);
    Ok(aad)
}

struct Inner {
    dir: PathBuf,
    key: KeyBytes,
}

/// Encrypted credential files in one directory (see the module doc). Cheap to clone.
#[derive(Clone)]
pub struct EncryptedFileStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EncryptedFileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptedFileStore")
            .field("dir", &self.inner.dir)
            .field("key", &"[redacted]")
            .finish()
    }
}

impl EncryptedFileStore {
    /// Opens (creating if needed, mode 0700) the store directory `dir`, with the master key
    /// at `key_file` (created on first use; refused if group/world accessible).
    pub fn open(dir: impl Into<PathBuf>, key_file: &Path) -> Result<Self, BackendError> {
        let key = keyfile::load_or_create_key(key_file)?;
        Self::open_with_key(dir, key)
    }

    /// Opens the store with a key already loaded.
    pub fn open_with_key(dir: impl Into<PathBuf>, key: KeyBytes) -> Result<Self, BackendError> {
        let dir = dir.into();
        fsutil::ensure_private_dir(&dir).map_err(|source| BackendError::Io {
            path: dir.clone(),
            source,
        })?;
        fsutil::remove_stale_temps(&dir);
        Ok(Self {
            inner: Arc::new(Inner { dir, key }),
        })
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The file that holds credential `id`.
    pub fn credential_path(&self, id: &CredentialId) -> PathBuf {
        self.inner.dir.join(file_name(id))
    }

    fn key(&self) -> &[u8; KEY_LEN] {
        &self.inner.key
    }

    /// Reads, authenticates and decrypts credential `id`.
    pub fn get_blocking(
        &self,
        id: &CredentialId,
    ) -> Result<(Credential, SecretValue), BackendError> {
        let path = self.credential_path(id);
        let bytes =
            fsutil::read_bounded(&path, MAX_CREDENTIAL_FILE_LEN).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => BackendError::NotFound(id.clone()),
                io::ErrorKind::InvalidData => BackendError::Corrupt {
                    path: path.clone(),
                    reason: e.to_string(),
                },
                _ => BackendError::Io {
                    path: path.clone(),
                    source: e,
                },
            })?;
        let corrupt = |reason: String| BackendError::Corrupt {
            path: path.clone(),
            reason,
        };
        let envelope: Envelope = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(format!("not a credential file: {e}")))?;
        if envelope.format != CREDENTIAL_FILE_FORMAT {
            return Err(corrupt(format!(
                "unknown format {:?} (expected {CREDENTIAL_FILE_FORMAT:?})",
                envelope.format
            )));
        }
        let nonce = BASE64
            .decode(&envelope.nonce)
            .map_err(|e| corrupt(format!("nonce: {e}")))?;
        let ciphertext = BASE64
            .decode(&envelope.ciphertext)
            .map_err(|e| corrupt(format!("ciphertext: {e}")))?;
        let aad = associated_data(id, &envelope.credential).map_err(corrupt)?;
        let plaintext =
            crypto::open(self.key(), &aad, &nonce, &ciphertext).map_err(|e| match e {
                CryptoError::NonceLength => corrupt(e.to_string()),
                _ => BackendError::Tampered { path: path.clone() },
            })?;
        let credential: Credential = serde_json::from_value(envelope.credential)
            .map_err(|e| corrupt(format!("metadata: {e}")))?;
        if &credential.id != id {
            return Err(BackendError::Tampered { path });
        }
        credential.validate()?;
        let value = SecretValue::from_bytes(plaintext)?;
        Ok((credential, value))
    }

    /// Writes credential `credential` with `value`, replacing any previous version atomically.
    pub fn put_blocking(
        &self,
        credential: &Credential,
        value: &SecretValue,
    ) -> Result<(), BackendError> {
        credential.validate()?;
        let path = self.credential_path(&credential.id);
        let metadata = serde_json::to_value(credential).map_err(|e| BackendError::Corrupt {
            path: path.clone(),
            reason: format!("cannot serialise metadata: {e}"),
        })?;
        let aad =
            associated_data(&credential.id, &metadata).map_err(|reason| BackendError::Corrupt {
                path: path.clone(),
                reason,
            })?;
        let (nonce, ciphertext) = crypto::seal(self.key(), &aad, value.expose().as_bytes())
            .map_err(|e| BackendError::Task(e.to_string()))?;
        let envelope = Envelope {
            format: CREDENTIAL_FILE_FORMAT.to_owned(),
            credential: metadata,
            nonce: BASE64.encode(nonce),
            ciphertext: BASE64.encode(ciphertext),
        };
        let mut bytes =
            serde_json::to_vec_pretty(&envelope).map_err(|e| BackendError::Corrupt {
                path: path.clone(),
                reason: format!("cannot serialise: {e}"),
            })?;
        bytes.push(b'\n');
        fsutil::write_atomic(&self.inner.dir, &file_name(&credential.id), &bytes)
            .map_err(|source| BackendError::Io { path, source })?;
        tracing::debug!(credential = %credential.id, name = %credential.name, "credential file written");
        Ok(())
    }

    /// Deletes credential `id`.
    pub fn delete_blocking(&self, id: &CredentialId) -> Result<(), BackendError> {
        let path = self.credential_path(id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(BackendError::NotFound(id.clone()))
            }
            Err(source) => return Err(BackendError::Io { path, source }),
        }
        fsutil::sync_dir(&self.inner.dir).map_err(|source| BackendError::Io {
            path: self.inner.dir.clone(),
            source,
        })?;
        tracing::debug!(credential = %id, "credential file deleted");
        Ok(())
    }

    /// Every credential's authenticated metadata (see the module doc for why each file is
    /// decrypted). Files that are not credential files are skipped with a warning.
    pub fn list_blocking(&self) -> Result<Vec<Credential>, BackendError> {
        let dir = &self.inner.dir;
        let io_err = |source| BackendError::Io {
            path: dir.clone(),
            source,
        };
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            let id = name
                .strip_suffix(CREDENTIAL_FILE_EXT)
                .and_then(|stem| stem.parse::<CredentialId>().ok());
            let Some(id) = id else {
                tracing::warn!(dir = %dir.display(), file = %name, "skipping a file that is not a credential file");
                continue;
            };
            if out.len() == MAX_STORED_CREDENTIALS {
                return Err(BackendError::TooMany(MAX_STORED_CREDENTIALS));
            }
            let (credential, _value) = self.get_blocking(&id)?;
            out.push(credential);
        }
        Ok(out)
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, BackendError>
    where
        T: Send + 'static,
        F: FnOnce(EncryptedFileStore) -> Result<T, BackendError> + Send + 'static,
    {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(this))
            .await
            .map_err(|e| BackendError::Task(e.to_string()))?
    }
}

fn file_name(id: &CredentialId) -> String {
    format!("{id}{CREDENTIAL_FILE_EXT}")
}

impl SecretBackend for EncryptedFileStore {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn get<'a>(
        &'a self,
        credential: &'a Credential,
    ) -> BoxFuture<'a, Result<SecretValue, BackendError>> {
        let id = credential.id.clone();
        Box::pin(async move {
            let (_meta, value) = self.blocking(move |s| s.get_blocking(&id)).await?;
            Ok(value)
        })
    }

    fn put<'a>(
        &'a self,
        credential: &'a Credential,
        value: &'a SecretValue,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            // The blocking pool needs owned data: a copy, wiped when dropped.
            let owned = value.duplicate();
            let credential = credential.clone();
            self.blocking(move |s| s.put_blocking(&credential, &owned))
                .await
        })
    }

    fn delete<'a>(&'a self, id: &'a CredentialId) -> BoxFuture<'a, Result<(), BackendError>> {
        let id = id.clone();
        Box::pin(async move { self.blocking(move |s| s.delete_blocking(&id)).await })
    }

    fn list_metadata(&self) -> BoxFuture<'_, Result<Vec<Credential>, BackendError>> {
        Box::pin(async move { self.blocking(|s| s.list_blocking()).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyfile::KeyFileError;
    use crate::model::Scope;
    use crate::testutil::{bearer_rule, credential, tenant};
    use std::os::unix::fs::PermissionsExt;
    use zeroize::Zeroizing;

    const VALUE: &str = "ghp_super-secret-value-0123456789";

    fn setup() -> (tempfile::TempDir, EncryptedFileStore, Credential) {
        let dir = tempfile::tempdir().unwrap();
        let store = EncryptedFileStore::open(
            dir.path().join("creds"),
            &dir.path().join("keys/master.key"),
        )
        .unwrap();
        let c = credential(
            "github",
            Scope::Tenant { tenant: tenant() },
            bearer_rule(&["api.github.com"]),
        );
        store
            .put_blocking(&c, &SecretValue::new(VALUE.into()).unwrap())
            .unwrap();
        (dir, store, c)
    }

    fn read_envelope(path: &Path) -> serde_json::Value {
        serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
    }

    fn write_envelope(path: &Path, v: &serde_json::Value) {
        fs::write(path, serde_json::to_vec(v).unwrap()).unwrap();
    }

    #[test]
    fn round_trip_and_the_file_never_holds_the_value() {
        let (_dir, store, c) = setup();
        let (meta, value) = store.get_blocking(&c.id).unwrap();
        assert_eq!(meta, c);
        assert_eq!(value.expose(), VALUE);
        assert_eq!(store.list_blocking().unwrap(), vec![c.clone()]);

        let path = store.credential_path(&c.id);
        let raw = fs::read_to_string(&path).unwrap();
        assert!(!raw.contains(VALUE));
        assert!(!raw.contains(&BASE64.encode(VALUE)));
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let env = read_envelope(&path);
        assert_eq!(env["format"], CREDENTIAL_FILE_FORMAT);
        assert_eq!(env["credential"]["name"], "github");
        assert_eq!(
            BASE64.decode(env["nonce"].as_str().unwrap()).unwrap().len(),
            crypto::NONCE_LEN
        );

        // Replacing keeps one file; deleting removes it.
        let mut c2 = c.clone();
        c2.rule.hosts.push("uploads.github.com".into());
        store
            .put_blocking(&c2, &SecretValue::new("v2".into()).unwrap())
            .unwrap();
        assert_eq!(store.list_blocking().unwrap(), vec![c2]);
        assert_eq!(store.get_blocking(&c.id).unwrap().1.expose(), "v2");
        store.delete_blocking(&c.id).unwrap();
        assert!(matches!(
            store.get_blocking(&c.id),
            Err(BackendError::NotFound(_))
        ));
        assert!(matches!(
            store.delete_blocking(&c.id),
            Err(BackendError::NotFound(_))
        ));
        assert!(store.list_blocking().unwrap().is_empty());
    }

    #[test]
    fn flipping_a_ciphertext_byte_is_detected() {
        let (_dir, store, c) = setup();
        let path = store.credential_path(&c.id);
        let mut env = read_envelope(&path);
        let mut ct = BASE64.decode(env["ciphertext"].as_str().unwrap()).unwrap();
        ct[3] ^= 0x01;
        env["ciphertext"] = BASE64.encode(&ct).into();
        write_envelope(&path, &env);
        assert!(matches!(
            store.get_blocking(&c.id),
            Err(BackendError::Tampered { .. })
        ));
        // Listing fails closed too.
        assert!(store.list_blocking().is_err());
    }

    #[test]
    fn editing_the_metadata_is_detected() {
        let (_dir, store, c) = setup();
        let path = store.credential_path(&c.id);
        let mut env = read_envelope(&path);
        env["credential"]["rule"]["hosts"] =
            serde_json::json!(["api.github.com", "evil.example.net"]);
        write_envelope(&path, &env);
        assert!(matches!(
            store.get_blocking(&c.id),
            Err(BackendError::Tampered { .. })
        ));

        let (_dir, store, c) = setup();
        let path = store.credential_path(&c.id);
        let mut env = read_envelope(&path);
        env["credential"]["expires_at_ms"] = serde_json::json!(9_000_000_000_000i64);
        write_envelope(&path, &env);
        assert!(matches!(
            store.get_blocking(&c.id),
            Err(BackendError::Tampered { .. })
        ));
    }

    #[test]
    fn every_byte_of_the_file_matters() {
        let (_dir, store, c) = setup();
        let path = store.credential_path(&c.id);
        let original = fs::read(&path).unwrap();
        // Flip one bit in each significant byte (whitespace changes are harmless by design).
        for i in 0..original.len() {
            if original[i].is_ascii_whitespace() {
                continue;
            }
            let mut bad = original.clone();
            bad[i] ^= 0x01;
            fs::write(&path, &bad).unwrap();
            assert!(
                store.get_blocking(&c.id).is_err(),
                "byte {i} ({:?})",
                original[i] as char
            );
        }
        fs::write(&path, &original).unwrap();
        assert!(store.get_blocking(&c.id).is_ok());
    }

    #[test]
    fn swapped_files_are_detected() {
        let (_dir, store, a) = setup();
        let b = credential("gitlab", a.scope.clone(), bearer_rule(&["gitlab.com"]));
        store
            .put_blocking(&b, &SecretValue::new("other".into()).unwrap())
            .unwrap();
        // A's file under B's name.
        fs::copy(store.credential_path(&a.id), store.credential_path(&b.id)).unwrap();
        assert!(matches!(
            store.get_blocking(&b.id),
            Err(BackendError::Tampered { .. })
        ));
        // Even with the id inside edited to match.
        let mut env = read_envelope(&store.credential_path(&b.id));
        env["credential"]["id"] = b.id.as_str().into();
        write_envelope(&store.credential_path(&b.id), &env);
        assert!(matches!(
            store.get_blocking(&b.id),
            Err(BackendError::Tampered { .. })
        ));
    }

    #[test]
    fn another_key_cannot_read() {
        let (dir, store, c) = setup();
        let other =
            EncryptedFileStore::open(store.dir(), &dir.path().join("keys/other.key")).unwrap();
        assert!(matches!(
            other.get_blocking(&c.id),
            Err(BackendError::Tampered { .. })
        ));
    }

    #[test]
    fn a_readable_key_file_is_refused() {
        let (dir, store, _c) = setup();
        let key = dir.path().join("keys/master.key");
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        let err = EncryptedFileStore::open(store.dir(), &key).unwrap_err();
        assert!(
            matches!(
                err,
                BackendError::Key(KeyFileError::InsecurePermissions { mode: 0o644, .. })
            ),
            "{err}"
        );
        assert!(err.to_string().contains("0644"));
    }

    #[test]
    fn foreign_files_are_skipped_and_stale_temps_cleaned() {
        let (_dir, store, c) = setup();
        fs::write(store.dir().join("README"), b"hello").unwrap();
        fs::write(store.dir().join("crd-notanid.json"), b"{}").unwrap();
        fs::write(store.dir().join(fsutil::temp_name("crd-x.json")), b"junk").unwrap();
        assert_eq!(store.list_blocking().unwrap(), vec![c]);
        let reopened =
            EncryptedFileStore::open_with_key(store.dir(), Zeroizing::new(*store.key())).unwrap();
        let names: Vec<String> = fs::read_dir(reopened.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(fsutil::TEMP_PREFIX)),
            "{names:?}"
        );
    }

    #[test]
    fn oversized_and_garbage_files_are_corrupt() {
        let (_dir, store, c) = setup();
        let path = store.credential_path(&c.id);
        fs::write(&path, vec![b' '; MAX_CREDENTIAL_FILE_LEN + 1]).unwrap();
        assert!(matches!(
            store.get_blocking(&c.id),
            Err(BackendError::Corrupt { .. })
        ));
        fs::write(&path, b"{}").unwrap();
        assert!(matches!(
            store.get_blocking(&c.id),
            Err(BackendError::Corrupt { .. })
        ));
    }

    #[tokio::test]
    async fn the_backend_trait_works_on_a_runtime() {
        let (_dir, store, c) = setup();
        let backend: &dyn SecretBackend = &store;
        assert_eq!(backend.get(&c).await.unwrap().expose(), VALUE);
        let d = credential("other", c.scope.clone(), bearer_rule(&["x.example.com"]));
        backend
            .put(&d, &SecretValue::new("v".into()).unwrap())
            .await
            .unwrap();
        assert_eq!(backend.list_metadata().await.unwrap().len(), 2);
        backend.delete(&d.id).await.unwrap();
        assert_eq!(backend.list_metadata().await.unwrap(), vec![c]);
    }
}

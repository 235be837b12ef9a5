//! The built-in local key service: each key is 32 random bytes in a file of its own
//! (`<master_key_dir>/<key id>.key`, mode 0600, directory 0700), and a data key is wrapped
//! with XChaCha20-Poly1305 under it, the context as associated data.
//!
//! The weaker choice: the keys are on the same host as the data, only in another directory
//! (outside the data directory, so a copy of that directory does not carry them). For
//! offline and single-machine use. A key is disabled by renaming its file to
//! `<key id>.key.disabled` and destroyed by deleting it ([`LocalService::disable`],
//! [`LocalService::destroy`]).

use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use space_secrets::keyfile::{self, KeyFileError};

use crate::error::{KmsError, Unavailable};
use crate::{BoxFuture, DataKey, KeyAccess, KeyService};

const NONCE_LEN: usize = 24;

/// The local key service.
pub struct LocalService {
    dir: PathBuf,
}

impl LocalService {
    /// Keys in `dir` (created on first key, mode 0700).
    pub fn new(dir: PathBuf) -> LocalService {
        LocalService { dir }
    }

    fn path(&self, key_id: &str) -> Result<PathBuf, KmsError> {
        let ok = !key_id.is_empty()
            && key_id.len() <= 128
            && !key_id.starts_with('.')
            && key_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return Err(KmsError::InvalidAccess(
                "a local key id is 1-128 of [A-Za-z0-9._-], not starting with '.'".into(),
            ));
        }
        Ok(self.dir.join(format!("{key_id}.key")))
    }

    /// Makes key `key_id` if it does not exist (a new key's first version).
    pub fn create(&self, key_id: &str) -> Result<(), KmsError> {
        let path = self.path(key_id)?;
        if disabled_path(&path).exists() {
            return Err(unavailable(Unavailable::Revoked, key_id));
        }
        keyfile::load_or_create_key(&path).map_err(|e| KmsError::Config(e.to_string()))?;
        Ok(())
    }

    /// Disables key `key_id`: nothing wraps or unwraps under it until it is enabled again.
    pub fn disable(&self, key_id: &str) -> Result<(), KmsError> {
        let path = self.path(key_id)?;
        std::fs::rename(&path, disabled_path(&path))
            .map_err(|e| KmsError::Config(format!("{}: {e}", path.display())))
    }

    /// Enables a disabled key again.
    pub fn enable(&self, key_id: &str) -> Result<(), KmsError> {
        let path = self.path(key_id)?;
        std::fs::rename(disabled_path(&path), &path)
            .map_err(|e| KmsError::Config(format!("{}: {e}", path.display())))
    }

    /// Destroys key `key_id` for good: what it wrapped can never be unwrapped.
    pub fn destroy(&self, key_id: &str) -> Result<(), KmsError> {
        let path = self.path(key_id)?;
        for p in [disabled_path(&path), path] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(KmsError::Config(format!("{}: {e}", p.display()))),
            }
        }
        Ok(())
    }

    fn cipher(&self, key_id: &str) -> Result<XChaCha20Poly1305, KmsError> {
        let path = self.path(key_id)?;
        match keyfile::load_key(&path) {
            Ok(key) => Ok(XChaCha20Poly1305::new(key.as_ref().into())),
            Err(KeyFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                if disabled_path(&path).exists() {
                    Err(unavailable(Unavailable::Revoked, key_id))
                } else {
                    Err(unavailable(Unavailable::NotFound, key_id))
                }
            }
            Err(e) => Err(KmsError::Config(e.to_string())),
        }
    }
}

fn disabled_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".disabled");
    PathBuf::from(p)
}

fn unavailable(reason: Unavailable, key_id: &str) -> KmsError {
    KmsError::KeyUnavailable {
        reason,
        detail: format!("local key {key_id}"),
    }
}

impl KeyService for LocalService {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn wrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        data_key: &'a DataKey,
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, KmsError>> {
        Box::pin(async move {
            let cipher = self.cipher(&access.key_id)?;
            let mut nonce = [0u8; NONCE_LEN];
            rand::rngs::OsRng.fill_bytes(&mut nonce);
            let sealed = cipher
                .encrypt(
                    XNonce::from_slice(&nonce),
                    Payload {
                        msg: data_key.expose(),
                        aad: context,
                    },
                )
                .map_err(|_| KmsError::Protocol("local wrap failed".into()))?;
            let mut out = nonce.to_vec();
            out.extend_from_slice(&sealed);
            Ok(out)
        })
    }

    fn unwrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        wrapped: &'a [u8],
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<DataKey, KmsError>> {
        Box::pin(async move {
            let cipher = self.cipher(&access.key_id)?;
            if wrapped.len() <= NONCE_LEN {
                return Err(KmsError::WrappedKeyRejected);
            }
            let (nonce, sealed) = wrapped.split_at(NONCE_LEN);
            let plain = zeroize::Zeroizing::new(
                cipher
                    .decrypt(
                        XNonce::from_slice(nonce),
                        Payload {
                            msg: sealed,
                            aad: context,
                        },
                    )
                    .map_err(|_| KmsError::WrappedKeyRejected)?,
            );
            DataKey::from_bytes(&plain).ok_or(KmsError::WrappedKeyRejected)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check_round_trip;

    fn access(id: &str) -> KeyAccess {
        KeyAccess {
            key_id: id.into(),
            token: None,
            credentials: Default::default(),
        }
    }

    #[tokio::test]
    async fn wraps_bind_the_context_and_disabling_stops_them() {
        let dir = tempfile::tempdir().unwrap();
        let kms = LocalService::new(dir.path().join("kms"));
        let a = access("tenant-a");
        assert!(matches!(
            kms.wrap(&a, &DataKey::generate(), b"c").await,
            Err(KmsError::KeyUnavailable {
                reason: Unavailable::NotFound,
                ..
            })
        ));
        kms.create("tenant-a").unwrap();
        check_round_trip(&kms, &a, b"ctx").await.unwrap();
        let dk = DataKey::generate();
        let wrapped = kms.wrap(&a, &dk, b"tenant-a/dk-1").await.unwrap();
        assert_eq!(wrapped.len(), 72);
        assert_eq!(
            kms.unwrap(&a, &wrapped, b"tenant-a/dk-1")
                .await
                .unwrap()
                .expose(),
            dk.expose()
        );
        assert!(matches!(
            kms.unwrap(&a, &wrapped, b"tenant-a/dk-2").await,
            Err(KmsError::WrappedKeyRejected)
        ));
        let mut flipped = wrapped.clone();
        flipped[30] ^= 1;
        assert!(matches!(
            kms.unwrap(&a, &flipped, b"tenant-a/dk-1").await,
            Err(KmsError::WrappedKeyRejected)
        ));
        kms.create("tenant-b").unwrap();
        assert!(kms
            .unwrap(&access("tenant-b"), &wrapped, b"tenant-a/dk-1")
            .await
            .is_err());

        kms.disable("tenant-a").unwrap();
        assert!(matches!(
            kms.unwrap(&a, &wrapped, b"tenant-a/dk-1").await,
            Err(KmsError::KeyUnavailable {
                reason: Unavailable::Revoked,
                ..
            })
        ));
        kms.enable("tenant-a").unwrap();
        assert!(kms.unwrap(&a, &wrapped, b"tenant-a/dk-1").await.is_ok());
        kms.destroy("tenant-a").unwrap();
        assert!(matches!(
            kms.unwrap(&a, &wrapped, b"tenant-a/dk-1").await,
            Err(KmsError::KeyUnavailable {
                reason: Unavailable::NotFound,
                ..
            })
        ));
        assert!(kms.create("../x").is_err());
    }
}

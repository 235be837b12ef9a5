//! [`Objects`]: one object store, with every object written and read as an [`Artifact`]
//! (key, size, SHA-256).
//!
//! Uploads stream: a file or reader is read in 1 MiB pieces, hashed as it goes, and sent
//! in one PUT when small, else as a multipart upload of [`PART_SIZE`] parts, a few in
//! flight at once (a failed multipart upload is aborted, leaving nothing). S3 requests are
//! retried by the client on transient failures (a server restarting mid-upload).
//! Downloads go to a hidden sibling of the target, are hashed as they arrive and cut off
//! past the recorded size, and are renamed into place only once size and digest match.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::config::{ConfigError, ObjectStoreConfig};
use crate::key::{KeyError, ObjectKey};

/// Size of one part of a multipart upload (S3's minimum is 5 MiB).
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts of one upload in flight at once.
pub const PARTS_IN_FLIGHT: usize = 4;
/// How long one request may take before it is retried (S3).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// An object as it was written: what reading it back must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// Where it is.
    pub key: String,
    /// Its length in bytes.
    pub size: u64,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
}

/// Why an object operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    /// The store's configuration cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A key is malformed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// No such object.
    #[error("object {0} not found")]
    NotFound(String),
    /// What was read back is not what was written.
    #[error("object {key} is corrupt: {reason}")]
    Corrupt {
        /// The object.
        key: String,
        /// What does not match.
        reason: String,
    },
    /// The store failed the request (after the client's retries).
    #[error("object store: {key}: {source}")]
    Store {
        /// The object.
        key: String,
        /// The cause.
        #[source]
        source: object_store::Error,
    },
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// What the store says of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectStat {
    /// Its length in bytes.
    pub size: u64,
    /// When it was last written, ms since the Unix epoch.
    pub modified_ms: i64,
}

impl ObjectsError {
    fn store(key: &str, source: object_store::Error) -> ObjectsError {
        match source {
            object_store::Error::NotFound { .. } => ObjectsError::NotFound(key.to_owned()),
            source => ObjectsError::Store {
                key: key.to_owned(),
                source,
            },
        }
    }

    /// Whether the error is the object's absence.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ObjectsError::NotFound(_))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ObjectsError + '_ {
    move |source| ObjectsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// An object store. Cheap to clone.
#[derive(Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    describe: String,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe)
    }
}

impl Objects {
    /// Opens the store `config` names (a local directory is created if missing).
    pub fn open(config: &ObjectStoreConfig) -> Result<Objects, ObjectsError> {
        match config {
            ObjectStoreConfig::Local { dir } => {
                std::fs::create_dir_all(dir).map_err(io(dir))?;
                let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
                    .map_err(|e| ObjectsError::store(&dir.display().to_string(), e))?;
                Ok(Objects {
                    store: Arc::new(store),
                    describe: format!("local directory {}", dir.display()),
                })
            }
            ObjectStoreConfig::S3(s3) => {
                // object_store's HTTP client uses the process's rustls provider: ring, as
                // everywhere else in SPACE (a second install is refused, harmlessly).
                let _ = rustls::crypto::ring::default_provider().install_default();
                let secret = s3.secret_access_key()?;
                let mut client = object_store::ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(Duration::from_secs(10))
                    .with_allow_http(s3.allow_http);
                if let Some(ca) = &s3.ca_file {
                    let pem = std::fs::read(ca).map_err(io(ca))?;
                    for cert in object_store::Certificate::from_pem_bundle(&pem).map_err(|e| {
                        ObjectsError::Config(ConfigError::Invalid {
                            path: ca.clone(),
                            reason: e.to_string(),
                        })
                    })? {
                        client = client.with_root_certificate(cert);
                    }
                }
                let mut builder = object_store::aws::AmazonS3Builder::new()
                    .with_region(&s3.region)
                    .with_bucket_name(&s3.bucket)
                    .with_access_key_id(&s3.access_key_id)
                    .with_secret_access_key(secret.as_str())
                    .with_allow_http(s3.allow_http)
                    .with_client_options(client)
                    .with_retry(object_store::RetryConfig {
                        max_retries: 10,
                        retry_timeout: Duration::from_secs(180),
                        ..Default::default()
                    });
                if let Some(endpoint) = &s3.endpoint {
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_virtual_hosted_style_request(false);
                }
                let store = builder
                    .build()
                    .map_err(|e| ObjectsError::store(&s3.bucket, e))?;
                Ok(Objects {
                    store: Arc::new(store),
                    describe: format!(
                        "S3 bucket {} at {}",
                        s3.bucket,
                        s3.endpoint.as_deref().unwrap_or("AWS")
                    ),
                })
            }
        }
    }

    fn path(key: &ObjectKey) -> StorePath {
        StorePath::from(key.as_str())
    }

    /// Uploads the file at `path` to `key`.
    pub async fn put_file(&self, key: &ObjectKey, path: &Path) -> Result<Artifact, ObjectsError> {
        let file = tokio::fs::File::open(path).await.map_err(io(path))?;
        self.put_reader(key, file).await
    }

    /// Uploads what `reader` yields, to its end, to `key`.
    pub async fn put_reader<R>(
        &self,
        key: &ObjectKey,
        mut reader: R,
    ) -> Result<Artifact, ObjectsError>
    where
        R: AsyncRead + Unpin,
    {
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        let mut first = Vec::with_capacity(PART_SIZE);
        // Read up to one part: a small object goes in one PUT.
        let eof = fill(&mut reader, &mut first, PART_SIZE, key).await?;
        hasher.update(&first);
        size += first.len() as u64;
        if eof {
            self.store
                .put(&Self::path(key), PutPayload::from(first))
                .await
                .map_err(|e| ObjectsError::store(key.as_str(), e))?;
            return Ok(self.finished(key, size, hasher));
        }
        let upload = self
            .store
            .put_multipart(&Self::path(key))
            .await
            .map_err(|e| ObjectsError::store(key.as_str(), e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        writer.put(Bytes::from(first));
        let result: Result<(), ObjectsError> = async {
            let mut buf = vec![0u8; 1024 * 1024];
            loop {
                writer
                    .wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .map_err(|e| ObjectsError::store(key.as_str(), e))?;
                let n = reader.read(&mut buf).await.map_err(|e| ObjectsError::Io {
                    path: PathBuf::from(key.as_str()),
                    source: e,
                })?;
                if n == 0 {
                    return Ok(());
                }
                hasher.update(&buf[..n]);
                size += n as u64;
                writer.write(&buf[..n]);
            }
        }
        .await;
        match result {
            Ok(()) => {
                writer
                    .finish()
                    .await
                    .map_err(|e| ObjectsError::store(key.as_str(), e))?;
                Ok(self.finished(key, size, hasher))
            }
            Err(e) => {
                if let Err(abort) = writer.abort().await {
                    tracing::warn!(key = %key, error = %abort, "could not abort a failed multipart upload");
                }
                Err(e)
            }
        }
    }

    /// Uploads `bytes` to `key`.
    pub async fn put_bytes(&self, key: &ObjectKey, bytes: Bytes) -> Result<Artifact, ObjectsError> {
        let mut hasher = Sha256::new();
        hasher.update(&bytes);
        let size = bytes.len() as u64;
        self.store
            .put(&Self::path(key), PutPayload::from(bytes))
            .await
            .map_err(|e| ObjectsError::store(key.as_str(), e))?;
        Ok(self.finished(key, size, hasher))
    }

    fn finished(&self, key: &ObjectKey, size: u64, hasher: Sha256) -> Artifact {
        let artifact = Artifact {
            key: key.as_str().to_owned(),
            size,
            sha256: hex::encode(hasher.finalize()),
        };
        tracing::debug!(key = %key, size, store = %self.describe, "object written");
        artifact
    }

    /// Checks that `artifact` is stored with its recorded size (the digest is checked when
    /// it is read).
    pub async fn check(&self, artifact: &Artifact) -> Result<(), ObjectsError> {
        let key = ObjectKey::parse(&artifact.key)?;
        let meta = self
            .store
            .head(&Self::path(&key))
            .await
            .map_err(|e| ObjectsError::store(&artifact.key, e))?;
        if meta.size != artifact.size {
            return Err(ObjectsError::Corrupt {
                key: artifact.key.clone(),
                reason: format!("{} bytes stored, {} recorded", meta.size, artifact.size),
            });
        }
        Ok(())
    }

    /// Downloads `artifact` to `path`, which appears only once size and digest match.
    pub async fn get_to_file(&self, artifact: &Artifact, path: &Path) -> Result<(), ObjectsError> {
        let partial = partial_path(path);
        let result = self.download(artifact, &partial).await;
        match result {
            Ok(()) => tokio::fs::rename(&partial, path).await.map_err(io(path)),
            Err(e) => {
                let _ = tokio::fs::remove_file(&partial).await;
                Err(e)
            }
        }
    }

    async fn download(&self, artifact: &Artifact, to: &Path) -> Result<(), ObjectsError> {
        let key = ObjectKey::parse(&artifact.key)?;
        let got = self
            .store
            .get(&Self::path(&key))
            .await
            .map_err(|e| ObjectsError::store(&artifact.key, e))?;
        let mut file = tokio::fs::File::create(to).await.map_err(io(to))?;
        let mut stream = got.into_stream();
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ObjectsError::store(&artifact.key, e))?;
            size += chunk.len() as u64;
            if size > artifact.size {
                return Err(ObjectsError::Corrupt {
                    key: artifact.key.clone(),
                    reason: format!("longer than the {} bytes recorded", artifact.size),
                });
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(io(to))?;
        }
        verify(artifact, size, hasher)?;
        file.sync_all().await.map_err(io(to))?;
        Ok(())
    }

    /// Reads a small `artifact` (at most `max` bytes) into memory, verified.
    pub async fn get_bytes(&self, artifact: &Artifact, max: u64) -> Result<Bytes, ObjectsError> {
        if artifact.size > max {
            return Err(ObjectsError::Corrupt {
                key: artifact.key.clone(),
                reason: format!(
                    "{} bytes recorded, more than the {max} expected",
                    artifact.size
                ),
            });
        }
        let key = ObjectKey::parse(&artifact.key)?;
        let got = self
            .store
            .get(&Self::path(&key))
            .await
            .map_err(|e| ObjectsError::store(&artifact.key, e))?;
        let mut stream = got.into_stream();
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ObjectsError::store(&artifact.key, e))?;
            if (out.len() + chunk.len()) as u64 > artifact.size {
                return Err(ObjectsError::Corrupt {
                    key: artifact.key.clone(),
                    reason: format!("longer than the {} bytes recorded", artifact.size),
                });
            }
            out.extend_from_slice(&chunk);
        }
        let mut hasher = Sha256::new();
        hasher.update(&out);
        verify(artifact, out.len() as u64, hasher)?;
        Ok(Bytes::from(out))
    }

    /// Reads the small object at `key` whose digest is not known beforehand (a manifest that
    /// describes other objects), at most `max` bytes; `None` if there is none. What it says
    /// is checked by whoever parses it; the objects it names are read verified.
    pub async fn get_manifest(
        &self,
        key: &ObjectKey,
        max: u64,
    ) -> Result<Option<Bytes>, ObjectsError> {
        let got = match self.store.get(&Self::path(key)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(ObjectsError::store(key.as_str(), e)),
        };
        let mut stream = got.into_stream();
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ObjectsError::store(key.as_str(), e))?;
            if (out.len() + chunk.len()) as u64 > max {
                return Err(ObjectsError::Corrupt {
                    key: key.as_str().to_owned(),
                    reason: format!("longer than the {max} bytes a manifest may have"),
                });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Some(Bytes::from(out)))
    }

    /// Uploads what `reader` yields to `key` only if it is at most `max` bytes and, given
    /// `sha256` (lowercase hex), has that SHA-256: a content-addressed object. The bytes go
    /// first to a key of their own under `incoming/` and are renamed into place once they
    /// pass, so `key` never holds anything else, not even for a moment, and a bad upload
    /// does not replace a good one. A good one replaces what is there.
    pub async fn put_checked<R>(
        &self,
        key: &ObjectKey,
        reader: R,
        sha256: Option<&str>,
        max: u64,
    ) -> Result<Artifact, ObjectsError>
    where
        R: AsyncRead + Unpin,
    {
        let staging = ObjectKey::join(&["incoming", &random_name()])?;
        // One byte past the bound tells an upload that is too long.
        let artifact = self.put_reader(&staging, reader.take(max + 1)).await?;
        let refused = if artifact.size > max {
            Some(format!("longer than the {max} bytes allowed"))
        } else if sha256.is_some_and(|want| artifact.sha256 != want) {
            Some(format!("its bytes hash to {}", artifact.sha256))
        } else {
            None
        };
        if let Some(reason) = refused {
            self.delete(&staging).await?;
            return Err(ObjectsError::Corrupt {
                key: key.as_str().to_owned(),
                reason,
            });
        }
        self.store
            .rename(&Self::path(&staging), &Self::path(key))
            .await
            .map_err(|e| ObjectsError::store(key.as_str(), e))?;
        Ok(Artifact {
            key: key.as_str().to_owned(),
            ..artifact
        })
    }

    /// Size and time of the object at `key`, if there is one.
    pub async fn stat(&self, key: &ObjectKey) -> Result<Option<ObjectStat>, ObjectsError> {
        match self.store.head(&Self::path(key)).await {
            Ok(meta) => Ok(Some(ObjectStat {
                size: meta.size,
                modified_ms: meta.last_modified.timestamp_millis(),
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(ObjectsError::store(key.as_str(), e)),
        }
    }

    /// The size of the object at `key`, if there is one.
    pub async fn size(&self, key: &ObjectKey) -> Result<Option<u64>, ObjectsError> {
        match self.store.head(&Self::path(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(ObjectsError::store(key.as_str(), e)),
        }
    }

    /// Deletes the object at `key` (one that is not there is no error).
    pub async fn delete(&self, key: &ObjectKey) -> Result<(), ObjectsError> {
        match self.store.delete(&Self::path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(ObjectsError::store(key.as_str(), e)),
        }
    }

    /// Every object under `prefix`: key, size, last modified (ms since the Unix epoch).
    pub async fn list(&self, prefix: &ObjectKey) -> Result<Vec<(String, u64, i64)>, ObjectsError> {
        let path = Self::path(prefix);
        let mut stream = self.store.list(Some(&path));
        let mut out = Vec::new();
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|e| ObjectsError::store(prefix.as_str(), e))?;
            out.push((
                meta.location.to_string(),
                meta.size,
                meta.last_modified.timestamp_millis(),
            ));
        }
        Ok(out)
    }

    /// Deletes every object under `prefix`; returns how many.
    pub async fn delete_prefix(&self, prefix: &ObjectKey) -> Result<usize, ObjectsError> {
        let listed = self.list(prefix).await?;
        for (key, _, _) in &listed {
            self.delete(&ObjectKey::parse(key)?).await?;
        }
        Ok(listed.len())
    }
}

/// Reads from `reader` into `buf` until it holds `limit` bytes or the reader ends; returns
/// whether it ended.
async fn fill<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    limit: usize,
    key: &ObjectKey,
) -> Result<bool, ObjectsError> {
    let mut chunk = vec![0u8; 1024 * 1024];
    while buf.len() < limit {
        let want = (limit - buf.len()).min(chunk.len());
        let n = reader
            .read(&mut chunk[..want])
            .await
            .map_err(|e| ObjectsError::Io {
                path: PathBuf::from(key.as_str()),
                source: e,
            })?;
        if n == 0 {
            return Ok(true);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(false)
}

fn verify(artifact: &Artifact, size: u64, hasher: Sha256) -> Result<(), ObjectsError> {
    if size != artifact.size {
        return Err(ObjectsError::Corrupt {
            key: artifact.key.clone(),
            reason: format!("{size} bytes read, {} recorded", artifact.size),
        });
    }
    let digest = hex::encode(hasher.finalize());
    if digest != artifact.sha256 {
        return Err(ObjectsError::Corrupt {
            key: artifact.key.clone(),
            reason: "its SHA-256 is not the one recorded".into(),
        });
    }
    Ok(())
}

/// Where a download goes until it is verified: a hidden sibling of `path`.
/// A fresh name no other upload has.
fn random_name() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn partial_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.partial"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(dir: &Path) -> Objects {
        Objects::open(&ObjectStoreConfig::Local {
            dir: dir.join("objects"),
        })
        .unwrap()
    }

    #[tokio::test]
    async fn small_and_multipart_objects_round_trip_verified() {
        let dir = tempfile::tempdir().unwrap();
        let objects = local(dir.path());
        for size in [0usize, 10, PART_SIZE - 1, PART_SIZE, PART_SIZE * 2 + 12345] {
            let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            let src = dir.path().join("src");
            std::fs::write(&src, &data).unwrap();
            let key = ObjectKey::snapshot_artifact("snp-1", &format!("a{size}")).unwrap();
            let art = objects.put_file(&key, &src).await.unwrap();
            assert_eq!(art.size, size as u64);
            assert_eq!(art.sha256, hex::encode(Sha256::digest(&data)));
            objects.check(&art).await.unwrap();
            let out = dir.path().join("out");
            objects.get_to_file(&art, &out).await.unwrap();
            assert_eq!(std::fs::read(&out).unwrap(), data, "{size}");
        }
        let listed = objects
            .list(&ObjectKey::snapshot_prefix("snp-1").unwrap())
            .await
            .unwrap();
        assert_eq!(listed.len(), 5);
        assert_eq!(
            objects
                .delete_prefix(&ObjectKey::snapshot_prefix("snp-1").unwrap())
                .await
                .unwrap(),
            5
        );
    }

    #[tokio::test]
    async fn a_changed_or_truncated_object_is_refused_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let objects = local(dir.path());
        let key = ObjectKey::snapshot_artifact("snp-2", "vm.state").unwrap();
        let art = objects
            .put_bytes(&key, Bytes::from_static(b"the state of a vm"))
            .await
            .unwrap();
        let stored = dir.path().join("objects/snapshots/snp-2/vm.state");
        let out = dir.path().join("restored");
        for (what, content) in [
            ("changed", &b"the state of a VM"[..]),
            ("truncated", &b"the state"[..]),
            ("longer", &b"the state of a vm, and more"[..]),
        ] {
            std::fs::write(&stored, content).unwrap();
            let err = objects.get_to_file(&art, &out).await.unwrap_err();
            assert!(matches!(err, ObjectsError::Corrupt { .. }), "{what}: {err}");
            assert!(!out.exists(), "{what}: nothing kept");
            assert!(!partial_path(&out).exists(), "{what}: no partial file");
            assert!(objects.get_bytes(&art, 1024).await.is_err(), "{what}");
        }
        std::fs::remove_file(&stored).unwrap();
        assert!(objects
            .get_to_file(&art, &out)
            .await
            .unwrap_err()
            .is_not_found());
        assert_eq!(objects.size(&key).await.unwrap(), None);
        objects.delete(&key).await.unwrap();
    }

    #[tokio::test]
    async fn a_named_upload_is_kept_only_when_its_bytes_match_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let objects = local(dir.path());
        let data = b"files for a COPY".to_vec();
        let sha = hex::encode(Sha256::digest(&data));
        let key = ObjectKey::build_files(&sha).unwrap();
        let incoming = ObjectKey::parse("incoming").unwrap();
        let wrong = objects
            .put_checked(&key, &b"other bytes"[..], Some(&sha), 1024)
            .await;
        assert!(
            matches!(wrong, Err(ObjectsError::Corrupt { .. })),
            "{wrong:?}"
        );
        let long = objects.put_checked(&key, &data[..], Some(&sha), 4).await;
        assert!(
            matches!(long, Err(ObjectsError::Corrupt { .. })),
            "{long:?}"
        );
        assert_eq!(objects.stat(&key).await.unwrap(), None);
        assert!(objects.list(&incoming).await.unwrap().is_empty());
        let art = objects
            .put_checked(&key, &data[..], Some(&sha), 1024)
            .await
            .unwrap();
        assert_eq!(
            (art.size, art.sha256.as_str()),
            (data.len() as u64, sha.as_str())
        );
        assert_eq!(objects.get_bytes(&art, 1024).await.unwrap(), data);
        // Written anew; a bad upload later leaves it as it was.
        let again = objects
            .put_checked(&key, &data[..], Some(&sha), 1024)
            .await
            .unwrap();
        assert_eq!(again, art);
        assert!(objects
            .put_checked(&key, &b"x"[..], Some(&sha), 1024)
            .await
            .is_err());
        assert_eq!(objects.get_bytes(&art, 1024).await.unwrap(), data);
        assert!(objects.list(&incoming).await.unwrap().is_empty());
    }
}

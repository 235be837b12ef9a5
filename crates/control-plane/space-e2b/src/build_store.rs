//! Where E2B's template builds keep what comes before SPACE's build starts: each build asked
//! for (`POST /v3/templates`) and the files the SDK uploads for its `COPY`s.
//!
//! With an object store (a cluster's, or the single machine's default directory) both live
//! there — `e2b-builds/<build id>.json`, `e2b-uploads/<tenant>/<hash>` — so any replica
//! serves any of a build's requests. Without one they are kept on this replica's disk.
//! Builds asked for are kept a day, uploads a week after they were written; an upload is
//! reported absent from its sixth day, so the SDK (which asks before it uploads) sends it
//! again, renewing it, rather than losing it under a build.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use space_objects::{ObjectKey, Objects, ObjectsError};
use tokio::io::AsyncWriteExt;

use crate::rest::error::RestError;

/// Largest upload of one `COPY`'s files (gzipped tar).
pub const MAX_UPLOAD_BYTES: u64 = crate::template_files::MAX_BYTES;
/// How long uploads are kept after they were written (or, on a disk, last used).
const FILES_KEEP_MS: i64 = 7 * 24 * 3600 * 1000;
/// From this age an upload is reported absent, so that it is sent again.
const FILES_RENEW_MS: i64 = FILES_KEEP_MS - 24 * 3600 * 1000;
/// How long a build asked for may wait to be started.
const ASKED_KEEP_MS: i64 = 24 * 3600 * 1000;
/// Longest record of a build asked for.
const MAX_ASKED_BYTES: u64 = 64 * 1024;
/// How often the object store is swept (each sweep lists its prefixes).
const SWEEP_EVERY_MS: i64 = 3600 * 1000;

/// A build asked for and not started yet (or started: then its status is SPACE's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AskedBuild {
    pub(crate) build_id: String,
    pub(crate) tenant: String,
    pub(crate) template_id: String,
    /// The name asked for, then `NAME:TAG` for each tag.
    pub(crate) names: Vec<String>,
    pub(crate) asked_at_ms: i64,
    pub(crate) started: bool,
}

/// Builds asked for and their uploads (see the module doc). Cheap to clone.
#[derive(Debug, Clone)]
pub struct BuildStore {
    /// On this replica's disk: `builds/<build id>.json`, `files/<tenant>/<hash>`.
    root: PathBuf,
    objects: Option<Objects>,
    last_sweep_ms: Arc<AtomicI64>,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

pub(crate) fn internal(e: impl std::fmt::Display) -> RestError {
    RestError::new(500, format!("template builds: {e}"))
}

fn unavailable(e: ObjectsError) -> RestError {
    tracing::warn!(error = %e, "object store unavailable for E2B template builds");
    RestError::new(503, format!("the object store is unavailable: {e}"))
}

impl BuildStore {
    /// In the object store when there is one, else under `root` (made when first written).
    pub fn new(root: PathBuf, objects: Option<Objects>) -> Self {
        BuildStore {
            root,
            objects,
            last_sweep_ms: Arc::default(),
        }
    }

    fn build_path(&self, build_id: &str) -> PathBuf {
        self.root.join("builds").join(format!("{build_id}.json"))
    }

    fn files_path(&self, tenant: &str, hash: &str) -> PathBuf {
        self.root.join("files").join(tenant).join(hash)
    }

    fn build_key(build_id: &str) -> Result<ObjectKey, RestError> {
        ObjectKey::join(&["e2b-builds", &format!("{build_id}.json")]).map_err(internal)
    }

    fn upload_key(tenant: &str, hash: &str) -> Result<ObjectKey, RestError> {
        ObjectKey::join(&["e2b-uploads", tenant, hash]).map_err(internal)
    }

    /// Keeps `asked` (replacing what was kept under its id).
    pub(crate) async fn save(&self, asked: &AskedBuild) -> Result<(), RestError> {
        let json = serde_json::to_vec(asked).map_err(internal)?;
        match &self.objects {
            Some(objects) => {
                let key = Self::build_key(&asked.build_id)?;
                objects
                    .put_bytes(&key, json.into())
                    .await
                    .map(drop)
                    .map_err(unavailable)
            }
            None => write_atomic(&self.build_path(&asked.build_id), &json).await,
        }
    }

    /// The build asked for under `build_id`, if it is kept.
    pub(crate) async fn load(&self, build_id: &str) -> Result<Option<AskedBuild>, RestError> {
        if !space_core::template::validate_build_id(build_id) {
            return Ok(None);
        }
        let bytes = match &self.objects {
            Some(objects) => objects
                .get_manifest(&Self::build_key(build_id)?, MAX_ASKED_BYTES)
                .await
                .map_err(unavailable)?
                .map(|b| b.to_vec()),
            None => tokio::fs::read(self.build_path(build_id)).await.ok(),
        };
        // A record that does not parse is no build of ours.
        Ok(bytes.and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// Whether tenant `tenant`'s upload `hash` is kept (and not about to go).
    pub(crate) async fn has_upload(&self, tenant: &str, hash: &str) -> Result<bool, RestError> {
        match &self.objects {
            Some(objects) => {
                let stat = objects
                    .stat(&Self::upload_key(tenant, hash)?)
                    .await
                    .map_err(unavailable)?;
                Ok(stat.is_some_and(|s| now_ms() - s.modified_ms < FILES_RENEW_MS))
            }
            None => Ok(tokio::fs::metadata(self.files_path(tenant, hash))
                .await
                .is_ok()),
        }
    }

    /// Keeps `body` as tenant `tenant`'s upload `hash`: at most [`MAX_UPLOAD_BYTES`]
    /// (`413` past that), in place only once whole.
    pub(crate) async fn put_upload(
        &self,
        tenant: &str,
        hash: &str,
        body: Body,
    ) -> Result<(), RestError> {
        let too_large = || {
            RestError::new(
                413,
                format!("a COPY's files are at most {MAX_UPLOAD_BYTES} bytes"),
            )
        };
        let stream = body.into_data_stream().map_err(std::io::Error::other);
        match &self.objects {
            Some(objects) => {
                let reader = tokio_util::io::StreamReader::new(stream);
                let key = Self::upload_key(tenant, hash)?;
                match objects
                    .put_checked(&key, reader, None, MAX_UPLOAD_BYTES)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(ObjectsError::Corrupt { .. }) => Err(too_large()),
                    Err(ObjectsError::Io { source, .. }) => Err(RestError::bad_request(format!(
                        "reading the upload: {source}"
                    ))),
                    Err(e) => Err(unavailable(e)),
                }
            }
            None => {
                let path = self.files_path(tenant, hash);
                write_stream_atomic(&path, stream, MAX_UPLOAD_BYTES, too_large).await
            }
        }
    }

    /// Tenant `tenant`'s upload `hash`, if it is kept (on a disk, its time renewed: it is
    /// kept another week).
    pub(crate) async fn read_upload(
        &self,
        tenant: &str,
        hash: &str,
    ) -> Result<Option<Vec<u8>>, RestError> {
        match &self.objects {
            Some(objects) => Ok(objects
                .get_manifest(&Self::upload_key(tenant, hash)?, MAX_UPLOAD_BYTES)
                .await
                .map_err(unavailable)?
                .map(|b| b.to_vec())),
            None => {
                let path = self.files_path(tenant, hash);
                match tokio::fs::read(&path).await {
                    Ok(bytes) => {
                        if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                            let now = std::fs::FileTimes::new()
                                .set_modified(std::time::SystemTime::now());
                            let _ = f.set_times(now);
                        }
                        Ok(Some(bytes))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(internal(e)),
                }
            }
        }
    }

    /// Removes what is older than it may be kept (builds never started, old uploads); in
    /// the object store at most once per [`SWEEP_EVERY_MS`] from this replica.
    pub(crate) async fn sweep(&self) {
        match &self.objects {
            Some(objects) => {
                let now = now_ms();
                let last = self.last_sweep_ms.load(Ordering::Relaxed);
                if now - last < SWEEP_EVERY_MS
                    || self
                        .last_sweep_ms
                        .compare_exchange(last, now, Ordering::SeqCst, Ordering::Relaxed)
                        .is_err()
                {
                    return;
                }
                for (prefix, keep) in [
                    ("e2b-builds", ASKED_KEEP_MS),
                    ("e2b-uploads", FILES_KEEP_MS),
                ] {
                    if let Err(e) = sweep_prefix(objects, prefix, now - keep).await {
                        tracing::warn!(prefix, error = %e, "cannot sweep E2B template builds");
                    }
                }
            }
            None => {
                let root = self.root.clone();
                let _ = tokio::task::spawn_blocking(move || sweep_dir(&root)).await;
            }
        }
    }
}

async fn sweep_prefix(objects: &Objects, prefix: &str, before_ms: i64) -> Result<(), ObjectsError> {
    for (key, _, modified_ms) in objects.list(&ObjectKey::parse(prefix)?).await? {
        if modified_ms < before_ms {
            objects.delete(&ObjectKey::parse(&key)?).await?;
        }
    }
    Ok(())
}

fn sweep_dir(root: &Path) {
    let sweep = |dir: &Path, keep_ms: i64| {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let age_ms = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            if age_ms > keep_ms && e.path().is_file() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    };
    sweep(&root.join("builds"), ASKED_KEEP_MS);
    if let Ok(tenants) = std::fs::read_dir(root.join("files")) {
        for t in tenants.flatten() {
            sweep(&t.path(), FILES_KEEP_MS);
        }
    }
}

/// A fresh hidden name beside `path` for writing it whole before it appears.
fn temporary_beside(path: &Path) -> Result<(PathBuf, PathBuf), RestError> {
    let dir = path
        .parent()
        .ok_or_else(|| internal("no parent directory"))?
        .to_owned();
    let tmp = dir.join(format!(
        ".tmp-{}",
        space_core::SandboxId::generate().as_str()
    ));
    Ok((dir, tmp))
}

async fn write_atomic(path: &Path, data: &[u8]) -> Result<(), RestError> {
    let (dir, tmp) = temporary_beside(path)?;
    tokio::fs::create_dir_all(&dir).await.map_err(internal)?;
    tokio::fs::write(&tmp, data).await.map_err(internal)?;
    tokio::fs::rename(&tmp, path).await.map_err(internal)
}

async fn write_stream_atomic(
    path: &Path,
    mut stream: impl futures::Stream<Item = std::io::Result<bytes::Bytes>> + Unpin,
    max: u64,
    too_large: impl Fn() -> RestError,
) -> Result<(), RestError> {
    let (dir, tmp) = temporary_beside(path)?;
    tokio::fs::create_dir_all(&dir).await.map_err(internal)?;
    let result = async {
        let mut file = tokio::fs::File::create(&tmp).await.map_err(internal)?;
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| RestError::bad_request(format!("reading the upload: {e}")))?;
            size += chunk.len() as u64;
            if size > max {
                return Err(too_large());
            }
            file.write_all(&chunk).await.map_err(internal)?;
        }
        file.sync_all().await.map_err(internal)?;
        tokio::fs::rename(&tmp, path).await.map_err(internal)
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result
}

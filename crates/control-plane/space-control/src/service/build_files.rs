//! The archives build steps' `COPY` reads (tar files named by their SHA-256), uploaded
//! before the build that needs them.
//!
//! With an object store they go there (`build-files/<sha256>`), checked against their name
//! before anything can read them, so a build on any node of a cluster finds them: the node
//! fetches an archive it lacks when a step needs it. Without one (a single node with no
//! store) they go straight to the node, and only the operator may upload. An archive is
//! kept [`KEEP_MS`] after its upload; one that old is reported absent a day before it goes,
//! so a client that checks first uploads it again (which renews it) rather than losing it
//! under a running build.
//!
//! Content is stored once, whoever uploads it, but who uploaded what is not shared: a
//! tenant's upload leaves a mark (`build-file-owners/<tenant>/<sha256>`), a tenant is told
//! an archive is there only if it uploaded it itself, and its builds may copy only from
//! such archives. So nobody learns, by asking for a hash, that another tenant has a file,
//! and a tenant that already holds the mark does not send the bytes again.

use futures::stream::BoxStream;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use space_core::build_steps::{validate_files_hash, MAX_BUILD_FILES_BYTES};
use space_core::ErrorCode;
use space_objects::{ObjectKey, Objects, ObjectsError};

use crate::api::error::ApiError;
use crate::db::now_ms;
use crate::service::Caller;
use crate::AppState;

/// How long an archive is kept after its upload.
pub const KEEP_MS: i64 = 7 * 24 * 3600 * 1000;
/// From this age an archive is reported absent (so it is uploaded again before it goes).
pub const RENEW_AFTER_MS: i64 = KEEP_MS - 24 * 3600 * 1000;
/// Uploads under `incoming/` are removed once this old (a finished one is renamed at once;
/// these were cut off).
const INCOMING_KEEP_MS: i64 = 3600 * 1000;

/// Whether an archive of files for build steps is uploaded.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BuildFiles {
    /// The archive's SHA-256 (hex).
    pub sha256: String,
    /// Whether it is there.
    pub present: bool,
    /// Its size, once uploaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// Stores an archive of files for build steps' `COPY`, for `caller` (see the module doc).
pub async fn put(
    st: &AppState,
    caller: &Caller,
    sha256: &str,
    body: BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
) -> Result<BuildFiles, ApiError> {
    check_hash(sha256)?;
    let size = match &st.objects {
        Some(objects) => {
            let key = key(sha256)?;
            // There for this caller and not about to be reported absent: kept, and the
            // body not read. Otherwise the caller proves it has the bytes by sending them.
            if let Some(size) = present_for(objects, caller, &key, sha256).await? {
                return Ok(BuildFiles {
                    sha256: sha256.to_owned(),
                    present: true,
                    size: Some(size),
                });
            }
            let reader = tokio_util::io::StreamReader::new(body.map_err(std::io::Error::other));
            let stored = objects
                .put_checked(&key, reader, Some(sha256), MAX_BUILD_FILES_BYTES)
                .await
                .map_err(|e| match e {
                    ObjectsError::Corrupt { reason, .. } => {
                        ApiError::invalid(format!("not the archive {sha256}: {reason}"))
                    }
                    ObjectsError::Io { source, .. } => {
                        ApiError::invalid(format!("reading the archive: {source}"))
                    }
                    other => unavailable(other),
                })?;
            if !caller.is_operator() {
                let mark = owner_key(caller, sha256)?;
                objects
                    .put_bytes(&mark, bytes::Bytes::new())
                    .await
                    .map_err(unavailable)?;
            }
            stored.size
        }
        None => {
            caller.require_operator()?;
            st.nodes.any()?.put_build_files(sha256, body).await?
        }
    };
    Ok(BuildFiles {
        sha256: sha256.to_owned(),
        present: true,
        size: Some(size),
    })
}

/// Whether the archive `sha256` is uploaded.
pub async fn get(st: &AppState, caller: &Caller, sha256: &str) -> Result<BuildFiles, ApiError> {
    check_hash(sha256)?;
    let (present, size) = match &st.objects {
        Some(objects) => {
            let size = present_for(objects, caller, &key(sha256)?, sha256).await?;
            (size.is_some(), size)
        }
        None => {
            caller.require_operator()?;
            (st.nodes.any()?.has_build_files(sha256).await?, None)
        }
    };
    Ok(BuildFiles {
        sha256: sha256.to_owned(),
        present,
        size,
    })
}

/// Whether `caller` may copy from archive `sha256` in a build: the operator from any
/// archive (the node says whether it is there), a tenant from those it uploaded.
pub async fn uploaded_by(st: &AppState, caller: &Caller, sha256: &str) -> Result<bool, ApiError> {
    if caller.is_operator() {
        return Ok(true);
    }
    let Some(objects) = &st.objects else {
        return Ok(false);
    };
    check_hash(sha256)?;
    Ok(present_for(objects, caller, &key(sha256)?, sha256)
        .await?
        .is_some())
}

/// Removes the archives past [`KEEP_MS`], their marks, and cut-off uploads (the leader's,
/// hourly); returns how many went.
pub async fn collect(st: &AppState) -> Result<usize, ObjectsError> {
    let Some(objects) = st.objects.as_ref() else {
        return Ok(0);
    };
    let now = now_ms();
    let mut removed = 0;
    for (prefix, keep) in [
        ("build-files", KEEP_MS),
        ("build-file-owners", KEEP_MS),
        ("incoming", INCOMING_KEEP_MS),
    ] {
        let listed = objects.list(&ObjectKey::parse(prefix)?).await?;
        for key in expired(&listed, now - keep) {
            objects.delete(&ObjectKey::parse(key)?).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// The keys of a listing written before `before_ms`. Pure.
pub fn expired(listing: &[(String, u64, i64)], before_ms: i64) -> impl Iterator<Item = &str> {
    listing
        .iter()
        .filter(move |(_, _, modified)| *modified < before_ms)
        .map(|(key, _, _)| key.as_str())
}

/// The size of the archive at `key`, unless it is absent or old enough to be renewed.
async fn fresh_size(objects: &Objects, key: &ObjectKey) -> Result<Option<u64>, ApiError> {
    let stat = objects.stat(key).await.map_err(unavailable)?;
    Ok(stat
        .filter(|s| now_ms() - s.modified_ms < RENEW_AFTER_MS)
        .map(|s| s.size))
}

/// The size of archive `key`, if it is there for `caller` and not about to be reported
/// absent: for a tenant, also its own mark must be.
async fn present_for(
    objects: &Objects,
    caller: &Caller,
    key: &ObjectKey,
    sha256: &str,
) -> Result<Option<u64>, ApiError> {
    if !caller.is_operator()
        && fresh_size(objects, &owner_key(caller, sha256)?)
            .await?
            .is_none()
    {
        return Ok(None);
    }
    fresh_size(objects, key).await
}

fn owner_key(caller: &Caller, sha256: &str) -> Result<ObjectKey, ApiError> {
    ObjectKey::build_files_owner(caller.id.as_str(), sha256).map_err(ApiError::internal)
}

fn key(sha256: &str) -> Result<ObjectKey, ApiError> {
    ObjectKey::build_files(sha256).map_err(ApiError::internal)
}

fn unavailable(e: ObjectsError) -> ApiError {
    tracing::warn!(error = %e, "object store unavailable for build files");
    ApiError::new(
        ErrorCode::StorageUnavailable,
        format!("the object store is unavailable: {e}"),
    )
}

fn check_hash(sha256: &str) -> Result<(), ApiError> {
    if validate_files_hash(sha256) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "files are named by the lowercase hex SHA-256 of their tar archive",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_past_its_time_expires() {
        let listing = vec![
            ("build-files/a".to_owned(), 1, 100),
            ("build-files/b".to_owned(), 1, 200),
        ];
        assert_eq!(
            expired(&listing, 150).collect::<Vec<_>>(),
            ["build-files/a"]
        );
        assert_eq!(expired(&listing, 100).count(), 0);
        const { assert!(RENEW_AFTER_MS < KEEP_MS) };
    }
}

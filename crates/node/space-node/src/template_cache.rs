//! The node's template cache: templates no name points at here. A build leaves one per
//! step (each the cache of that step, keyed by what made it), a rebuilt name leaves what
//! it meant before, and a create or resume on a node that lacked a template fetches it by
//! digest. Nothing removes them by itself: the operator prunes those not needed for a
//! while (`POST /v1/template-cache/prune`, which keeps what sandboxes or snapshots were
//! made from).
//!
//! "Needed" is recorded as the modification time of a marker file,
//! `<data_dir>/template-uses/<digest>`, which a step's cache hit and every create or
//! resume that needs the template touch: the template's own files belong to the node
//! manager, and their times say when they were made, not used.
//!
//! A build may need any step it made or finds, at any moment until it ends, so a node
//! removes nothing while a build runs there ([`CacheRemoval::BuildRunning`]); builds wait
//! the few milliseconds a removal takes.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use space_core::template::CachedTemplate;
use space_node_proto::template::CacheRemoval;

use crate::sandbox_manager::internal;
use crate::{Node, NodeError};

/// Under the data directory: a marker file per template, touched when it is needed.
const USES_DIR: &str = "template-uses";

impl Node {
    fn template_uses_dir(&self) -> PathBuf {
        self.inner.cfg.data_dir.join(USES_DIR)
    }

    /// Records that template `digest` was needed now (best effort: a marker that cannot be
    /// written only makes the template look older to a prune, which still keeps it while
    /// sandboxes or snapshots need it).
    pub(crate) fn mark_template_used(&self, digest: &str) {
        if space_storage::validate_digest(digest).is_err() {
            return;
        }
        let dir = self.template_uses_dir();
        if let Err(e) = touch(&dir, digest) {
            tracing::debug!(digest, error = %e, "cannot mark the template used");
        }
    }

    /// The templates in this node's cache, with when each was last needed.
    pub async fn cached_templates(&self) -> Result<Vec<CachedTemplate>, NodeError> {
        let node = self.clone();
        tokio::task::spawn_blocking(move || node.cached_templates_now())
            .await
            .map_err(|e| internal("template cache task", e))?
    }

    fn cached_templates_now(&self) -> Result<Vec<CachedTemplate>, NodeError> {
        let uses = self.template_uses_dir();
        Ok(self
            .inner
            .store
            .templates()
            .unnamed()?
            .into_iter()
            .map(|t| CachedTemplate {
                node: self.inner.cfg.node_name.clone(),
                last_used_ms: last_used_ms(&uses, &t.digest, t.built_at_ms),
                digest: t.digest,
                description: t.description,
                image_size_mib: t.image_size_mib,
                built_at_ms: t.built_at_ms,
            })
            .collect())
    }

    /// Removes cached template `digest`, its memory images and its warm sandboxes, unless
    /// it was needed at or after `unused_since_ms`, a name points at it, or a build runs.
    /// Sandboxes made from it keep running: their disks are their own.
    pub async fn remove_cached_template(
        &self,
        digest: &str,
        unused_since_ms: i64,
    ) -> Result<CacheRemoval, NodeError> {
        space_storage::validate_digest(digest)?;
        let Ok(_no_build) = self.inner.template_builds.running.clone().try_write_owned() else {
            return Ok(CacheRemoval::BuildRunning);
        };
        let cached = self.cached_templates().await?;
        let Some(template) = cached.iter().find(|t| t.digest == digest) else {
            return Ok(CacheRemoval::NotCached);
        };
        if template.last_used_ms >= unused_since_ms {
            return Ok(CacheRemoval::UsedSince);
        }
        let (nm, store, owned) = (
            self.inner.nm.clone(),
            self.inner.store.clone(),
            digest.to_owned(),
        );
        let removed =
            tokio::task::spawn_blocking(move || nm.remove_unnamed_template(&store, &owned))
                .await
                .map_err(|e| internal("template removal task", e))??;
        if !removed {
            return Ok(CacheRemoval::NotCached);
        }
        self.forget_template(digest).await;
        let _ = std::fs::remove_file(self.template_uses_dir().join(digest));
        tracing::info!(
            digest,
            size_mib = template.image_size_mib,
            "removed a cached template"
        );
        Ok(CacheRemoval::Removed)
    }

    /// What a template leaves behind once its image is gone: its warm sandboxes and its
    /// memory images (which would otherwise stay on disk for good).
    pub(crate) async fn forget_template(&self, digest: &str) {
        for member in self.inner.pool.drain_template(digest) {
            self.inner.discard_member(member).await;
        }
        let store = self.inner.store.clone();
        let owned = digest.to_owned();
        match tokio::task::spawn_blocking(move || crate::image::remove_images_of(&store, &owned))
            .await
        {
            Ok(Ok(n)) => tracing::info!(digest, images = n, "removed the template's memory images"),
            Ok(Err(e)) => {
                tracing::warn!(digest, error = %e, "cannot remove the template's memory images")
            }
            Err(e) => tracing::warn!(digest, error = %e, "memory image removal task"),
        }
    }
}

/// Creates or refreshes marker `dir/name`.
fn touch(dir: &Path, name: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))?;
    file.set_times(std::fs::FileTimes::new().set_modified(std::time::SystemTime::now()))
}

/// When template `digest` was last needed: its marker's time, or when it was built if that
/// is later (or there is no marker).
fn last_used_ms(dir: &Path, digest: &str, built_at_ms: i64) -> i64 {
    let marked = std::fs::metadata(dir.join(digest))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok());
    marked.map_or(built_at_ms, |m| m.max(built_at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_moves_last_use_forward_never_back() {
        let dir = tempfile::tempdir().unwrap();
        let digest = "0123456789abcdef";
        assert_eq!(last_used_ms(dir.path(), digest, 42), 42, "no marker: built");
        touch(dir.path(), digest).unwrap();
        let marked = last_used_ms(dir.path(), digest, 42);
        assert!(marked > 1_700_000_000_000, "{marked}");
        let future = marked + 60_000;
        assert_eq!(last_used_ms(dir.path(), digest, future), future);
    }
}

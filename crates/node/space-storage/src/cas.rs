//! A content-addressed artifact directory: `<root>/<digest>/` holds one immutable artifact
//! (files plus a JSON metadata file), built at most once even when several threads or
//! processes ask for it at the same time. Templates and kernel bundles are both stored this way.
//!
//! Layout: `<root>/<digest>/…`, `<root>/.locks/<digest>.lock` (flock per digest),
//! `<root>/.staging/<digest>-<random>/` (builds in progress), `<root>/.trash/` (removals).
//! An entry appears only by an atomic rename of a finished staging directory, so a reader
//! never sees a half-built artifact, and a crash leaves at most staging debris, cleaned by
//! the next build of the same digest.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{IoContext, StorageError};
use crate::fsops::{self, FileLock};
use crate::mountinfo;

/// Metadata of an artifact kind stored in a [`CasDir`].
pub trait Artifact: Serialize + DeserializeOwned {
    /// Name of the metadata file inside the entry, e.g. `template.json`.
    const META_FILE: &'static str;
    /// What it is called in messages, e.g. `template`.
    const KIND: &'static str;
    /// The digest the artifact is stored under.
    fn digest(&self) -> &str;
}

/// Checks that a digest is safe to use as a directory name: 16..=128 lowercase hex digits.
pub fn validate_digest(digest: &str) -> Result<(), StorageError> {
    let ok = (16..=128).contains(&digest.len())
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StorageError::InvalidDigest(
            digest.chars().take(140).collect(),
        ))
    }
}

/// A directory of content-addressed artifacts with metadata `M`.
#[derive(Debug)]
pub struct CasDir<M> {
    root: PathBuf,
    _meta: PhantomData<fn() -> M>,
}

impl<M> Clone for CasDir<M> {
    fn clone(&self) -> Self {
        CasDir {
            root: self.root.clone(),
            _meta: PhantomData,
        }
    }
}

impl<M: Artifact> CasDir<M> {
    /// An artifact directory at `root` (created on first build).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CasDir {
            root: root.into(),
            _meta: PhantomData,
        }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the artifact with `digest` lives (whether or not it exists).
    pub fn entry_dir(&self, digest: &str) -> PathBuf {
        self.root.join(digest)
    }

    fn meta_path(&self, digest: &str) -> PathBuf {
        self.entry_dir(digest).join(M::META_FILE)
    }

    /// The metadata of a built artifact, or `None` if it is not built.
    pub fn get(&self, digest: &str) -> Result<Option<M>, StorageError> {
        validate_digest(digest)?;
        let path = self.meta_path(digest);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StorageError::io("read", &path, e)),
        };
        let meta: M = serde_json::from_slice(&bytes).map_err(|source| StorageError::Metadata {
            path: path.clone(),
            source,
        })?;
        if meta.digest() != digest {
            return Err(StorageError::DigestMismatch {
                expected: digest.to_owned(),
                got: meta.digest().to_owned(),
            });
        }
        Ok(Some(meta))
    }

    /// Digests of all built artifacts, sorted.
    pub fn digests(&self) -> Result<Vec<String>, StorageError> {
        let dir = match std::fs::read_dir(&self.root) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StorageError::io("list", &self.root, e)),
        };
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.ctx("list", &self.root)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if validate_digest(&name).is_ok() && entry.path().join(M::META_FILE).is_file() {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Metadata of all built artifacts, by digest.
    pub fn list(&self) -> Result<Vec<M>, StorageError> {
        let mut out = Vec::new();
        for d in self.digests()? {
            if let Some(m) = self.get(&d)? {
                out.push(m);
            }
        }
        Ok(out)
    }

    fn lock(&self, digest: &str) -> Result<FileLock, StorageError> {
        let locks = self.root.join(".locks");
        fsops::create_dir_all(&locks)?;
        FileLock::exclusive(&locks.join(format!("{digest}.lock")))
    }

    /// Returns the artifact `digest`, building it first if it does not exist.
    ///
    /// Holds an exclusive lock on the digest throughout, so concurrent callers (threads or
    /// processes) wait for the one that builds and then get its result: the work is done
    /// once. `build` gets an empty staging directory to write the artifact's files into and
    /// returns the metadata (whose digest must be `digest`); this function writes the
    /// metadata file and moves the staging directory into place atomically. If `build`
    /// fails, the staging directory is deleted and nothing is stored.
    pub fn build_or_wait<E: From<StorageError>>(
        &self,
        digest: &str,
        build: impl FnOnce(&Path) -> Result<M, E>,
    ) -> Result<M, E> {
        validate_digest(digest)?;
        let _lock = self.lock(digest)?;
        if let Some(meta) = self.get(digest)? {
            tracing::debug!(kind = M::KIND, digest, "already built");
            return Ok(meta);
        }
        let entry = self.entry_dir(digest);
        if entry.exists() {
            // A directory without metadata cannot come from a rename of finished staging
            // (the metadata is written first); something tampered with it. Start over.
            tracing::warn!(path = %entry.display(), "removing incomplete {} entry", M::KIND);
            self.trash(&entry)?;
        }
        let staging_root = self.root.join(".staging");
        fsops::create_dir_all(&staging_root)?;
        self.clean_stale_staging(&staging_root, digest)?;
        let staging = staging_root.join(format!("{digest}-{}", fsops::random_suffix()));
        std::fs::create_dir(&staging).ctx("create directory", &staging)?;
        let guard = StagingGuard(Some(staging.clone()));

        let meta = build(&staging)?;
        if meta.digest() != digest {
            return Err(StorageError::DigestMismatch {
                expected: digest.to_owned(),
                got: meta.digest().to_owned(),
            }
            .into());
        }
        self.commit(&staging, &entry, &meta)?;
        guard.disarm();
        tracing::info!(kind = M::KIND, digest, path = %entry.display(), "stored");
        Ok(meta)
    }

    /// Writes the metadata, syncs the files, and renames `staging` to `entry`.
    fn commit(&self, staging: &Path, entry: &Path, meta: &M) -> Result<(), StorageError> {
        mountinfo::unmount_all_below(staging)?;
        let meta_path = staging.join(M::META_FILE);
        let json = serde_json::to_vec_pretty(meta).map_err(|source| StorageError::Metadata {
            path: meta_path.clone(),
            source,
        })?;
        fsops::write_atomic(&meta_path, &json)?;
        for f in std::fs::read_dir(staging).ctx("list", staging)? {
            let f = f.ctx("list", staging)?;
            if f.file_type().ctx("stat", &f.path())?.is_file() {
                std::fs::File::open(f.path())
                    .and_then(|h| h.sync_all())
                    .ctx("sync", &f.path())?;
            }
        }
        std::fs::rename(staging, entry).ctx("move staging directory into place at", entry)?;
        fsops::fsync_dir(&self.root)
    }

    /// Removes staging directories of `digest` left by crashed builds. Called with the
    /// digest's lock held, so no live build owns them.
    fn clean_stale_staging(&self, staging_root: &Path, digest: &str) -> Result<(), StorageError> {
        let prefix = format!("{digest}-");
        for e in std::fs::read_dir(staging_root)
            .ctx("list", staging_root)?
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                tracing::warn!(path = %e.path().display(), "removing staging directory of an interrupted build");
                mountinfo::remove_tree(&e.path())?;
            }
        }
        Ok(())
    }

    /// Moves a directory out of the way atomically, then deletes it.
    fn trash(&self, dir: &Path) -> Result<(), StorageError> {
        let trash = self.root.join(".trash");
        fsops::create_dir_all(&trash)?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let target = trash.join(format!("{name}-{}", fsops::random_suffix()));
        std::fs::rename(dir, &target).ctx("move to trash", dir)?;
        mountinfo::remove_tree(&target)
    }

    /// Deletes the artifact `digest`. Returns whether it existed. Sandbox disks cloned from
    /// it are unaffected (reflinks are independent files).
    pub fn remove(&self, digest: &str) -> Result<bool, StorageError> {
        validate_digest(digest)?;
        let _lock = self.lock(digest)?;
        let entry = self.entry_dir(digest);
        if !entry.exists() {
            return Ok(false);
        }
        self.trash(&entry)?;
        tracing::info!(kind = M::KIND, digest, "removed");
        Ok(true)
    }

    /// Rewrites the metadata of a built artifact (under its lock, atomically).
    pub fn update_meta(
        &self,
        digest: &str,
        change: impl FnOnce(&mut M),
    ) -> Result<M, StorageError> {
        validate_digest(digest)?;
        let _lock = self.lock(digest)?;
        let mut meta = self.get(digest)?.ok_or_else(|| StorageError::NotFound {
            what: M::KIND,
            name: digest.to_owned(),
            dir: self.root.clone(),
        })?;
        change(&mut meta);
        if meta.digest() != digest {
            return Err(StorageError::DigestMismatch {
                expected: digest.to_owned(),
                got: meta.digest().to_owned(),
            });
        }
        let path = self.meta_path(digest);
        let json = serde_json::to_vec_pretty(&meta).map_err(|source| StorageError::Metadata {
            path: path.clone(),
            source,
        })?;
        fsops::write_atomic(&path, &json)?;
        Ok(meta)
    }

    /// Copies the artifact `digest` from another artifact directory (e.g. a shared build
    /// cache) into this one, reflinking files when both are on one btrfs and copying
    /// (sparsely) otherwise. A no-op if it is already here.
    pub fn import_from(&self, from: &CasDir<M>, digest: &str) -> Result<M, StorageError> {
        let meta = from.get(digest)?.ok_or_else(|| StorageError::NotFound {
            what: M::KIND,
            name: digest.to_owned(),
            dir: from.root.clone(),
        })?;
        let src = from.entry_dir(digest);
        self.build_or_wait(digest, |staging| {
            for f in std::fs::read_dir(&src).ctx("list", &src)? {
                let f = f.ctx("list", &src)?;
                let name = f.file_name();
                if name.to_string_lossy() == M::META_FILE {
                    continue;
                }
                let ft = f.file_type().ctx("stat", &f.path())?;
                if ft.is_file() {
                    fsops::reflink_or_copy(&f.path(), &staging.join(&name))?;
                } else {
                    // Artifacts are flat sets of files; anything else is not ours to copy.
                    tracing::warn!(path = %f.path().display(), "skipping non-file in artifact");
                }
            }
            Ok::<M, StorageError>(meta)
        })
    }
}

/// Deletes a staging directory unless disarmed (on error or panic in the build).
struct StagingGuard(Option<PathBuf>);

impl StagingGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for StagingGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            if let Err(e) = mountinfo::remove_tree(&dir) {
                tracing::warn!(path = %dir.display(), error = %e, "cannot remove staging directory of a failed build");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Thing {
        digest: String,
        n: u32,
    }

    impl Artifact for Thing {
        const META_FILE: &'static str = "thing.json";
        const KIND: &'static str = "thing";
        fn digest(&self) -> &str {
            &self.digest
        }
    }

    const D: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn digest_validation() {
        assert!(validate_digest(D).is_ok());
        assert!(validate_digest("../../etc").is_err());
        assert!(validate_digest("ABCDEF0123456789").is_err());
        assert!(validate_digest("abc").is_err());
    }

    #[test]
    fn concurrent_builds_run_once() {
        let dir = tempfile::tempdir().unwrap();
        let cas: CasDir<Thing> = CasDir::new(dir.path().join("things"));
        let count = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (cas, count) = (cas.clone(), count.clone());
                std::thread::spawn(move || {
                    cas.build_or_wait(D, |staging| {
                        count.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(200));
                        std::fs::write(staging.join("data"), b"x").unwrap();
                        Ok::<_, StorageError>(Thing {
                            digest: D.into(),
                            n: 7,
                        })
                    })
                    .unwrap()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().n, 7);
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(std::fs::read(cas.entry_dir(D).join("data")).unwrap(), b"x");
        assert_eq!(cas.digests().unwrap(), vec![D.to_owned()]);
        assert_eq!(
            std::fs::read_dir(dir.path().join("things/.staging"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn failed_build_leaves_nothing_and_can_be_retried() {
        let dir = tempfile::tempdir().unwrap();
        let cas: CasDir<Thing> = CasDir::new(dir.path());
        let err = cas
            .build_or_wait(D, |staging| {
                std::fs::write(staging.join("partial"), b"x").unwrap();
                Err::<Thing, _>(StorageError::InvalidName("boom".into()))
            })
            .unwrap_err();
        assert!(matches!(err, StorageError::InvalidName(_)));
        assert!(cas.get(D).unwrap().is_none());
        assert_eq!(
            std::fs::read_dir(dir.path().join(".staging"))
                .unwrap()
                .count(),
            0
        );
        let wrong = cas.build_or_wait(D, |_| {
            Ok::<_, StorageError>(Thing {
                digest: "ffffffffffffffff".into(),
                n: 1,
            })
        });
        assert!(matches!(wrong, Err(StorageError::DigestMismatch { .. })));
        let ok = cas
            .build_or_wait(D, |_| {
                Ok::<_, StorageError>(Thing {
                    digest: D.into(),
                    n: 2,
                })
            })
            .unwrap();
        assert_eq!(ok.n, 2);
        assert_eq!(cas.update_meta(D, |t| t.n = 3).unwrap().n, 3);
        assert_eq!(cas.get(D).unwrap().unwrap().n, 3);
        assert!(cas.remove(D).unwrap());
        assert!(!cas.remove(D).unwrap());
        assert!(cas.get(D).unwrap().is_none());
    }

    #[test]
    fn stale_staging_is_cleaned_and_import_copies() {
        let dir = tempfile::tempdir().unwrap();
        let cas: CasDir<Thing> = CasDir::new(dir.path().join("a"));
        std::fs::create_dir_all(dir.path().join("a/.staging").join(format!("{D}-crashed")))
            .unwrap();
        cas.build_or_wait(D, |s| {
            std::fs::write(s.join("f"), b"content").unwrap();
            Ok::<_, StorageError>(Thing {
                digest: D.into(),
                n: 1,
            })
        })
        .unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path().join("a/.staging"))
                .unwrap()
                .count(),
            0
        );
        let other: CasDir<Thing> = CasDir::new(dir.path().join("b"));
        assert_eq!(other.import_from(&cas, D).unwrap().n, 1);
        assert_eq!(
            std::fs::read(other.entry_dir(D).join("f")).unwrap(),
            b"content"
        );
        assert!(matches!(
            other.import_from(&cas, "ffffffffffffffff"),
            Err(StorageError::NotFound { .. })
        ));
    }
}

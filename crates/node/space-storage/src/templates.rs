//! The template store: content-addressed template images with their metadata, and the names
//! that point at them.
//!
//! Layout under `<store>/templates/`: `<digest>/rootfs.ext4` + `<digest>/template.json`
//! ([`TemplateInfo`]), and `names/<name>`, a small file holding the digest the name currently
//! means (replaced atomically, so a rebuilt template takes over its name in one step).

use std::path::{Path, PathBuf};

use space_core::template::{validate_template_name, TemplateInfo};

use crate::cas::{validate_digest, Artifact, CasDir};
use crate::error::{IoContext, StorageError};
use crate::fsops;

/// File name of a template's root filesystem image inside its entry.
pub const IMAGE_FILE: &str = "rootfs.ext4";

impl Artifact for TemplateInfo {
    const META_FILE: &'static str = "template.json";
    const KIND: &'static str = "template";
    fn digest(&self) -> &str {
        &self.digest
    }
}

/// Template images and names. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    cas: CasDir<TemplateInfo>,
}

fn check_name(name: &str) -> Result<(), StorageError> {
    if validate_template_name(name) {
        Ok(())
    } else {
        Err(StorageError::InvalidName(name.chars().take(80).collect()))
    }
}

impl TemplateStore {
    /// A template store in `dir` (usually `<store root>/templates`; any directory works, e.g.
    /// a build cache shared between stores).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TemplateStore {
            cas: CasDir::new(dir),
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        self.cas.root()
    }

    /// The underlying artifact directory.
    pub fn artifacts(&self) -> &CasDir<TemplateInfo> {
        &self.cas
    }

    fn names_dir(&self) -> PathBuf {
        self.cas.root().join("names")
    }

    /// The digest `name` currently points at.
    pub fn name_digest(&self, name: &str) -> Result<Option<String>, StorageError> {
        check_name(name)?;
        let path = self.names_dir().join(name);
        match std::fs::read_to_string(&path) {
            Ok(s) => {
                let digest = s.trim().to_owned();
                validate_digest(&digest)?;
                Ok(Some(digest))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io("read", &path, e)),
        }
    }

    /// Points `name` at `digest` (atomically replacing what it pointed at). A template whose
    /// image was never hashed (a build step's, see [`TemplateStore::install_unnamed`]) is
    /// hashed first: every named template can be published and checked.
    pub fn set_name(&self, name: &str, digest: &str) -> Result<(), StorageError> {
        check_name(name)?;
        validate_digest(digest)?;
        if let Some(info) = self.cas.get(digest)? {
            if info.image_sha256.is_empty() {
                let sha = fsops::sha256_of(&self.image_path(&info))?;
                self.cas.update_meta(digest, |t| t.image_sha256 = sha)?;
            }
        }
        let dir = self.names_dir();
        fsops::create_dir_all(&dir)?;
        fsops::write_atomic(&dir.join(name), format!("{digest}\n").as_bytes())
    }

    /// All named templates, sorted by name. Names pointing at a missing template are skipped.
    pub fn list(&self) -> Result<Vec<TemplateInfo>, StorageError> {
        let dir = self.names_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StorageError::io("list", &dir, e)),
        };
        let mut names: Vec<String> = Vec::new();
        for e in entries {
            let name = e
                .ctx("list", &dir)?
                .file_name()
                .to_string_lossy()
                .into_owned();
            if validate_template_name(&name) {
                names.push(name);
            }
        }
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            match self.get(&name)? {
                Some(t) => out.push(t),
                None => {
                    tracing::warn!(name, "template name points at a missing template; skipping")
                }
            }
        }
        Ok(out)
    }

    /// The template `name` points at, if any. Its `name` field is `name`.
    pub fn get(&self, name: &str) -> Result<Option<TemplateInfo>, StorageError> {
        let Some(digest) = self.name_digest(name)? else {
            return Ok(None);
        };
        Ok(self.cas.get(&digest)?.map(|mut t| {
            t.name = name.to_owned();
            t
        }))
    }

    /// The template stored under `digest`, named or not.
    pub fn lookup_digest(&self, digest: &str) -> Result<Option<TemplateInfo>, StorageError> {
        self.cas.get(digest)
    }

    /// The root filesystem image of a template.
    pub fn image_path(&self, info: &TemplateInfo) -> PathBuf {
        self.cas.entry_dir(&info.digest).join(IMAGE_FILE)
    }

    /// Removes the name `name`, and the template it pointed at unless another name still
    /// points there. Returns whether the name existed. Sandbox disks are unaffected.
    pub fn remove(&self, name: &str) -> Result<bool, StorageError> {
        let Some(digest) = self.name_digest(name)? else {
            return Ok(false);
        };
        let path = self.names_dir().join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(StorageError::io("remove", &path, e)),
        }
        fsops::fsync_dir(&self.names_dir())?;
        let still_named = self.named_digests()?.contains(&digest);
        if !still_named {
            self.cas.remove(&digest)?;
        }
        tracing::info!(name, digest, "removed template");
        Ok(true)
    }

    /// Templates no name points at: a build's cached steps, what a start command or trailing
    /// `ENV`/`USER` made before the build named it, and what a name meant before it was
    /// rebuilt. Nothing but a build's cache lookup (or a digest-pinned create) finds them.
    pub fn unnamed(&self) -> Result<Vec<TemplateInfo>, StorageError> {
        let named = self.named_digests()?;
        let mut out = Vec::new();
        for digest in self.cas.digests()? {
            if named.contains(&digest) {
                continue;
            }
            if let Some(info) = self.cas.get(&digest)? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Removes template `digest` if no name points at it. Returns whether it was removed.
    pub fn remove_unnamed(&self, digest: &str) -> Result<bool, StorageError> {
        validate_digest(digest)?;
        if self.named_digests()?.iter().any(|d| d == digest) {
            return Ok(false);
        }
        self.cas.remove(digest)
    }

    fn named_digests(&self) -> Result<Vec<String>, StorageError> {
        let dir = self.names_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if validate_template_name(&name) {
                if let Some(d) = self.name_digest(&name)? {
                    out.push(d);
                }
            }
        }
        Ok(out)
    }

    /// Returns the template `digest`, building it first if needed, and points `name` at it.
    ///
    /// See [`CasDir::build_or_wait`]: concurrent calls for one digest (threads or processes)
    /// build once. `build` gets the staging directory, must write [`IMAGE_FILE`] into it and
    /// returns the metadata (with `digest`).
    pub fn build_or_wait<E: From<StorageError>>(
        &self,
        name: &str,
        digest: &str,
        build: impl FnOnce(&Path) -> Result<TemplateInfo, E>,
    ) -> Result<TemplateInfo, E> {
        check_name(name)?;
        let mut info = self.build_unnamed_or_wait(digest, build)?;
        self.set_name(name, digest)?;
        info.name = name.to_owned();
        Ok(info)
    }

    /// [`TemplateStore::build_or_wait`] without a name: a template only its digest finds (a
    /// build's base or one of its cached steps), listed under no name.
    pub fn build_unnamed_or_wait<E: From<StorageError>>(
        &self,
        digest: &str,
        build: impl FnOnce(&Path) -> Result<TemplateInfo, E>,
    ) -> Result<TemplateInfo, E> {
        self.cas
            .build_or_wait(digest, |staging| -> Result<TemplateInfo, E> {
                let info = build(staging)?;
                let image = staging.join(IMAGE_FILE);
                if !image.is_file() {
                    return Err(StorageError::io(
                        "find built image",
                        &image,
                        std::io::Error::from(std::io::ErrorKind::NotFound),
                    )
                    .into());
                }
                Ok(info)
            })
    }

    /// Sets the kernel bundle a template boots with (templates are keyed by their rootfs
    /// recipe, so a rebuilt kernel bundle — e.g. a new `spaced` — is bound without
    /// rebuilding the image).
    pub fn set_kernel_digest(
        &self,
        digest: &str,
        kernel_digest: &str,
    ) -> Result<TemplateInfo, StorageError> {
        validate_digest(kernel_digest)?;
        self.cas
            .update_meta(digest, |t| t.kernel_digest = kernel_digest.to_owned())
    }

    /// Installs template `info` whose image is the open file `image` (one fetched from
    /// the object store), and points its name at it; once per digest, like a build. The image
    /// is copied from the descriptor into the store, then its SHA-256 is checked against
    /// `info.image_sha256`: what is stored is exactly what the metadata describes.
    pub fn install(
        &self,
        info: &TemplateInfo,
        image: &std::fs::File,
    ) -> Result<TemplateInfo, StorageError> {
        check_name(&info.name)?;
        let mut installed = self.install_unnamed(info, image)?;
        self.set_name(&info.name, &info.digest)?;
        installed.name = info.name.clone();
        Ok(installed)
    }

    /// [`TemplateStore::install`] without pointing a name at it. An empty
    /// `info.image_sha256` stays empty (an image made here, a build step's cache, that only
    /// its digest finds): hashing a multi-GiB sparse disk at every step would cost more than
    /// the step; [`TemplateStore::set_name`] hashes it when it becomes a named template.
    pub fn install_unnamed(
        &self,
        info: &TemplateInfo,
        image: &std::fs::File,
    ) -> Result<TemplateInfo, StorageError> {
        self.cas.build_or_wait(&info.digest, |staging| {
            let dst = staging.join(IMAGE_FILE);
            fsops::copy_open_file(image, Path::new("(the fetched image)"), &dst)?;
            if info.image_sha256.is_empty() {
                return Ok(info.clone());
            }
            let got = fsops::sha256_of(&dst)?;
            if got != info.image_sha256 {
                return Err(StorageError::ContentMismatch {
                    what: format!("template {} ({})", info.name, info.digest),
                    expected: info.image_sha256.clone(),
                    got,
                });
            }
            Ok(info.clone())
        })
    }

    /// Copies template `name` from another template store (reflinks on the same btrfs,
    /// sparse copy otherwise) and points `name` at it here.
    pub fn import(&self, from: &TemplateStore, name: &str) -> Result<TemplateInfo, StorageError> {
        let digest = from
            .name_digest(name)?
            .ok_or_else(|| StorageError::NotFound {
                what: "template",
                name: name.to_owned(),
                dir: from.dir().to_owned(),
            })?;
        let mut info = self.cas.import_from(&from.cas, &digest)?;
        self.set_name(name, &digest)?;
        info.name = name.to_owned();
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_core::Resources;

    fn info(name: &str, digest: &str) -> TemplateInfo {
        TemplateInfo {
            name: name.into(),
            digest: digest.into(),
            image_sha256: "00".into(),
            image_size_mib: 1,
            kernel_digest: "aaaaaaaaaaaaaaaa".into(),
            default_resources: Resources::default(),
            default_user: "user".into(),
            description: "test".into(),
            built_at_ms: 0,
            image: None,
            env: Default::default(),
            workdir: None,
            image_command: Vec::new(),
            start: None,
        }
    }

    #[test]
    fn only_unnamed_templates_are_listed_and_removed_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let ts = TemplateStore::new(dir.path().join("templates"));
        let (named, unnamed) = ("1111111111111111", "2222222222222222");
        for d in [named, unnamed] {
            ts.build_unnamed_or_wait::<StorageError>(d, |staging| {
                std::fs::write(staging.join(IMAGE_FILE), b"img").unwrap();
                Ok(info("", d))
            })
            .unwrap();
        }
        ts.set_name("kept", named).unwrap();
        let listed: Vec<String> = ts
            .unnamed()
            .unwrap()
            .into_iter()
            .map(|t| t.digest)
            .collect();
        assert_eq!(listed, vec![unnamed.to_owned()]);
        assert!(!ts.remove_unnamed(named).unwrap(), "a named template stays");
        assert!(ts.remove_unnamed(unnamed).unwrap());
        assert!(ts.lookup_digest(unnamed).unwrap().is_none());
        assert!(ts.get("kept").unwrap().is_some());
        assert!(ts.unnamed().unwrap().is_empty());
    }

    #[test]
    fn names_point_at_digests() {
        let dir = tempfile::tempdir().unwrap();
        let ts = TemplateStore::new(dir.path().join("templates"));
        let d1 = "1111111111111111";
        let d2 = "2222222222222222";
        let build = |d: &'static str| {
            move |s: &Path| {
                std::fs::write(s.join(IMAGE_FILE), d).unwrap();
                Ok::<_, StorageError>(info("t", d))
            }
        };
        ts.build_or_wait("t", d1, build(d1)).unwrap();
        assert_eq!(ts.get("t").unwrap().unwrap().digest, d1);
        // A new recipe digest for the same name takes the name over.
        ts.build_or_wait("t", d2, build(d2)).unwrap();
        ts.build_or_wait("u", d2, build(d2)).unwrap();
        let t = ts.get("t").unwrap().unwrap();
        assert_eq!(t.digest, d2);
        assert_eq!(std::fs::read_to_string(ts.image_path(&t)).unwrap(), d2);
        let names: Vec<String> = ts.list().unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["t", "u"]);
        assert!(ts.lookup_digest(d1).unwrap().is_some());
        assert_eq!(
            ts.set_kernel_digest(d2, "bbbbbbbbbbbbbbbb")
                .unwrap()
                .kernel_digest,
            "bbbbbbbbbbbbbbbb"
        );
        // Removing one of two names keeps the image; removing the last deletes it.
        assert!(ts.remove("t").unwrap());
        assert!(ts.lookup_digest(d2).unwrap().is_some());
        assert!(ts.remove("u").unwrap());
        assert!(ts.lookup_digest(d2).unwrap().is_none());
        assert!(!ts.remove("u").unwrap());
        assert!(matches!(ts.get("../x"), Err(StorageError::InvalidName(_))));
    }

    #[test]
    fn build_without_image_fails() {
        let dir = tempfile::tempdir().unwrap();
        let ts = TemplateStore::new(dir.path());
        let r = ts.build_or_wait("t", "1111111111111111", |_| {
            Ok::<_, StorageError>(info("t", "1111111111111111"))
        });
        assert!(r.is_err());
        assert!(ts.get("t").unwrap().is_none());
    }
}

//! The kernel bundle store: `<store>/kernels/<digest>/{vmlinuz,initramfs.cpio,kernel.json}`,
//! content-addressed and built at most once, like templates.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cas::{Artifact, CasDir};
use crate::error::StorageError;

/// File name of the kernel image inside a bundle.
pub const VMLINUZ_FILE: &str = "vmlinuz";
/// File name of the initramfs inside a bundle.
pub const INITRAMFS_FILE: &str = "initramfs.cpio";

/// What `kernel.json` records about a bundle (paths are derived, never stored, so a store
/// can move).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelMeta {
    /// sha256 of the bundle's inputs.
    pub digest: String,
    /// Kernel release, e.g. `6.1.0-56-cloud-amd64`.
    pub kernel_version: String,
    /// Module files in the initramfs, in load order.
    pub modules: Vec<String>,
    /// When it was built, ms since the Unix epoch.
    pub built_at_ms: i64,
}

impl Artifact for KernelMeta {
    const META_FILE: &'static str = "kernel.json";
    const KIND: &'static str = "kernel bundle";
    fn digest(&self) -> &str {
        &self.digest
    }
}

/// A built kernel bundle: what the VMM boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelBundleInfo {
    /// sha256 of the bundle's inputs (what templates refer to).
    pub digest: String,
    /// Kernel release.
    pub kernel_version: String,
    /// The kernel image.
    pub vmlinuz: PathBuf,
    /// The initramfs (uncompressed cpio).
    pub initramfs: PathBuf,
    /// Module files in the initramfs, in load order.
    pub modules: Vec<String>,
    /// When it was built, ms since the Unix epoch.
    pub built_at_ms: i64,
}

/// Kernel bundles. Cheap to clone.
#[derive(Debug, Clone)]
pub struct KernelStore {
    cas: CasDir<KernelMeta>,
}

impl KernelStore {
    /// A kernel store in `dir` (usually `<store root>/kernels`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        KernelStore {
            cas: CasDir::new(dir),
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        self.cas.root()
    }

    /// The underlying artifact directory.
    pub fn artifacts(&self) -> &CasDir<KernelMeta> {
        &self.cas
    }

    fn with_paths(&self, meta: KernelMeta) -> KernelBundleInfo {
        let dir = self.cas.entry_dir(&meta.digest);
        KernelBundleInfo {
            vmlinuz: dir.join(VMLINUZ_FILE),
            initramfs: dir.join(INITRAMFS_FILE),
            digest: meta.digest,
            kernel_version: meta.kernel_version,
            modules: meta.modules,
            built_at_ms: meta.built_at_ms,
        }
    }

    /// The bundle `digest`, if built.
    pub fn get(&self, digest: &str) -> Result<Option<KernelBundleInfo>, StorageError> {
        Ok(self.cas.get(digest)?.map(|m| self.with_paths(m)))
    }

    /// All built bundles, by digest.
    pub fn list(&self) -> Result<Vec<KernelBundleInfo>, StorageError> {
        Ok(self
            .cas
            .list()?
            .into_iter()
            .map(|m| self.with_paths(m))
            .collect())
    }

    /// Returns bundle `digest`, building it first if needed (once, across threads and
    /// processes). `build` must write [`VMLINUZ_FILE`] and [`INITRAMFS_FILE`] into the staging
    /// directory it is given.
    pub fn build_or_wait<E: From<StorageError>>(
        &self,
        digest: &str,
        build: impl FnOnce(&Path) -> Result<KernelMeta, E>,
    ) -> Result<KernelBundleInfo, E> {
        let meta = self
            .cas
            .build_or_wait(digest, |staging| -> Result<KernelMeta, E> {
                let meta = build(staging)?;
                for f in [VMLINUZ_FILE, INITRAMFS_FILE] {
                    let p = staging.join(f);
                    if !p.is_file() {
                        return Err(StorageError::io(
                            "find built file",
                            &p,
                            std::io::Error::from(std::io::ErrorKind::NotFound),
                        )
                        .into());
                    }
                }
                Ok(meta)
            })?;
        Ok(self.with_paths(meta))
    }

    /// Installs bundle `meta` from its open files (fetched from the object store); once per
    /// digest, like a build.
    pub fn install(
        &self,
        meta: &KernelMeta,
        vmlinuz: &std::fs::File,
        initramfs: &std::fs::File,
    ) -> Result<KernelBundleInfo, StorageError> {
        self.build_or_wait(
            &meta.digest,
            |staging| -> Result<KernelMeta, StorageError> {
                for (file, name) in [(vmlinuz, VMLINUZ_FILE), (initramfs, INITRAMFS_FILE)] {
                    crate::fsops::copy_open_file(file, Path::new(name), &staging.join(name))?;
                }
                Ok(meta.clone())
            },
        )
    }

    /// Deletes bundle `digest`. Returns whether it existed.
    pub fn remove(&self, digest: &str) -> Result<bool, StorageError> {
        self.cas.remove(digest)
    }

    /// Copies bundle `digest` from another kernel store.
    pub fn import(
        &self,
        from: &KernelStore,
        digest: &str,
    ) -> Result<KernelBundleInfo, StorageError> {
        Ok(self.with_paths(self.cas.import_from(&from.cas, digest)?))
    }
}

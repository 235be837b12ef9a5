//! Templates from container images: an image in a registry, an OCI layout directory or a
//! `docker save` archive becomes a template's root filesystem, its config the template's
//! defaults.
//!
//! The steps, each a module:
//! 1. [`source`]: what `--from REF` names.
//! 2. [`fetch`]: the image's manifest, config and layers into a blob directory, every blob
//!    checked against its digest and bounded in size ([`registry`] pulls from a registry with
//!    `oci-client`; [`layout`] reads layout directories and archives).
//!    [`staged`] writes what was fetched down for the build, which may be another
//!    process's: on a node, the unprivileged sandbox manager fetches and root builds.
//! 3. [`jail`]: the layers applied and the ext4 image written by a child process in user,
//!    mount and network namespaces of its own, "root" only over a uid range of its own
//!    ([`UNPACK_UID_BASE`]): a hostile layer can do no more than a hostile file owner could.
//!    Inside it, [`unpack`] applies the layers (whiteouts, opaque directories, hard links,
//!    owners, modes, xattrs; refusing escapes, device nodes and absurd sizes), [`plumbing`]
//!    adds what a sandbox needs, and `mkfs.ext4 -d` writes the image.
//! 4. [`build`]: the result installed in the store's template directory under the template's
//!    digest (the image config's digest: the image's content, whatever its transport or
//!    compression) with the defaults of [`config`].

pub mod build;
pub mod config;
pub mod fetch;
pub mod jail;
pub mod layout;
pub mod plumbing;
pub mod registry;
pub mod source;
pub mod staged;
pub mod unpack;

use serde::{Deserialize, Serialize};

pub use build::{build_from_image, build_staged, stage_image, ImageBuildOpts};
pub use source::ImageSource;
pub use staged::{open_staged, StagedImage, StagedInput};
pub use unpack::UnpackError;

/// First host uid (and gid) of the ranges image unpackers run as: 65,536 ids each
/// ([`UNPACK_RANGES`] of them, one per concurrent build), above the VMM jail's range
/// (1,500,000,000).
pub const UNPACK_UID_BASE: u32 = 1_600_000_000;
/// Ids in one unpacker's range: an image's files may be owned by uids 0-65535.
pub const UNPACK_RANGE: u32 = 65_536;
/// How many unpackers may run at once on a host.
pub const UNPACK_RANGES: u32 = 16;

/// Bounds on what an image may be. Defaults suit any reasonable image; a layer bomb, a
/// manifest with ten thousand layers or a 2 TB file are refused before they cost anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageLimits {
    /// Layers in the image.
    pub max_layers: usize,
    /// Bytes of one compressed layer blob.
    pub max_layer_bytes: u64,
    /// Bytes of the unpacked root filesystem (file contents, summed over layers).
    pub max_unpacked_bytes: u64,
    /// Tar entries over all layers.
    pub max_entries: u64,
    /// Bytes of a manifest, an index or a config.
    pub max_json_bytes: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits {
            max_layers: 128,
            max_layer_bytes: 8 << 30,
            max_unpacked_bytes: 16 << 30,
            max_entries: 2_000_000,
            max_json_bytes: 4 << 20,
        }
    }
}

/// Why an image could not become a template. Each names what was wrong with which input.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// `--from` could not be understood.
    #[error("image reference {reference:?}: {reason}")]
    BadReference {
        /// The reference (cut to 200 characters).
        reference: String,
        /// What is wrong.
        reason: String,
    },
    /// The registry refused us our credentials.
    #[error("registry {registry} refused the credentials: {detail}")]
    Unauthorized {
        /// The registry host.
        registry: String,
        /// What it said.
        detail: String,
    },
    /// No such image (or tag) in the registry, layout or archive.
    #[error("image {reference} not found: {detail}")]
    NotFound {
        /// The reference.
        reference: String,
        /// Where we looked.
        detail: String,
    },
    /// Talking to the registry failed.
    #[error("registry error for {reference}: {detail}")]
    Registry {
        /// The reference.
        reference: String,
        /// The client's error.
        detail: String,
    },
    /// A layout directory or archive is not what it claims.
    #[error("{path}: {detail}")]
    Layout {
        /// The layout or archive.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// A manifest, index or config is malformed or of a kind we do not build from.
    #[error("{what}: {detail}")]
    BadImage {
        /// Which document.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// The image has no linux/amd64 variant.
    #[error("the image has no linux/amd64 variant (it has: {available})")]
    NoPlatform {
        /// The platforms it has.
        available: String,
    },
    /// A blob is not what its digest says.
    #[error("{what}: digest mismatch (expected {expected}, got {got})")]
    DigestMismatch {
        /// Which blob.
        what: String,
        /// The digest the manifest or config names.
        expected: String,
        /// What its bytes hash to.
        got: String,
    },
    /// Something is larger than [`ImageLimits`] allows.
    #[error("{what} is too large: {detail}")]
    TooLarge {
        /// What.
        what: String,
        /// The size and the limit.
        detail: String,
    },
    /// Applying a layer was refused or failed (inside the unpacker).
    #[error(transparent)]
    Unpack(#[from] UnpackError),
    /// The unpacker process could not be run or died.
    #[error("image unpacker: {0}")]
    Unpacker(String),
    /// Registry credentials could not be read.
    #[error("registry credentials {path}: {detail}")]
    Credentials {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
}

impl OciError {
    /// The machine-readable code a build that failed this way reports.
    pub fn build_error_code(&self) -> space_core::template::TemplateBuildErrorCode {
        use space_core::template::TemplateBuildErrorCode as Code;
        match self {
            OciError::BadReference { .. } => Code::BadReference,
            OciError::Unauthorized { .. } | OciError::Credentials { .. } => {
                Code::RegistryUnauthorized
            }
            OciError::NotFound { .. } => Code::ImageNotFound,
            OciError::Registry { .. } => Code::RegistryUnavailable,
            OciError::Layout { .. }
            | OciError::BadImage { .. }
            | OciError::NoPlatform { .. }
            | OciError::DigestMismatch { .. }
            | OciError::Unpack(_) => Code::BadImage,
            OciError::TooLarge { .. } => Code::ImageTooLarge,
            OciError::Unpacker(_) => Code::NodeFailed,
        }
    }
}

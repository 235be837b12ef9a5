//! An image staged for its build: the config and layer blobs under a directory, by digest
//! (`sha256/<hex>`), and [`STAGED_FILE`] saying which blob is what.
//!
//! Fetching and building are done by different processes on a node: the sandbox manager
//! (unprivileged, on the network) pulls an image into a directory of its own; the node
//! manager (root) builds the template from it. Root trusts nothing in that directory: it
//! reads the list and the config through a descriptor opened as the sandbox manager, never
//! following a link, hashes the config itself (the template's identity is that hash), and
//! hands the directory to the jailed unpacker only as a descriptor, where each layer is
//! checked against the config's `diff_id` as it is applied. A lying stager can make a
//! build fail, never make root read or write anything else, nor a template whose digest
//! does not describe its content.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::{Deserialize, Serialize};

use crate::oci::config::ImageConfig;
use crate::oci::fetch::{blob_path, digest_of, read_bounded, sha256_hex, PulledImage};
use crate::oci::{ImageLimits, OciError};

/// The list's name inside a staged directory.
pub const STAGED_FILE: &str = "staged.json";
/// Largest list read.
const MAX_STAGED_BYTES: u64 = 64 * 1024;
/// Longest source description kept.
const MAX_SOURCE_CHARS: usize = 512;

/// What a staged directory holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagedImage {
    /// Where the image came from ([`super::ImageSource::describe`]).
    pub source: String,
    /// `sha256:` digest of the config blob.
    pub config: String,
    /// `sha256:` digests of the layer blobs, lowest first; empty when the template was
    /// found cached and no layer was fetched.
    pub layers: Vec<String>,
}

/// A staged image as root sees it, checked: the directory's descriptor, the list, and the
/// config as root hashed and parsed it.
#[derive(Debug)]
pub struct StagedInput {
    /// The staged directory.
    pub dir: OwnedFd,
    /// The list.
    pub image: StagedImage,
    /// `sha256:` of the config as read here.
    pub config_digest: String,
    /// The config.
    pub config: ImageConfig,
}

impl StagedInput {
    /// The layers' paths relative to the directory, each with its `diff_id`; fails when
    /// the list does not name one layer per `diff_id` (the template was found cached, then
    /// removed before this build needed the layers).
    pub fn layers(&self) -> Result<Vec<(String, String)>, OciError> {
        if self.image.layers.len() != self.config.diff_ids.len() {
            return Err(OciError::BadImage {
                what: "staged image".into(),
                detail: format!(
                    "{} layers staged for {} in the config (if the template was removed while \
                     this build found it cached, build again)",
                    self.image.layers.len(),
                    self.config.diff_ids.len()
                ),
            });
        }
        self.image
            .layers
            .iter()
            .zip(&self.config.diff_ids)
            .map(|(blob, diff_id)| Ok((format!("sha256/{}", sha256_hex(blob)?), diff_id.clone())))
            .collect()
    }
}

/// Writes `pulled` (whose blobs are in `dir`) as a staged image: the config blob and the
/// list. Files and directories are made readable by others, because the unpacker that
/// reads them runs as a uid of its own.
pub fn stage(pulled: &PulledImage, dir: &Path) -> Result<StagedImage, OciError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |path: &Path, e: std::io::Error| OciError::Layout {
        path: path.display().to_string(),
        detail: format!("cannot stage: {e}"),
    };
    let config = blob_path(dir, &pulled.config_digest)?;
    if let Some(parent) = config.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    }
    std::fs::write(&config, &pulled.config_bytes).map_err(|e| io(&config, e))?;
    let image = StagedImage {
        source: pulled.source.chars().take(MAX_SOURCE_CHARS).collect(),
        config: pulled.config_digest.clone(),
        layers: pulled.layers.iter().map(|l| l.digest.clone()).collect(),
    };
    let list = dir.join(STAGED_FILE);
    let json = serde_json::to_vec(&image).map_err(|e| io(&list, std::io::Error::other(e)))?;
    std::fs::write(&list, json).map_err(|e| io(&list, e))?;
    for d in [dir.to_owned(), dir.join("sha256")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io(&d, e))?;
    }
    let mut files = vec![list, config];
    files.extend(pulled.layers.iter().map(|l| l.path.clone()));
    for f in files {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| io(&f, e))?;
    }
    Ok(image)
}

/// Opens staged directory `dir` and checks its list and config (see the module doc). The
/// node manager calls it as the sandbox manager, so that it can open nothing the sandbox
/// manager could not.
pub fn open_staged(dir: &Path, limits: &ImageLimits) -> Result<StagedInput, OciError> {
    let err = |detail: String| OciError::Layout {
        path: dir.display().to_string(),
        detail,
    };
    let fd = rustix::fs::open(
        dir,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| err(format!("cannot open the staged image: {e}")))?;
    let bytes = read_beneath(&fd, STAGED_FILE, MAX_STAGED_BYTES, "staged list")?;
    let image: StagedImage = serde_json::from_slice(&bytes)
        .map_err(|e| err(format!("{STAGED_FILE} is not a staged image list: {e}")))?;
    if image.layers.len() > limits.max_layers {
        return Err(OciError::TooLarge {
            what: "the image".into(),
            detail: format!(
                "{} layers (at most {})",
                image.layers.len(),
                limits.max_layers
            ),
        });
    }
    for l in &image.layers {
        sha256_hex(l)?;
    }
    let rel = format!("sha256/{}", sha256_hex(&image.config)?);
    let config_bytes = read_beneath(&fd, &rel, limits.max_json_bytes, "image config")?;
    let config_digest = digest_of(&config_bytes);
    if config_digest != image.config {
        return Err(OciError::DigestMismatch {
            what: "staged image config".into(),
            expected: image.config,
            got: config_digest,
        });
    }
    let config = ImageConfig::parse(&config_bytes)?;
    Ok(StagedInput {
        dir: fd,
        image: StagedImage {
            source: image.source.chars().take(MAX_SOURCE_CHARS).collect(),
            ..image
        },
        config_digest,
        config,
    })
}

/// Opens `rel` beneath directory `dir` (no symlink followed, no `..`), for reading.
pub fn open_beneath(dir: &impl AsFd, rel: &str) -> std::io::Result<std::fs::File> {
    let fd = rustix::fs::openat2(
        dir,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

fn read_beneath(dir: &OwnedFd, rel: &str, limit: u64, what: &str) -> Result<Vec<u8>, OciError> {
    let f = open_beneath(dir, rel).map_err(|e| OciError::Layout {
        path: rel.to_owned(),
        detail: format!("cannot open the {what}: {e}"),
    })?;
    read_bounded(f.take(limit + 1), limit, what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::fetch::LayerBlob;

    fn pulled(dir: &Path, config: &[u8]) -> PulledImage {
        let layer = dir.join("sha256").join("ab".repeat(32));
        std::fs::create_dir_all(layer.parent().unwrap()).unwrap();
        std::fs::write(&layer, b"tar").unwrap();
        PulledImage {
            source: "oci:/x".into(),
            config_digest: digest_of(config),
            config_bytes: config.to_vec(),
            config: ImageConfig::parse(config).unwrap(),
            layers: vec![LayerBlob {
                path: layer,
                digest: format!("sha256:{}", "ab".repeat(32)),
                size: 3,
            }],
        }
    }

    const CONFIG: &[u8] = br#"{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":["sha256:0000000000000000000000000000000000000000000000000000000000000000"]}}"#;

    #[test]
    fn a_staged_image_reads_back_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = pulled(dir.path(), CONFIG);
        let staged = stage(&p, dir.path()).unwrap();
        let input = open_staged(dir.path(), &ImageLimits::default()).unwrap();
        assert_eq!(input.image, staged);
        assert_eq!(input.config_digest, p.config_digest);
        assert_eq!(
            input.layers().unwrap(),
            vec![(
                format!("sha256/{}", "ab".repeat(32)),
                p.config.diff_ids[0].clone()
            )]
        );
    }

    #[test]
    fn a_lying_stager_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = pulled(dir.path(), CONFIG);
        stage(&p, dir.path()).unwrap();
        // The config blob altered after staging: root hashes it itself.
        let config = blob_path(dir.path(), &p.config_digest).unwrap();
        std::fs::write(&config, [CONFIG, b" "].concat()).unwrap();
        assert!(matches!(
            open_staged(dir.path(), &ImageLimits::default()),
            Err(OciError::DigestMismatch { .. })
        ));
        // The config swapped for a symlink to a file outside: not followed.
        std::fs::remove_file(&config).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &config).unwrap();
        assert!(matches!(
            open_staged(dir.path(), &ImageLimits::default()),
            Err(OciError::Layout { .. })
        ));
        // A list naming a path instead of a digest.
        std::fs::write(
            dir.path().join(STAGED_FILE),
            br#"{"source":"x","config":"sha256:../../etc/passwd","layers":[]}"#,
        )
        .unwrap();
        assert!(open_staged(dir.path(), &ImageLimits::default()).is_err());
        // The directory itself a symlink.
        let link = dir.path().with_extension("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(open_staged(&link, &ImageLimits::default()).is_err());
        std::fs::remove_file(link).unwrap();
    }

    #[test]
    fn fewer_layers_than_the_config_names_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = pulled(dir.path(), CONFIG);
        p.layers.clear();
        stage(&p, dir.path()).unwrap();
        let input = open_staged(dir.path(), &ImageLimits::default()).unwrap();
        assert!(matches!(input.layers(), Err(OciError::BadImage { .. })));
    }
}

//! Getting an image's parts onto this machine: the config and every layer blob in a blob
//! directory (`<dir>/sha256/<hex>`), each checked against its digest as it is written and
//! bounded by [`ImageLimits`]. Which transport fills it is [`super::layout`]'s or
//! [`super::registry`]'s business; what comes out is a [`PulledImage`].

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::oci::config::ImageConfig;
use crate::oci::{ImageLimits, OciError};

/// An image whose blobs are all here and verified.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// Where it came from ([`super::ImageSource::describe`]).
    pub source: String,
    /// `sha256:<hex>` of its config: the image's identity (its config names every layer's
    /// uncompressed digest).
    pub config_digest: String,
    /// Its config's bytes, as they hash to `config_digest`.
    pub config_bytes: Vec<u8>,
    /// Its config.
    pub config: ImageConfig,
    /// Its layers, lowest first.
    pub layers: Vec<LayerBlob>,
}

/// One layer blob on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerBlob {
    /// The file (compressed as it came: gzip, zstd or plain tar).
    pub path: PathBuf,
    /// `sha256:<hex>` of the blob.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
}

/// The hex part of a `sha256:<hex>` digest, checked (other algorithms are refused: every
/// registry and tool we meet uses sha256).
pub fn sha256_hex(digest: &str) -> Result<&str, OciError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) =>
        {
            Ok(hex)
        }
        _ => Err(OciError::BadImage {
            what: "digest".into(),
            detail: format!(
                "{:?} is not a sha256 digest",
                digest.chars().take(100).collect::<String>()
            ),
        }),
    }
}

/// Where blob `digest` lives in blob directory `dir`.
pub fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf, OciError> {
    Ok(dir.join("sha256").join(sha256_hex(digest)?))
}

/// Copies at most `limit` bytes of `from` into `to` (created, or replaced), hashing as it
/// goes; fails if there is more, or if `expected` (a `sha256:` digest) is given and differs.
/// Returns the digest and size.
pub fn copy_verified(
    mut from: impl Read,
    to: &Path,
    expected: Option<&str>,
    limit: u64,
    what: &str,
) -> Result<(String, u64), OciError> {
    let io = |e: std::io::Error| OciError::Layout {
        path: to.display().to_string(),
        detail: format!("cannot write {what}: {e}"),
    };
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut out = std::fs::File::create(to).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(OciError::Layout {
                    path: what.to_owned(),
                    detail: format!("cannot read: {e}"),
                })
            }
        };
        total += n as u64;
        if total > limit {
            return Err(OciError::TooLarge {
                what: what.to_owned(),
                detail: format!("more than {limit} bytes"),
            });
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io)?;
    }
    out.sync_all().map_err(io)?;
    let got = format!("sha256:{}", hex::encode(hasher.finalize()));
    if let Some(expected) = expected {
        if got != expected {
            return Err(OciError::DigestMismatch {
                what: what.to_owned(),
                expected: expected.to_owned(),
                got,
            });
        }
    }
    Ok((got, total))
}

/// Reads a small JSON document (manifest, index, config) of at most `limit` bytes.
pub fn read_json_file(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, OciError> {
    let f = std::fs::File::open(path).map_err(|e| OciError::Layout {
        path: path.display().to_string(),
        detail: format!("cannot open {what}: {e}"),
    })?;
    read_bounded(f, limit, what)
}

/// Reads all of `r`, refusing more than `limit` bytes.
pub fn read_bounded(r: impl Read, limit: u64, what: &str) -> Result<Vec<u8>, OciError> {
    let mut buf = Vec::new();
    r.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| OciError::Layout {
            path: what.to_owned(),
            detail: format!("cannot read: {e}"),
        })?;
    if buf.len() as u64 > limit {
        return Err(OciError::TooLarge {
            what: what.to_owned(),
            detail: format!("more than {limit} bytes"),
        });
    }
    Ok(buf)
}

/// The digest of some bytes, `sha256:<hex>`.
pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The image config a manifest names: its bytes must hash to `expected`, parse, and name
/// one uncompressed digest per layer of the manifest (`layers`).
pub fn verified_config(
    bytes: &[u8],
    expected: &str,
    layers: usize,
    limits: &ImageLimits,
) -> Result<ImageConfig, OciError> {
    let got = digest_of(bytes);
    if got != expected {
        return Err(OciError::DigestMismatch {
            what: "image config".into(),
            expected: expected.to_owned(),
            got,
        });
    }
    let config = ImageConfig::parse(bytes)?;
    check_shape(&config, layers, limits)?;
    Ok(config)
}

/// Checks what every transport must: the layer count, and that the config's `rootfs`
/// names one uncompressed digest per layer (the unpacker checks each against its tar).
pub fn check_shape(
    config: &ImageConfig,
    layers: usize,
    limits: &ImageLimits,
) -> Result<(), OciError> {
    if layers > limits.max_layers {
        return Err(OciError::TooLarge {
            what: "the image".into(),
            detail: format!("{layers} layers (at most {})", limits.max_layers),
        });
    }
    if config.diff_ids.len() != layers {
        return Err(OciError::BadImage {
            what: "image config".into(),
            detail: format!(
                "rootfs.diff_ids names {} layers, the manifest {layers}",
                config.diff_ids.len()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verified_copies() {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("sha256/x");
        let d = digest_of(b"hello");
        assert_eq!(
            copy_verified(&b"hello"[..], &to, Some(&d), 10, "blob").unwrap(),
            (d.clone(), 5)
        );
        assert!(matches!(
            copy_verified(&b"hellO"[..], &to, Some(&d), 10, "blob"),
            Err(OciError::DigestMismatch { .. })
        ));
        assert!(matches!(
            copy_verified(&b"hello"[..], &to, Some(&d), 4, "blob"),
            Err(OciError::TooLarge { .. })
        ));
        assert!(sha256_hex("sha512:00").is_err());
        assert!(sha256_hex(&format!("sha256:{}", "A".repeat(64))).is_err());
        assert!(blob_path(dir.path(), "sha256:../../etc").is_err());
    }
}

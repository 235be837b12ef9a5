//! Where an image comes from, as `space template build --from REF` names it. The transports
//! are skopeo's, so a reference copied from a skopeo or podman command line means the same
//! here:
//! - `docker://HOST/REPO:TAG`, `docker://HOST/REPO@sha256:…`, or a bare `HOST/REPO:TAG`: an
//!   image in a registry (the Docker registry HTTP API v2, which every OCI registry serves);
//! - `oci:DIR[:TAG]`: an OCI image layout directory (`oci-layout`, `index.json`, `blobs/`),
//!   e.g. what `skopeo copy … oci:DIR` or `umoci` wrote; without a tag the layout must hold
//!   exactly one image;
//! - `docker-archive:FILE` or `oci-archive:FILE`: a `docker save` tarball (either its legacy
//!   `manifest.json` form or the OCI layout newer Dockers write) or a tarred OCI layout.
//!
//! A bare path (one starting with `/`, `./` or `../`) is a layout when it is a directory and
//! an archive when it is a file.

use std::path::{Path, PathBuf};

use crate::oci::OciError;

/// Longest reference accepted (a registry reference is at most ~255 bytes of name plus a
/// tag or digest; paths get a little more room).
const MAX_REFERENCE: usize = 4096;

/// An image to build a template from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// An image in a registry, by tag or digest: the reference as `oci-client` parses it.
    Registry(String),
    /// An OCI image layout directory, optionally one tag (`org.opencontainers.image.ref.name`)
    /// in it.
    Layout {
        /// The directory.
        dir: PathBuf,
        /// The tag to pick, when the layout holds several images.
        tag: Option<String>,
    },
    /// A `docker save` archive or a tarred OCI layout.
    Archive(PathBuf),
}

impl ImageSource {
    /// Parses a `--from` reference (see the module doc).
    pub fn parse(reference: &str) -> Result<ImageSource, OciError> {
        let bad = |reason: &str| OciError::BadReference {
            reference: reference.chars().take(200).collect(),
            reason: reason.to_owned(),
        };
        if reference.is_empty() {
            return Err(bad("it is empty"));
        }
        if reference.len() > MAX_REFERENCE {
            return Err(bad("it is longer than 4096 bytes"));
        }
        if reference
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(bad("it contains whitespace or control characters"));
        }
        if let Some(rest) = reference.strip_prefix("docker://") {
            return registry(rest).map_err(|r| bad(&r));
        }
        if let Some(rest) = reference.strip_prefix("oci:") {
            // `oci:DIR:TAG`: the tag is what follows the last ':' when that holds no '/'.
            let (dir, tag) = match rest.rsplit_once(':') {
                Some((dir, tag)) if !tag.contains('/') && !dir.is_empty() => {
                    (dir, Some(tag.to_owned()))
                }
                _ => (rest, None),
            };
            if dir.is_empty() {
                return Err(bad("oci: needs a directory"));
            }
            if let Some(t) = &tag {
                if t.is_empty() || t.len() > 128 {
                    return Err(bad("the tag after oci:DIR: must be 1-128 characters"));
                }
            }
            return Ok(ImageSource::Layout {
                dir: PathBuf::from(dir),
                tag,
            });
        }
        for prefix in ["docker-archive:", "oci-archive:"] {
            if let Some(file) = reference.strip_prefix(prefix) {
                if file.is_empty() {
                    return Err(bad("the archive transport needs a file"));
                }
                return Ok(ImageSource::Archive(PathBuf::from(file)));
            }
        }
        if reference.starts_with('/') || reference.starts_with("./") || reference.starts_with("../")
        {
            let path = Path::new(reference);
            return Ok(if path.is_dir() {
                ImageSource::Layout {
                    dir: path.to_owned(),
                    tag: None,
                }
            } else {
                ImageSource::Archive(path.to_owned())
            });
        }
        registry(reference).map_err(|r| bad(&r))
    }

    /// How the source is shown in logs and recorded as a template's origin (a registry
    /// reference never carries credentials: they come from a file or the credential
    /// manager).
    pub fn describe(&self) -> String {
        match self {
            ImageSource::Registry(r) => format!("docker://{r}"),
            ImageSource::Layout { dir, tag: Some(t) } => format!("oci:{}:{t}", dir.display()),
            ImageSource::Layout { dir, tag: None } => format!("oci:{}", dir.display()),
            ImageSource::Archive(f) => format!("docker-archive:{}", f.display()),
        }
    }
}

/// A registry reference, checked by the OCI client's own parser (the distribution
/// project's grammar: host, path components, tag and/or digest).
fn registry(reference: &str) -> Result<ImageSource, String> {
    if reference.contains("://") {
        return Err("only the docker:// transport names a registry".into());
    }
    let parsed: oci_client::Reference = reference
        .parse()
        .map_err(|e: oci_client::ParseError| e.to_string())?;
    Ok(ImageSource::Registry(parsed.whole()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports() {
        assert_eq!(
            ImageSource::parse("registry.example:5000/team/python:3.12").unwrap(),
            ImageSource::Registry("registry.example:5000/team/python:3.12".into())
        );
        assert_eq!(
            ImageSource::parse("docker://localhost:5000/busybox@sha256:4f5b0b5b3d1b8b8a4d4e8d1c2f0f6f6a1b2c3d4e5f60718293a4b5c6d7e8f901").unwrap(),
            ImageSource::Registry("localhost:5000/busybox@sha256:4f5b0b5b3d1b8b8a4d4e8d1c2f0f6f6a1b2c3d4e5f60718293a4b5c6d7e8f901".into())
        );
        // Docker Hub's short names are expanded the way docker does.
        assert_eq!(
            ImageSource::parse("alpine").unwrap(),
            ImageSource::Registry("docker.io/library/alpine:latest".into())
        );
        assert_eq!(
            ImageSource::parse("oci:/srv/images/py:3.12").unwrap(),
            ImageSource::Layout {
                dir: "/srv/images/py".into(),
                tag: Some("3.12".into())
            }
        );
        assert_eq!(
            ImageSource::parse("oci:/srv/images/py").unwrap(),
            ImageSource::Layout {
                dir: "/srv/images/py".into(),
                tag: None
            }
        );
        assert_eq!(
            ImageSource::parse("docker-archive:/mnt/usb/py.tar").unwrap(),
            ImageSource::Archive("/mnt/usb/py.tar".into())
        );
        assert_eq!(
            ImageSource::parse("/nonexistent/py.tar").unwrap(),
            ImageSource::Archive("/nonexistent/py.tar".into())
        );
    }

    #[test]
    fn refusals() {
        for bad in [
            "",
            "http://registry/x",
            "docker://",
            "repo/UPPER",
            "oci:",
            "docker-archive:",
            "a b",
            "x\ny",
            "oci:/dir:",
        ] {
            assert!(
                matches!(ImageSource::parse(bad), Err(OciError::BadReference { .. })),
                "{bad:?}"
            );
        }
        assert!(ImageSource::parse(&"a".repeat(5000)).is_err());
    }
}

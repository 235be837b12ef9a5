//! Pulling an image from a registry with `oci-client` (the Docker registry HTTP API v2 and
//! the OCI distribution spec; token and basic auth; multi-platform images resolved to
//! linux/amd64). Credentials come from a Docker-style `auth.json`/`config.json` file, never
//! from the command line; TLS trusts the system's roots plus an optional CA file.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tokio::io::AsyncWrite;

use crate::oci::fetch::{blob_path, verified_config, LayerBlob, PulledImage};
use crate::oci::layout::check_layer_descriptor;
use crate::oci::{ImageLimits, OciError};

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOpts {
    /// A Docker-style credentials file (`{"auths": {"HOST": {"auth": base64(user:password)}}}`,
    /// or `username`/`password` fields), as `docker login` and `podman login` write.
    pub auth_file: Option<PathBuf>,
    /// A PEM file of CA certificates to trust besides the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM CA certificates to trust besides the system's (a node's configured ones).
    pub ca_pem: Option<Vec<u8>>,
    /// Speak plain HTTP to these registries (`HOST[:PORT]`), e.g. one on loopback.
    pub plain_http: Vec<String>,
    /// A user name and password given with the build (an API caller's), used instead of
    /// the file's.
    pub login: Option<RegistryLogin>,
}

/// A registry user name and password; the password never shows in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryLogin {
    /// The user name.
    pub username: String,
    /// The password or token.
    pub password: String,
}

impl std::fmt::Debug for RegistryLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryLogin")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Largest credentials or CA file read.
const MAX_SMALL_FILE: u64 = 1 << 20;

/// The credentials `auth_file` holds for `registry`, if any.
pub fn credentials_for(auth_file: &Path, registry: &str) -> Result<RegistryAuth, OciError> {
    let err = |detail: String| OciError::Credentials {
        path: auth_file.display().to_string(),
        detail,
    };
    let bytes = crate::oci::fetch::read_bounded(
        std::fs::File::open(auth_file).map_err(|e| err(e.to_string()))?,
        MAX_SMALL_FILE,
        "credentials file",
    )
    .map_err(|e| err(e.to_string()))?;
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        auth: Option<String>,
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password: Option<String>,
    }
    let file: File =
        serde_json::from_slice(&bytes).map_err(|e| err(format!("not a credentials file: {e}")))?;
    // Docker Hub is stored under its historical URL.
    let keys = [
        registry.to_owned(),
        format!("https://{registry}"),
        format!("http://{registry}"),
        if registry == "docker.io" {
            "https://index.docker.io/v1/".to_owned()
        } else {
            String::new()
        },
    ];
    let Some(entry) = keys.iter().find_map(|k| file.auths.get(k)) else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
    }
    let Some(auth) = &entry.auth else {
        return Ok(RegistryAuth::Anonymous);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| err(format!("the entry for {registry} is not base64")))?;
    let decoded = String::from_utf8(decoded)
        .map_err(|_| err(format!("the entry for {registry} is not text")))?;
    let (u, p) = decoded
        .split_once(':')
        .ok_or_else(|| err(format!("the entry for {registry} is not user:password")))?;
    Ok(RegistryAuth::Basic(u.to_owned(), p.to_owned()))
}

/// The user name and password `auth_file` holds for the registry of image `reference`
/// (`None`: it has none for it), to hand to a server that pulls on our behalf.
pub fn login_for_reference(
    auth_file: &Path,
    reference: &str,
) -> Result<Option<RegistryLogin>, OciError> {
    let crate::oci::ImageSource::Registry(registry_ref) =
        crate::oci::ImageSource::parse(reference)?
    else {
        return Ok(None);
    };
    let parsed = parse_reference(&registry_ref)?;
    Ok(
        match credentials_for(auth_file, parsed.resolve_registry())? {
            RegistryAuth::Basic(username, password) => Some(RegistryLogin { username, password }),
            _ => None,
        },
    )
}

/// A registry reference (`HOST/REPO:TAG`, `…@sha256:…`) as `oci-client` reads it.
fn parse_reference(reference: &str) -> Result<Reference, OciError> {
    reference
        .parse()
        .map_err(|e: oci_client::ParseError| OciError::BadReference {
            reference: reference.chars().take(200).collect(),
            reason: e.to_string(),
        })
}

fn client(opts: &RegistryOpts) -> Result<Client, OciError> {
    let mut extra_root_certificates = Vec::new();
    if let Some(data) = &opts.ca_pem {
        extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data: data.clone(),
        });
    }
    if let Some(ca) = &opts.ca_file {
        let data = crate::oci::fetch::read_bounded(
            std::fs::File::open(ca).map_err(|e| OciError::Credentials {
                path: ca.display().to_string(),
                detail: e.to_string(),
            })?,
            MAX_SMALL_FILE,
            "CA file",
        )?;
        extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    Ok(Client::new(ClientConfig {
        protocol: if opts.plain_http.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(opts.plain_http.clone())
        },
        extra_root_certificates,
        connect_timeout: Some(Duration::from_secs(15)),
        read_timeout: Some(Duration::from_secs(120)),
        max_concurrent_download: 4,
        ..Default::default()
    }))
}

fn registry_err(reference: &str, e: OciDistributionError) -> OciError {
    match e {
        OciDistributionError::AuthenticationFailure(detail) => OciError::Unauthorized {
            registry: registry_of(reference),
            detail,
        },
        OciDistributionError::UnauthorizedError { url } => OciError::Unauthorized {
            registry: registry_of(reference),
            detail: format!("{url}: unauthorized"),
        },
        OciDistributionError::ImageManifestNotFoundError(detail) => OciError::NotFound {
            reference: reference.to_owned(),
            detail,
        },
        OciDistributionError::ServerError { code: 404, url, .. } => OciError::NotFound {
            reference: reference.to_owned(),
            detail: url,
        },
        OciDistributionError::ServerError {
            code: 401 | 403,
            url,
            message,
        } => OciError::Unauthorized {
            registry: registry_of(reference),
            detail: format!("{url}: {message}"),
        },
        OciDistributionError::RegistryError { envelope, url } => {
            use oci_client::errors::OciErrorCode as C;
            let detail = format!("{url}: {envelope}");
            let codes: Vec<&C> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    C::ManifestUnknown | C::NameUnknown | C::BlobUnknown | C::NotFound
                )
            }) {
                OciError::NotFound {
                    reference: reference.to_owned(),
                    detail,
                }
            } else if codes
                .iter()
                .any(|c| matches!(c, C::Unauthorized | C::Denied))
            {
                OciError::Unauthorized {
                    registry: registry_of(reference),
                    detail,
                }
            } else {
                OciError::Registry {
                    reference: reference.to_owned(),
                    detail,
                }
            }
        }
        OciDistributionError::DigestError(d) => OciError::DigestMismatch {
            what: "a blob from the registry".into(),
            expected: String::new(),
            got: d.to_string(),
        },
        other => OciError::Registry {
            reference: reference.to_owned(),
            detail: with_causes(&other),
        },
    }
}

/// An error and its causes, `a: b: c`: reqwest's own message ("error sending request") says
/// nothing of an untrusted certificate or a refused connection; its sources do.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

fn registry_of(reference: &str) -> String {
    reference
        .parse::<Reference>()
        .map(|r| r.resolve_registry().to_owned())
        .unwrap_or_default()
}

/// Pulls `reference` into blob directory `blobs`.
pub async fn pull(
    reference: &str,
    blobs: &Path,
    opts: &RegistryOpts,
    limits: &ImageLimits,
    cached: &(dyn Fn(&str) -> bool + Sync),
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<PulledImage, OciError> {
    let parsed = parse_reference(reference)?;
    let auth = match (&opts.login, &opts.auth_file) {
        (Some(l), _) => RegistryAuth::Basic(l.username.clone(), l.password.clone()),
        (None, Some(f)) => credentials_for(f, parsed.resolve_registry())?,
        (None, None) => RegistryAuth::Anonymous,
    };
    let client = client(opts)?;
    progress(&format!("pulling manifest of {reference}"));
    let (manifest, manifest_digest, config) = client
        .pull_manifest_and_config(&parsed, &auth)
        .await
        .map_err(|e| registry_err(reference, e))?;
    let config = config.into_bytes();
    if config.len() as u64 > limits.max_json_bytes {
        return Err(OciError::TooLarge {
            what: "image config".into(),
            detail: format!("{} bytes", config.len()),
        });
    }
    let image_config = verified_config(
        &config,
        &manifest.config.digest,
        manifest.layers.len(),
        limits,
    )?;
    for l in &manifest.layers {
        check_layer_descriptor(l, limits)?;
    }
    if cached(&manifest.config.digest) {
        // The template is in the store already: no layer is needed.
        return Ok(PulledImage {
            source: format!("docker://{reference}"),
            config_digest: manifest.config.digest,
            config_bytes: config,
            config: image_config,
            layers: Vec::new(),
        });
    }
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (i, l) in manifest.layers.iter().enumerate() {
        let to = blob_path(blobs, &l.digest)?;
        if let Some(parent) = to.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| OciError::Unpacker(format!("{}: {e}", parent.display())))?;
        }
        progress(&format!(
            "pulling layer {}/{} ({}, {} MiB)",
            i + 1,
            manifest.layers.len(),
            &l.digest[..19.min(l.digest.len())],
            l.size >> 20
        ));
        let file = tokio::fs::File::create(&to)
            .await
            .map_err(|e| OciError::Unpacker(format!("{}: {e}", to.display())))?;
        let declared = u64::try_from(l.size).unwrap_or(0);
        let mut out = Bounded {
            inner: file,
            left: declared,
        };
        // oci-client hashes what it writes and fails on a digest mismatch; `Bounded` stops
        // a registry sending more than the manifest declared.
        client
            .pull_blob(&parsed, l, &mut out)
            .await
            .map_err(|e| match e {
                OciDistributionError::IoError(io)
                    if io.kind() == std::io::ErrorKind::FileTooLarge =>
                {
                    OciError::TooLarge {
                        what: format!("layer {}", l.digest),
                        detail: format!("more bytes than its declared {declared}"),
                    }
                }
                e => registry_err(reference, e),
            })?;
        // A tokio file writes in the background: flushed and synced before the unpacker
        // reads it. What was written is what the bound counted.
        let stored = async {
            use tokio::io::AsyncWriteExt as _;
            out.inner.flush().await?;
            out.inner.sync_all().await
        };
        stored
            .await
            .map_err(|e| OciError::Unpacker(format!("{}: {e}", to.display())))?;
        let size = declared - out.left;
        if size != declared {
            return Err(OciError::BadImage {
                what: format!("layer {}", l.digest),
                detail: format!("{size} bytes, the manifest says {declared}"),
            });
        }
        layers.push(LayerBlob {
            path: to,
            digest: l.digest.clone(),
            size,
        });
    }
    progress(&format!("pulled {reference} ({manifest_digest})"));
    Ok(PulledImage {
        source: format!("docker://{reference}"),
        config_digest: manifest.config.digest,
        config_bytes: config,
        config: image_config,
        layers,
    })
}

/// A writer that refuses to take more than `left` bytes.
struct Bounded<W> {
    inner: W,
    left: u64,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Bounded<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            return Poll::Ready(Err(std::io::Error::from(std::io::ErrorKind::FileTooLarge)));
        }
        let this = &mut *self;
        let n = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.left -= n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("auth.json");
        std::fs::write(
            &f,
            r#"{"auths":{"reg.example:5000":{"auth":"YWxpY2U6czNjcmV0"},
                "other":{"username":"bob","password":"pw"}}}"#,
        )
        .unwrap();
        assert_eq!(
            credentials_for(&f, "reg.example:5000").unwrap(),
            RegistryAuth::Basic("alice".into(), "s3cret".into())
        );
        assert_eq!(
            credentials_for(&f, "other").unwrap(),
            RegistryAuth::Basic("bob".into(), "pw".into())
        );
        assert_eq!(
            credentials_for(&f, "elsewhere").unwrap(),
            RegistryAuth::Anonymous
        );
        std::fs::write(&f, r#"{"auths":{"x":{"auth":"not base64!"}}}"#).unwrap();
        assert!(matches!(
            credentials_for(&f, "x"),
            Err(OciError::Credentials { .. })
        ));
    }
}

//! Which object store, as the operator describes it in a JSON file (`--object-store FILE`):
//!
//! ```json
//! {"kind": "local", "dir": "/var/lib/space/objects"}
//! {"kind": "s3", "endpoint": "https://s3.internal:9000", "region": "us-east-1",
//!  "bucket": "space", "access_key_id": "AK…", "secret_access_key_file": "/etc/space/s3.secret",
//!  "ca_file": "/etc/space/s3-ca.pem"}
//! ```
//!
//! The secret key is read from its own file (mode 0600 expected), never given on a command
//! line; `endpoint` omitted means AWS. Plain `http://` endpoints must be allowed explicitly
//! (`"allow_http": true`): credentials would cross the network signed but the data in clear.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// Largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// An object store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ObjectStoreConfig {
    /// A directory on this machine (the single-machine default).
    Local {
        /// Where objects are kept.
        dir: PathBuf,
    },
    /// An S3-compatible service.
    S3(S3Config),
}

/// An S3-compatible service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// `https://host:port` (path-style requests); absent: AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The region the service expects (Garage: `garage`; MinIO: `us-east-1`).
    pub region: String,
    /// The bucket every object goes into.
    pub bucket: String,
    /// Access key id.
    pub access_key_id: String,
    /// A file holding the secret access key (its first line).
    pub secret_access_key_file: PathBuf,
    /// A PEM file of extra CA certificates to trust for the endpoint (on-premises CAs).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Allow a plain `http://` endpoint.
    #[serde(default)]
    pub allow_http: bool,
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error("{0}: larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge(PathBuf),
    /// The JSON is not a configuration.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl ObjectStoreConfig {
    /// Reads a configuration file.
    pub fn load(path: &Path) -> Result<ObjectStoreConfig, ConfigError> {
        let text = read_bounded(path)?;
        let config: ObjectStoreConfig =
            serde_json::from_str(&text).map_err(|e| ConfigError::Invalid {
                path: path.to_owned(),
                reason: e.to_string(),
            })?;
        config.check().map_err(|reason| ConfigError::Invalid {
            path: path.to_owned(),
            reason,
        })?;
        Ok(config)
    }

    /// Checks what JSON cannot: names and URLs of the right shape.
    pub fn check(&self) -> Result<(), String> {
        match self {
            ObjectStoreConfig::Local { dir } if !dir.is_absolute() => {
                Err(format!("dir {} must be an absolute path", dir.display()))
            }
            ObjectStoreConfig::Local { .. } => Ok(()),
            ObjectStoreConfig::S3(s3) => s3.check(),
        }
    }
}

impl S3Config {
    fn check(&self) -> Result<(), String> {
        let bucket_ok = (3..=63).contains(&self.bucket.len())
            && self
                .bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(format!(
                "bucket {:?}: 3-63 of [a-z0-9.-]",
                self.bucket.chars().take(80).collect::<String>()
            ));
        }
        if self.region.is_empty() || self.region.len() > 64 {
            return Err("region: 1-64 characters".into());
        }
        if self.access_key_id.is_empty() || self.access_key_id.len() > 256 {
            return Err("access_key_id: 1-256 characters".into());
        }
        if let Some(endpoint) = &self.endpoint {
            match endpoint.split_once("://").map(|(s, _)| s) {
                Some("https") => {}
                Some("http") if self.allow_http => {}
                Some("http") => {
                    return Err(
                        "endpoint is plain http: set \"allow_http\": true to use it anyway".into(),
                    )
                }
                _ => return Err("endpoint must be an http(s):// URL".into()),
            }
        }
        Ok(())
    }

    /// The secret access key, from its file.
    pub fn secret_access_key(&self) -> Result<Zeroizing<String>, ConfigError> {
        let text = Zeroizing::new(read_bounded(&self.secret_access_key_file)?);
        let line = text.lines().next().unwrap_or("").trim();
        if line.is_empty() {
            return Err(ConfigError::Invalid {
                path: self.secret_access_key_file.clone(),
                reason: "empty".into(),
            });
        }
        Ok(Zeroizing::new(line.to_owned()))
    }
}

fn read_bounded(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let read = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge(path.to_owned()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(endpoint: Option<&str>, allow_http: bool) -> ObjectStoreConfig {
        ObjectStoreConfig::S3(S3Config {
            endpoint: endpoint.map(str::to_owned),
            region: "garage".into(),
            bucket: "space".into(),
            access_key_id: "GK123".into(),
            secret_access_key_file: "/etc/space/secret".into(),
            ca_file: None,
            allow_http,
        })
    }

    #[test]
    fn configurations_are_checked() {
        assert!(s3(Some("https://s3.internal"), false).check().is_ok());
        assert!(s3(None, false).check().is_ok());
        assert!(s3(Some("http://127.0.0.1:3900"), false).check().is_err());
        assert!(s3(Some("http://127.0.0.1:3900"), true).check().is_ok());
        assert!(s3(Some("ftp://x"), true).check().is_err());
        let mut bad = s3(None, false);
        if let ObjectStoreConfig::S3(c) = &mut bad {
            c.bucket = "Bad_Bucket".into();
        }
        assert!(bad.check().is_err());
        assert!(ObjectStoreConfig::Local {
            dir: "relative".into()
        }
        .check()
        .is_err());
    }

    #[test]
    fn files_parse_strictly_and_secrets_come_from_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cr3t\n").unwrap();
        let cfg = dir.path().join("store.json");
        std::fs::write(
            &cfg,
            format!(
                r#"{{"kind":"s3","endpoint":"http://127.0.0.1:3900","allow_http":true,"region":"garage","bucket":"space","access_key_id":"GK1","secret_access_key_file":"{}"}}"#,
                secret.display()
            ),
        )
        .unwrap();
        let ObjectStoreConfig::S3(s3) = ObjectStoreConfig::load(&cfg).unwrap() else {
            panic!("s3");
        };
        assert_eq!(s3.secret_access_key().unwrap().as_str(), "s3cr3t");
        std::fs::write(&cfg, r#"{"kind":"local","dir":"/x","extra":1}"#).unwrap();
        assert!(
            ObjectStoreConfig::load(&cfg).is_err(),
            "unknown fields refused"
        );
    }
}

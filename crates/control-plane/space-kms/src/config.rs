//! The operator's key services: which KMSs customers' keys may live in, and how SPACE
//! reaches each. A tenant's customer key names one of these by name; a tenant never names a
//! program to run, a library to load or an address to dial.
//!
//! ```json
//! {"providers": {
//!   "corp-kmip": {"kind": "kmip", "address": "kms.corp:5696", "ca_file": "/etc/space/kmip-ca.pem"},
//!   "hsm":       {"kind": "pkcs11", "module": "/usr/lib/softhsm/libsofthsm2.so"},
//!   "cloud":     {"kind": "command", "program": "/usr/local/bin/space-kms-helper", "args": ["--region", "eu"]},
//!   "local":     {"kind": "local", "master_key_dir": "/etc/space/local-kms"}
//! }}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::KmsError;

/// Largest configuration file read.
pub const MAX_CONFIG_LEN: u64 = 256 * 1024;
/// Most key services configured.
pub const MAX_PROVIDERS: usize = 64;
/// Where the built-in local key service keeps its master keys by default: outside the data
/// directory (`/var/lib/space`), with the host's configuration, so that a copy of the data
/// directory (a backup, a stolen disk image of it) does not carry the keys that open it.
pub const DEFAULT_LOCAL_MASTER_KEY_DIR: &str = "/etc/space/local-kms";
/// The name of the built-in local key service in the embedded default.
pub const LOCAL_PROVIDER: &str = "local";

/// Every key service the operator offers, by name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KmsConfig {
    /// Name (`[a-z0-9-]`, 1-64) → service.
    pub providers: BTreeMap<String, ProviderConfig>,
}

/// One key service.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProviderConfig {
    /// A KMIP server (KMIP 1.4 or later: Encrypt and Decrypt with AES-GCM and additional
    /// data), over mutual TLS.
    Kmip {
        /// `host:port` (KMIP's port is 5696).
        address: String,
        /// The name the server's certificate must carry (default: the address's host).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server_name: Option<String>,
        /// PEM file of the CA(s) the server's certificate must chain to.
        ca_file: PathBuf,
        /// Timeout of one call, connection included (default 5000, at most 60000).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// A PKCS#11 module (an HSM's, a cloud HSM's, SoftHSM2's): AES keys used with
    /// CKM_AES_GCM inside the token.
    Pkcs11 {
        /// The module's shared library.
        module: PathBuf,
        /// The token used when a customer key names none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
    },
    /// An external helper that wraps and unwraps (for cloud KMSs): see [`crate::command`].
    Command {
        /// The program.
        program: PathBuf,
        /// Arguments before the operation.
        #[serde(default)]
        args: Vec<String>,
        /// Timeout of one run (default 5000, at most 60000).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// The built-in local key service: master keys in files of a directory outside the data
    /// directory. The weaker choice (the keys are on the same host): for offline and
    /// single-machine use.
    Local {
        /// Directory of the master keys (mode 0700, one 0600 file per key).
        master_key_dir: PathBuf,
    },
}

impl ProviderConfig {
    /// The kind, as the configuration names it.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderConfig::Kmip { .. } => "kmip",
            ProviderConfig::Pkcs11 { .. } => "pkcs11",
            ProviderConfig::Command { .. } => "command",
            ProviderConfig::Local { .. } => "local",
        }
    }
}

impl KmsConfig {
    /// The embedded default: the local key service alone, its keys in `master_key_dir`.
    pub fn local_only(master_key_dir: impl Into<PathBuf>) -> KmsConfig {
        KmsConfig {
            providers: BTreeMap::from([(
                LOCAL_PROVIDER.to_owned(),
                ProviderConfig::Local {
                    master_key_dir: master_key_dir.into(),
                },
            )]),
        }
    }

    /// Reads and checks a configuration file (strict: unknown fields are errors).
    pub fn from_file(path: &Path) -> Result<KmsConfig, KmsError> {
        use std::io::Read as _;
        let file = std::fs::File::open(path)
            .map_err(|e| KmsError::Config(format!("{}: {e}", path.display())))?;
        let mut bytes = Vec::new();
        file.take(MAX_CONFIG_LEN + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| KmsError::Config(format!("{}: {e}", path.display())))?;
        if bytes.len() as u64 > MAX_CONFIG_LEN {
            return Err(KmsError::Config(format!(
                "{}: longer than {MAX_CONFIG_LEN} bytes",
                path.display()
            )));
        }
        let config: KmsConfig = serde_json::from_slice(&bytes)
            .map_err(|e| KmsError::Config(format!("{}: {e}", path.display())))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks names and bounds.
    pub fn validate(&self) -> Result<(), KmsError> {
        if self.providers.len() > MAX_PROVIDERS {
            return Err(KmsError::Config(format!(
                "more than {MAX_PROVIDERS} key services"
            )));
        }
        for (name, provider) in &self.providers {
            check_provider_name(name)?;
            let timeout = match provider {
                ProviderConfig::Kmip {
                    address,
                    timeout_ms,
                    ..
                } => {
                    if address.rsplit_once(':').is_none() {
                        return Err(KmsError::Config(format!(
                            "{name}: address must be host:port"
                        )));
                    }
                    *timeout_ms
                }
                ProviderConfig::Command { timeout_ms, .. } => *timeout_ms,
                ProviderConfig::Pkcs11 { .. } | ProviderConfig::Local { .. } => None,
            };
            if let Some(ms) = timeout {
                if ms == 0 || ms > 60_000 {
                    return Err(KmsError::Config(format!(
                        "{name}: timeout_ms must be 1 to 60000"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A key service's name: `[a-z0-9-]`, 1 to 64 characters, starting with a letter or digit.
pub fn check_provider_name(name: &str) -> Result<(), KmsError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(KmsError::Config(format!(
            "key service name {name:?}: use 1-64 of [a-z0-9-], not starting with '-'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_are_strict() {
        let good = r#"{"providers": {
            "corp": {"kind": "kmip", "address": "127.0.0.1:5696", "ca_file": "/ca.pem"},
            "hsm": {"kind": "pkcs11", "module": "/usr/lib/softhsm/libsofthsm2.so"},
            "cloud": {"kind": "command", "program": "/bin/helper", "timeout_ms": 2000},
            "local": {"kind": "local", "master_key_dir": "/etc/space/local-kms"}}}"#;
        let config: KmsConfig = serde_json::from_str(good).unwrap();
        config.validate().unwrap();
        assert_eq!(config.providers["hsm"].kind(), "pkcs11");
        for bad in [
            r#"{"providers": {"x": {"kind": "kmip", "address": "nohost", "ca_file": "/c"}}}"#,
            r#"{"providers": {"Bad Name": {"kind": "local", "master_key_dir": "/k"}}}"#,
            r#"{"providers": {"x": {"kind": "command", "program": "/p", "timeout_ms": 0}}}"#,
        ] {
            let config: KmsConfig = serde_json::from_str(bad).unwrap();
            assert!(config.validate().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<KmsConfig>(
            r#"{"providers": {"x": {"kind": "local", "master_key_dir": "/k", "extra": 1}}}"#
        )
        .is_err());
    }
}

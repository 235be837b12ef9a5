//! What a customer key names at its service: the key, and how SPACE authenticates to use it.

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::error::KmsError;

/// Longest key id, token label or PIN accepted.
pub const MAX_KEY_ID_LEN: usize = 256;
/// Longest PEM (certificate chain or private key) accepted.
pub const MAX_PEM_LEN: usize = 16 * 1024;

/// How SPACE proves to the service that it may use the key. Secret: never logged (`Debug`
/// is redacted), stored only sealed.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum KeyCredentials {
    /// Nothing beyond the service's own configuration (a helper's environment, the local
    /// service).
    #[default]
    None,
    /// A TLS client certificate and its key (KMIP).
    ClientCertificate {
        /// PEM certificate chain, leaf first.
        certificate_pem: String,
        /// PEM private key (PKCS#8, SEC1 or PKCS#1).
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        private_key_pem: Zeroizing<String>,
    },
    /// A user PIN of a PKCS#11 token.
    Pin {
        /// The PIN.
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        pin: Zeroizing<String>,
    },
}

impl std::fmt::Debug for KeyCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyCredentials::None => "None",
            KeyCredentials::ClientCertificate { .. } => "ClientCertificate(<redacted>)",
            KeyCredentials::Pin { .. } => "Pin(<redacted>)",
        })
    }
}

impl KeyCredentials {
    /// The kind, as the API names it.
    pub fn kind(&self) -> &'static str {
        match self {
            KeyCredentials::None => "none",
            KeyCredentials::ClientCertificate { .. } => "client_certificate",
            KeyCredentials::Pin { .. } => "pin",
        }
    }
}

/// One version of a customer key at its service.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeyAccess {
    /// The key at the service: a KMIP unique identifier, a PKCS#11 key label, a helper's key
    /// id, a local key's name.
    pub key_id: String,
    /// PKCS#11: the label of the token the key is on (default: the service's token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// How to authenticate.
    #[serde(default)]
    pub credentials: KeyCredentials,
}

impl KeyAccess {
    /// Checks bounds and shapes (what the service then says is its own business).
    pub fn validate(&self) -> Result<(), KmsError> {
        check_label("key_id", &self.key_id)?;
        if let Some(token) = &self.token {
            check_label("token", token)?;
        }
        match &self.credentials {
            KeyCredentials::None => {}
            KeyCredentials::ClientCertificate {
                certificate_pem,
                private_key_pem,
            } => {
                if certificate_pem.len() > MAX_PEM_LEN || private_key_pem.len() > MAX_PEM_LEN {
                    return Err(KmsError::InvalidAccess(format!(
                        "a PEM is longer than {MAX_PEM_LEN} bytes"
                    )));
                }
            }
            KeyCredentials::Pin { pin } => {
                if pin.is_empty() || pin.len() > MAX_KEY_ID_LEN || pin.contains('\0') {
                    return Err(KmsError::InvalidAccess(format!(
                        "pin must be 1 to {MAX_KEY_ID_LEN} bytes without NUL"
                    )));
                }
            }
        }
        Ok(())
    }
}

fn check_label(what: &str, value: &str) -> Result<(), KmsError> {
    if value.is_empty() || value.len() > MAX_KEY_ID_LEN || value.chars().any(char::is_control) {
        return Err(KmsError::InvalidAccess(format!(
            "{what} must be 1 to {MAX_KEY_ID_LEN} bytes without control characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_never_printed() {
        let access = KeyAccess {
            key_id: "k".into(),
            token: None,
            credentials: KeyCredentials::Pin {
                pin: Zeroizing::new("123456".into()),
            },
        };
        assert!(!format!("{access:?}").contains("123456"));
        assert!(access.validate().is_ok());
        let mut bad = access.clone();
        bad.key_id = "a\nb".into();
        assert!(bad.validate().is_err());
        bad.key_id = String::new();
        assert!(bad.validate().is_err());
    }
}

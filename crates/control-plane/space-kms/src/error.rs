//! Why a key service did not wrap or unwrap: the distinctions a caller acts on.

use thiserror::Error;

/// Why a customer key cannot be used, as the key service said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unavailable {
    /// No such key (never existed, or destroyed).
    NotFound,
    /// The key exists but may not be used: revoked, disabled, deactivated, compromised.
    Revoked,
    /// The service refused us: the credentials SPACE holds for this key are not (or no
    /// longer) accepted.
    NotPermitted,
}

impl Unavailable {
    /// As text, for messages and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailable::NotFound => "not found or destroyed",
            Unavailable::Revoked => "revoked or disabled",
            Unavailable::NotPermitted => "access refused",
        }
    }
}

/// A key service call that did not succeed. Never carries key material.
#[derive(Debug, Error)]
pub enum KmsError {
    /// The customer's key cannot be used: the customer revoked, disabled or destroyed it,
    /// or withdrew SPACE's access. Not retried.
    #[error("the key is unavailable ({}): {detail}", reason.as_str())]
    KeyUnavailable {
        /// Which way.
        reason: Unavailable,
        /// The service's words (bounded, sanitised).
        detail: String,
    },
    /// The service could not be reached or did not answer in time. Worth retrying.
    #[error("the key service is unreachable: {0}")]
    Unreachable(String),
    /// A wrapped key that the service (or our own check) refuses to unwrap: damaged,
    /// another key's, or bound to another artifact.
    #[error("the wrapped data key was refused: it is damaged or belongs to something else")]
    WrappedKeyRejected,
    /// The service answered outside its protocol.
    #[error("the key service answered outside its protocol: {0}")]
    Protocol(String),
    /// What a customer key names is unusable with this service (bad key id, missing or
    /// malformed credentials).
    #[error("invalid key access: {0}")]
    InvalidAccess(String),
    /// The operator's configuration of this service is unusable.
    #[error("key service configuration: {0}")]
    Config(String),
}

impl KmsError {
    /// Whether a retry may succeed (the service was unreachable).
    pub fn is_retryable(&self) -> bool {
        matches!(self, KmsError::Unreachable(_))
    }
}

/// A service's message, bounded and free of control characters, for an error's detail.
pub(crate) fn sanitize(text: &str) -> String {
    const MAX: usize = 200;
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX)
        .collect();
    if text.chars().count() > MAX {
        out.push('…');
    }
    out
}

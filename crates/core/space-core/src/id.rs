//! Typed identifiers. Every id that crosses a trust boundary is parsed, never trusted.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id does not have the expected prefix.
    #[error("expected an id starting with '{0}'")]
    Prefix(&'static str),
    /// The id has the wrong length or characters.
    #[error("malformed id: expected '{0}' followed by {1} lowercase letters or digits")]
    Body(&'static str, usize),
}

const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

fn random_body(len: usize) -> String {
    let mut rng = rand::thread_rng();
    (0..len)
        .map(|_| ID_ALPHABET[rng.gen_range(0..ID_ALPHABET.len())] as char)
        .collect()
}

fn check(s: &str, prefix: &'static str, len: usize) -> Result<(), IdError> {
    let body = s.strip_prefix(prefix).ok_or(IdError::Prefix(prefix))?;
    if body.len() != len
        || !body
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(IdError::Body(prefix, len));
    }
    Ok(())
}

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $len:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = String, example = json!(concat!($prefix, "0123456789abcdefghij"))))]
        pub struct $name(String);

        impl $name {
            /// The fixed prefix of this kind of id.
            pub const PREFIX: &'static str = $prefix;
            /// Number of random characters after the prefix.
            pub const BODY_LEN: usize = $len;

            /// A fresh random id.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, random_body($len)))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                check(s, $prefix, $len)?;
                Ok(Self(s.to_owned()))
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                check(&s, $prefix, $len)?;
                Ok(Self(s))
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

typed_id!(
    /// A sandbox, e.g. `sbx-k3v9q0x2m1c8r7t4z5a6`.
    SandboxId,
    "sbx-",
    20
);

typed_id!(
    /// A snapshot of a sandbox (disk snapshot or full checkpoint), e.g. `snp-…`.
    SnapshotId,
    "snp-",
    20
);

typed_id!(
    /// A tenant: the owner of API keys and sandboxes.
    TenantId,
    "tnt-",
    12
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse() {
        let id = SandboxId::generate();
        assert_eq!(id.as_str().parse::<SandboxId>(), Ok(id.clone()));
        assert_eq!(id.as_str().len(), 24);
    }

    #[test]
    fn malformed_ids_are_rejected() {
        assert_eq!("nope".parse::<SandboxId>(), Err(IdError::Prefix("sbx-")));
        assert!("sbx-short".parse::<SandboxId>().is_err());
        assert!("sbx-ABCDEFGHIJ0123456789".parse::<SandboxId>().is_err());
        assert!("sbx-../../../etc/passwd0".parse::<SandboxId>().is_err());
        assert!(serde_json::from_str::<SandboxId>("\"sbx-x\"").is_err());
    }
}

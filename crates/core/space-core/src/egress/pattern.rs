//! Domain patterns: [`DomainPattern`], the destination of a domain rule, either an exact
//! name (`example.com`) or a wildcard (`*.example.com`), matched label by label.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::hostname::{canonicalise, Hostname, HostnameError, MAX_HOSTNAME_BYTES};

/// Why a string is not a domain pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainPatternError {
    /// A `*` anywhere but as the whole first label.
    #[error("a wildcard may only be the whole first label, as in \"*.example.com\"")]
    BadWildcard,
    /// The name (or the suffix after `*.`) is not a valid host name.
    #[error(transparent)]
    Host(#[from] HostnameError),
}

/// The destination of a domain rule: an exact name (`example.com`) or a wildcard
/// (`*.example.com`) that matches every strict subdomain at any depth but never the apex.
/// Names are canonicalised like [`Hostname`]; a wildcard's suffix may be a single label
/// (`*.com`). Serialised as a string; deserialising validates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = String, example = json!("*.example.com")))]
pub struct DomainPattern(
    /// The canonical pattern: a canonical name, or `*.` and a canonical suffix.
    String,
);

/// The prefix of a wildcard pattern.
const WILDCARD_PREFIX: &str = "*.";

impl DomainPattern {
    /// Parses `example.com` or `*.example.com` (Unicode names become A-labels).
    pub fn parse(input: &str) -> Result<DomainPattern, DomainPatternError> {
        let (wildcard, rest) = match input.strip_prefix(WILDCARD_PREFIX) {
            Some(rest) => (true, rest),
            None => (false, input),
        };
        if rest.contains('*') {
            return Err(DomainPatternError::BadWildcard);
        }
        let name = canonicalise(rest, if wildcard { 1 } else { 2 })?;
        if !wildcard {
            return Ok(DomainPattern(name));
        }
        // A matching host has at least one more label: "x." plus the suffix.
        if name.len() + 2 > MAX_HOSTNAME_BYTES {
            return Err(HostnameError::TooLong {
                len: name.len() + 2,
            }
            .into());
        }
        Ok(DomainPattern(format!("{WILDCARD_PREFIX}{name}")))
    }

    /// A pattern matching exactly `host`.
    pub fn exact(host: Hostname) -> DomainPattern {
        DomainPattern(host.into())
    }

    /// Whether this is a `*.` pattern.
    pub fn is_wildcard(&self) -> bool {
        self.0.starts_with(WILDCARD_PREFIX)
    }

    /// The exact name, or the suffix after `*.`.
    pub fn name(&self) -> &str {
        self.0.strip_prefix(WILDCARD_PREFIX).unwrap_or(&self.0)
    }

    /// The pattern as written canonically (`example.com`, `*.example.com`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `host` matches: equal for an exact pattern; for a wildcard, the host's last
    /// labels equal the suffix's labels and it has at least one more label.
    pub fn matches(&self, host: &Hostname) -> bool {
        let Some(suffix) = self.0.strip_prefix(WILDCARD_PREFIX) else {
            return host.as_str() == self.0;
        };
        let mut host_labels = host.labels().rev();
        for label in suffix.split('.').rev() {
            if host_labels.next() != Some(label) {
                return false;
            }
        }
        host_labels.next().is_some()
    }
}

impl FromStr for DomainPattern {
    type Err = DomainPatternError;
    fn from_str(s: &str) -> Result<Self, DomainPatternError> {
        DomainPattern::parse(s)
    }
}

impl TryFrom<String> for DomainPattern {
    type Error = DomainPatternError;
    fn try_from(s: String) -> Result<Self, DomainPatternError> {
        DomainPattern::parse(&s)
    }
}

impl From<DomainPattern> for String {
    fn from(p: DomainPattern) -> String {
        p.0
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

//! What a credential is, apart from its value: its id, its name, the scope it belongs to and
//! the rule that says where it may go.
//!
//! These types are metadata. They are stored in plain JSON (authenticated, not encrypted),
//! shown in listings, written to the audit log and printed in logs; the value itself is a
//! [`SecretValue`](crate::SecretValue) and never lives here.
//!
//! Everything that comes from outside (an API request, a file on disk) is checked by
//! [`Credential::validate`] before it is used.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use serde::{Deserialize, Serialize};
use space_core::id::{SandboxId, TenantId};

use crate::rule::CredentialRule;

/// Why a credential (or one of its parts) is not acceptable. Messages name the field and the
/// bound; they never contain a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// A malformed credential id.
    #[error("malformed credential id: expected '{prefix}' followed by {len} lowercase letters or digits", prefix = CredentialId::PREFIX, len = CredentialId::BODY_LEN)]
    CredentialId,
    /// A malformed credential name.
    #[error("invalid credential name: 1 to {MAX_NAME_LEN} characters, a letter first, then letters, digits, '_' or '-'")]
    Name,
    /// A malformed project id.
    #[error("invalid project id: 1 to {MAX_PROJECT_ID_LEN} characters, a lowercase letter or digit first, then lowercase letters, digits, '_' or '-'")]
    ProjectId,
    /// Timestamps that make no sense.
    #[error("invalid timestamps: {0}")]
    Timestamps(&'static str),
    /// A field of the injection rule is wrong.
    #[error("invalid rule: {field}: {problem}")]
    Rule {
        /// Which field (`hosts[2]`, `injection.template`, ...).
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl ValidationError {
    pub(crate) fn rule(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ValidationError::Rule {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// Characters of a credential id body (as for the other ids of SPACE).
const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A credential, e.g. `crd-k3v9q0x2m1c8r7t4z5a6`. Safe as a file name: it is checked to be
/// the prefix and lowercase letters or digits only.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CredentialId(String);

impl CredentialId {
    /// The fixed prefix of credential ids.
    pub const PREFIX: &'static str = "crd-";
    /// Number of random characters after the prefix.
    pub const BODY_LEN: usize = 20;

    /// A fresh random id.
    pub fn generate() -> Self {
        let mut rng = rand::thread_rng();
        let body: String = (0..Self::BODY_LEN)
            .map(|_| ID_ALPHABET[rng.gen_range(0..ID_ALPHABET.len())] as char)
            .collect();
        Self(format!("{}{body}", Self::PREFIX))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn check(s: &str) -> Result<(), ValidationError> {
        let body = s
            .strip_prefix(Self::PREFIX)
            .ok_or(ValidationError::CredentialId)?;
        if body.len() != Self::BODY_LEN
            || !body
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(ValidationError::CredentialId);
        }
        Ok(())
    }
}

impl FromStr for CredentialId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, ValidationError> {
        Self::check(s)?;
        Ok(Self(s.to_owned()))
    }
}

impl TryFrom<String> for CredentialId {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        Self::check(&s)?;
        Ok(Self(s))
    }
}

impl From<CredentialId> for String {
    fn from(id: CredentialId) -> String {
        id.0
    }
}

impl fmt::Display for CredentialId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest credential name.
pub const MAX_NAME_LEN: usize = 64;

/// What a credential is called, e.g. `github` or `OPENAI_API_KEY`: unique within its scope.
/// Resolution works per name (the most specific scope wins), and placeholders are per name, so
/// the same name at tenant and sandbox scope is one credential overridden, not two. The
/// charset makes a name usable as an environment variable name as is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CredentialName(String);

impl CredentialName {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn check(s: &str) -> Result<(), ValidationError> {
        let mut bytes = s.bytes();
        let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
        if !first_ok
            || s.len() > MAX_NAME_LEN
            || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ValidationError::Name);
        }
        Ok(())
    }
}

impl FromStr for CredentialName {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, ValidationError> {
        Self::check(s)?;
        Ok(Self(s.to_owned()))
    }
}

impl TryFrom<String> for CredentialName {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        Self::check(&s)?;
        Ok(Self(s))
    }
}

impl From<CredentialName> for String {
    fn from(name: CredentialName) -> String {
        name.0
    }
}

impl fmt::Display for CredentialName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest project id.
pub const MAX_PROJECT_ID_LEN: usize = 64;

/// A project within a tenant, e.g. `apollo`. SPACE has no project entity yet; this is the
/// checked name the control plane passes along with a sandbox (move it to `space-core` when
/// projects become a shared concept).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProjectId(String);

impl ProjectId {
    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn check(s: &str) -> Result<(), ValidationError> {
        let mut bytes = s.bytes();
        let first_ok = bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !first_ok
            || s.len() > MAX_PROJECT_ID_LEN
            || !bytes
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(ValidationError::ProjectId);
        }
        Ok(())
    }
}

impl FromStr for ProjectId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, ValidationError> {
        Self::check(s)?;
        Ok(Self(s.to_owned()))
    }
}

impl TryFrom<String> for ProjectId {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        Self::check(&s)?;
        Ok(Self(s))
    }
}

impl From<ProjectId> for String {
    fn from(id: ProjectId) -> String {
        id.0
    }
}

impl fmt::Display for ProjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who a credential belongs to, from the broadest to the most specific: every sandbox of a
/// tenant, the sandboxes of one project of a tenant, or one sandbox. For a given name the most
/// specific scope that covers a request wins (sandbox > project > tenant).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Scope {
    /// Every sandbox of the tenant.
    Tenant {
        /// The owner.
        tenant: TenantId,
    },
    /// The tenant's sandboxes that belong to this project.
    Project {
        /// The owner.
        tenant: TenantId,
        /// The project.
        project: ProjectId,
    },
    /// One sandbox of the tenant.
    Sandbox {
        /// The owner.
        tenant: TenantId,
        /// The sandbox.
        sandbox: SandboxId,
    },
}

impl Scope {
    /// The tenant that owns the credential, whatever the scope.
    pub fn tenant(&self) -> &TenantId {
        match self {
            Scope::Tenant { tenant }
            | Scope::Project { tenant, .. }
            | Scope::Sandbox { tenant, .. } => tenant,
        }
    }

    /// How specific the scope is: 0 for tenant, 1 for project, 2 for sandbox. Higher wins.
    pub fn specificity(&self) -> u8 {
        match self {
            Scope::Tenant { .. } => 0,
            Scope::Project { .. } => 1,
            Scope::Sandbox { .. } => 2,
        }
    }

    /// Whether a sandbox of `tenant` (in `project`, if any) called `sandbox` is covered.
    /// The tenant must always match: a credential never crosses tenants.
    pub fn covers(
        &self,
        tenant: &TenantId,
        project: Option<&ProjectId>,
        sandbox: &SandboxId,
    ) -> bool {
        match self {
            Scope::Tenant { tenant: t } => t == tenant,
            Scope::Project {
                tenant: t,
                project: p,
            } => t == tenant && project == Some(p),
            Scope::Sandbox {
                tenant: t,
                sandbox: s,
            } => t == tenant && s == sandbox,
        }
    }
}

/// `tenant:tnt-…`, `project:tnt-…/apollo` or `sandbox:tnt-…/sbx-…` (the form credential
/// helpers receive on their `scope=` line).
impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Tenant { tenant } => write!(f, "tenant:{tenant}"),
            Scope::Project { tenant, project } => write!(f, "project:{tenant}/{project}"),
            Scope::Sandbox { tenant, sandbox } => write!(f, "sandbox:{tenant}/{sandbox}"),
        }
    }
}

/// A credential's metadata: everything but the value. Unknown fields are refused when
/// deserialising: a field this version does not know might be a restriction it would
/// otherwise silently ignore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// Stable id (also the file name in the encrypted store).
    pub id: CredentialId,
    /// Name, unique within the scope.
    pub name: CredentialName,
    /// Who may use it.
    pub scope: Scope,
    /// Where and how it is injected.
    pub rule: CredentialRule,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// After this instant (milliseconds since the Unix epoch) every request that would use the
    /// credential is denied. `None`: never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

impl Credential {
    /// Checks every field (the rule included). Metadata read from disk or received from the
    /// API is validated before it is used.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.created_at_ms < 0 {
            return Err(ValidationError::Timestamps("created_at_ms is negative"));
        }
        if let Some(expires) = self.expires_at_ms {
            if expires <= self.created_at_ms {
                return Err(ValidationError::Timestamps(
                    "expires_at_ms is not after created_at_ms",
                ));
            }
        }
        self.rule.compile().map(drop)
    }

    /// Whether the credential has expired at `now_ms` (expiry is inclusive: at the instant
    /// itself it is already expired).
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_some_and(|e| now_ms >= e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        let id = CredentialId::generate();
        assert_eq!(id.as_str().parse::<CredentialId>(), Ok(id.clone()));
        assert_eq!(id.as_str().len(), 24);
        for bad in [
            "",
            "crd-",
            "crd-../../../../../etc/passwd",
            "crd-ABCDEFGHIJ0123456789",
            "sbx-abcdefghij0123456789",
            "crd-abcdefghij012345678/",
        ] {
            assert!(bad.parse::<CredentialId>().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<CredentialId>("\"crd-x\"").is_err());
    }

    #[test]
    fn names_are_checked() {
        for good in ["github", "OPENAI_API_KEY", "a", "x-1_2"] {
            assert!(good.parse::<CredentialName>().is_ok(), "{good}");
        }
        let long = "a".repeat(MAX_NAME_LEN + 1);
        for bad in ["", "1abc", "-x", "a b", "a.b", "é", "a/b", long.as_str()] {
            assert!(bad.parse::<CredentialName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn project_ids_are_checked() {
        assert!("apollo-2".parse::<ProjectId>().is_ok());
        assert!("Apollo".parse::<ProjectId>().is_err());
        assert!("".parse::<ProjectId>().is_err());
        assert!("a/b".parse::<ProjectId>().is_err());
    }

    #[test]
    fn credentials_deserialise_strictly() {
        let t = TenantId::generate();
        let json = format!(
            r#"{{"id":"crd-abcdefghij0123456789","name":"github","scope":{{"kind":"tenant","tenant":"{t}"}},
               "rule":{{"hosts":["api.github.com"],"injection":{{"kind":"header","name":"Authorization","template":"Bearer {{}}"}}}},
               "created_at_ms":1}}"#
        );
        let c: Credential = serde_json::from_str(&json).unwrap();
        assert!(c.validate().is_ok());
        assert_eq!(c.scope, Scope::Tenant { tenant: t.clone() });
        let extra = json.replacen(
            "\"created_at_ms\":1",
            "\"created_at_ms\":1,\"shiny\":true",
            1,
        );
        assert!(serde_json::from_str::<Credential>(&extra).is_err());
        let scope_extra = json.replacen(
            "\"kind\":\"tenant\"",
            "\"kind\":\"tenant\",\"project\":\"x\"",
            1,
        );
        assert!(serde_json::from_str::<Credential>(&scope_extra).is_err());
        let mut expired = c.clone();
        expired.expires_at_ms = Some(1);
        assert!(expired.validate().is_err());
        expired.expires_at_ms = Some(10);
        assert!(!expired.is_expired(9));
        assert!(expired.is_expired(10));
    }

    #[test]
    fn scopes_cover_their_sandboxes_and_never_another_tenant() {
        let t1 = TenantId::generate();
        let t2 = TenantId::generate();
        let p: ProjectId = "apollo".parse().unwrap();
        let s = SandboxId::generate();
        let other = SandboxId::generate();
        let tenant = Scope::Tenant { tenant: t1.clone() };
        let project = Scope::Project {
            tenant: t1.clone(),
            project: p.clone(),
        };
        let sandbox = Scope::Sandbox {
            tenant: t1.clone(),
            sandbox: s.clone(),
        };
        assert!(tenant.covers(&t1, None, &s));
        assert!(!tenant.covers(&t2, None, &s));
        assert!(project.covers(&t1, Some(&p), &s));
        assert!(!project.covers(&t1, None, &s));
        assert!(!project.covers(&t2, Some(&p), &s));
        assert!(sandbox.covers(&t1, None, &s));
        assert!(!sandbox.covers(&t1, None, &other));
        assert!(!sandbox.covers(&t2, None, &s));
        assert!(tenant.specificity() < project.specificity());
        assert!(project.specificity() < sandbox.specificity());
        assert_eq!(project.to_string(), format!("project:{t1}/apollo"));
    }
}

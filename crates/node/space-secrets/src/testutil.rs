//! Helpers shared by the unit tests.

use space_core::id::TenantId;

use crate::egress::Hostname;
use crate::model::{Credential, CredentialId, Scope};
use crate::rule::{CredentialRule, Injection};

pub fn host(s: &str) -> Hostname {
    Hostname::parse(s).unwrap()
}

pub fn tenant() -> TenantId {
    TenantId::generate()
}

/// `Authorization: Bearer {}` to `hosts`, TLS required, nothing else restricted.
pub fn bearer_rule(hosts: &[&str]) -> CredentialRule {
    CredentialRule {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        methods: None,
        paths: None,
        injection: Injection::Header {
            name: "Authorization".into(),
            template: "Bearer {}".into(),
        },
        require_tls: true,
        rate_limit: None,
        placeholder: false,
        registries: Vec::new(),
    }
}

pub fn credential(name: &str, scope: Scope, rule: CredentialRule) -> Credential {
    Credential {
        id: CredentialId::generate(),
        name: name.parse().unwrap(),
        scope,
        rule,
        created_at_ms: 1_000,
        expires_at_ms: None,
    }
}

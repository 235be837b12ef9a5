//! The policy: [`EgressPolicy`], how its rules combine ([`EgressMode`]), and its
//! validation ([`EgressPolicyError`]), which deserialising always runs.

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

use super::rule::{EgressRule, MAX_PORT_RANGES_PER_RULE, MIN_PORT};

/// Most rules in one egress policy.
pub const MAX_EGRESS_RULES: usize = 512;

/// How rules combine (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EgressMode {
    /// No network: nothing leaves.
    #[default]
    None,
    /// Allowed iff an allow rule matches and no deny rule does.
    Allowlist,
    /// Allowed iff no deny rule matches.
    Denylist,
}

/// Why an egress policy was refused. Rule indexes are 0-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressPolicyError {
    /// More rules than [`MAX_EGRESS_RULES`].
    #[error("an egress policy has at most {MAX_EGRESS_RULES} rules, got {count}")]
    TooManyRules {
        /// How many it has.
        count: usize,
    },
    /// `ports: []`.
    #[error("rule {rule}: ports is an empty list, which would match nothing; leave it out to match any port")]
    EmptyPorts {
        /// Index of the rule.
        rule: usize,
    },
    /// More port ranges than [`MAX_PORT_RANGES_PER_RULE`].
    #[error("rule {rule}: at most {MAX_PORT_RANGES_PER_RULE} port ranges, got {count}")]
    TooManyPortRanges {
        /// Index of the rule.
        rule: usize,
        /// How many it has.
        count: usize,
    },
    /// A port range that is empty or includes port 0.
    #[error("rule {rule}: port range {start}-{end} is invalid (ports are {MIN_PORT} to 65535, and start must not exceed end)")]
    InvalidPortRange {
        /// Index of the rule.
        rule: usize,
        /// Its start.
        start: u16,
        /// Its end.
        end: u16,
    },
    /// `protocols: []`.
    #[error("rule {rule}: protocols is an empty list, which would match nothing; leave it out to match any protocol")]
    EmptyProtocols {
        /// Index of the rule.
        rule: usize,
    },
    /// `inspect` on a deny rule.
    #[error("rule {rule}: inspect applies to allow rules only")]
    InspectOnDeny {
        /// Index of the rule.
        rule: usize,
    },
    /// `inspect` on a rule that cannot match TCP.
    #[error(
        "rule {rule}: inspect applies to TCP (TLS/HTTP) connections, but the rule matches only UDP"
    )]
    InspectWithoutTcp {
        /// Index of the rule.
        rule: usize,
    },
    /// `pass_through` and `inspect` on one rule.
    #[error("rule {rule}: pass_through and inspect contradict each other; set one")]
    PassThroughAndInspect {
        /// Index of the rule.
        rule: usize,
    },
    /// `pass_through` on a deny rule or a CIDR rule.
    #[error("rule {rule}: pass_through applies to allow rules for a domain only (TLS is checked by its name)")]
    PassThroughWithoutName {
        /// Index of the rule.
        rule: usize,
    },
    /// `pass_through` on a rule that cannot match TCP.
    #[error(
        "rule {rule}: pass_through applies to TCP (TLS) connections, but the rule matches only UDP"
    )]
    PassThroughWithoutTcp {
        /// Index of the rule.
        rule: usize,
    },
    /// A CIDR whose address is not the network address.
    #[error("rule {rule}: {cidr} has host bits set; did you mean {network}?")]
    CidrHostBits {
        /// Index of the rule.
        rule: usize,
        /// The CIDR as written.
        cidr: IpNet,
        /// Its network.
        network: IpNet,
    },
    /// An IPv6 CIDR narrower than a range that embeds IPv4 addresses.
    #[error("rule {rule}: {cidr} lies inside an IPv6 range that embeds IPv4 addresses; write the IPv4 network {ipv4} instead (it also matches the embedded IPv6 forms)")]
    CidrInsideEmbedding {
        /// Index of the rule.
        rule: usize,
        /// The CIDR as written.
        cidr: IpNet,
        /// The IPv4 network it stands for.
        ipv4: Ipv4Net,
    },
}

/// A sandbox's egress policy. The default is mode `none`: no network.
///
/// JSON: `{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain":
/// "*.github.com"}, "ports": [{"start": 443, "end": 443}], "protocols": ["tcp"]}]}`.
/// Deserialising validates ([`EgressPolicy::validate`]) and refuses unknown fields.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
// `deny_unknown_fields` here only informs the OpenAPI schema; `UncheckedEgressPolicy` enforces it.
#[serde(try_from = "UncheckedEgressPolicy", deny_unknown_fields)]
pub struct EgressPolicy {
    /// How rules combine.
    pub mode: EgressMode,
    /// The rules, at most 512; indexes are reported in decisions and errors.
    #[serde(default)]
    pub rules: Vec<EgressRule>,
}

/// The wire form of an [`EgressPolicy`], before validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedEgressPolicy {
    mode: EgressMode,
    #[serde(default)]
    rules: Vec<EgressRule>,
}

impl TryFrom<UncheckedEgressPolicy> for EgressPolicy {
    type Error = EgressPolicyError;
    fn try_from(p: UncheckedEgressPolicy) -> Result<Self, EgressPolicyError> {
        let policy = EgressPolicy {
            mode: p.mode,
            rules: p.rules,
        };
        policy.validate()?;
        Ok(policy)
    }
}

impl EgressPolicy {
    /// Everything public, nothing else: denylist mode with no rules.
    pub fn allow_all_public() -> EgressPolicy {
        EgressPolicy {
            mode: EgressMode::Denylist,
            rules: Vec::new(),
        }
    }

    /// Checks the bounds: at most 512 rules; per rule, port lists of 1..=64 valid ranges,
    /// protocol lists not empty, `inspect` only on allow rules that can match TCP,
    /// `pass_through` only on allow domain rules that can match TCP and not with `inspect`, CIDRs
    /// written as their network and not inside an IPv4-embedding IPv6 range. Rules are
    /// allowed (and ignored) in mode `none`.
    pub fn validate(&self) -> Result<(), EgressPolicyError> {
        if self.rules.len() > MAX_EGRESS_RULES {
            return Err(EgressPolicyError::TooManyRules {
                count: self.rules.len(),
            });
        }
        self.rules
            .iter()
            .enumerate()
            .try_for_each(|(i, rule)| rule.validate(i))
    }
}

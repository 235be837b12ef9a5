//! Decisions on connections: [`EgressPolicy::decide`] judges the [`ConnectionFacts`] the
//! gateway gathers and returns a [`Decision`] with its [`DecisionReason`].

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::address::{address_class, AddressClass};
use super::hostname::Hostname;
use super::policy::{EgressMode, EgressPolicy};
use super::rule::{Destination, Protocol, RuleAction};

/// What the gateway knows about a connection it is about to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionFacts<'a> {
    /// The host name, when the gateway knows it: from a DNS answer it gave itself, the TLS
    /// SNI or the HTTP `Host` header. `None` for a connection to a bare address.
    pub host: Option<&'a Hostname>,
    /// The destination address. `None` only for a check before resolution: then CIDR rules
    /// and the non-public check cannot apply, and the gateway must decide again with the
    /// address before it connects.
    pub addr: Option<IpAddr>,
    /// The destination port.
    pub port: u16,
    /// The transport protocol.
    pub protocol: Protocol,
}

/// Why a connection was allowed or refused (for logs and audit; serialised with a `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DecisionReason {
    /// Refused: the policy's mode is `none`.
    ModeNone,
    /// Refused: the facts named neither a host nor an address.
    NoDestination,
    /// Refused by a deny rule (the first that matched).
    DeniedByRule {
        /// Index of the rule.
        rule: usize,
    },
    /// Refused: a non-public address no allow CIDR rule of its class unlocks.
    NonPublicAddress {
        /// The class of the destination address.
        class: AddressClass,
    },
    /// Refused: allowlist mode and no allow rule matched.
    DeniedByDefault,
    /// Allowed by an allow rule (the first that matched; for a non-public address, the first
    /// that unlocked it).
    AllowedByRule {
        /// Index of the rule.
        rule: usize,
    },
    /// Allowed: denylist mode, public destination, no rule matched.
    AllowedByDefault,
}

impl fmt::Display for DecisionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecisionReason::ModeNone => f.write_str("egress mode is none"),
            DecisionReason::NoDestination => f.write_str("no host name or address"),
            DecisionReason::DeniedByRule { rule } => write!(f, "denied by rule {rule}"),
            DecisionReason::NonPublicAddress { class } => {
                write!(f, "{class} address not allowed by a CIDR rule")
            }
            DecisionReason::DeniedByDefault => f.write_str("no allow rule matched"),
            DecisionReason::AllowedByRule { rule } => write!(f, "allowed by rule {rule}"),
            DecisionReason::AllowedByDefault => f.write_str("no deny rule matched"),
        }
    }
}

/// The verdict on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Decision {
    /// Whether the gateway may make the connection.
    pub allowed: bool,
    /// Whether the gateway should terminate TLS and check every request (only ever set
    /// when allowed, for TCP); see [`EgressPolicy::decide`].
    pub inspect: bool,
    /// Why.
    pub reason: DecisionReason,
}

impl Decision {
    fn deny(reason: DecisionReason) -> Decision {
        Decision {
            allowed: false,
            inspect: false,
            reason,
        }
    }
}

impl EgressPolicy {
    /// Whether an allowed TCP connection's TLS is terminated (see the module docs'
    /// *TLS termination*): a matching `inspect` rule says yes; otherwise the allow domain
    /// rules that match decide (no, only when every one of them asks for `pass_through`);
    /// when none matches, TLS is terminated only where a request's `Host` could name a
    /// host the connection's name does not: in `denylist` mode with deny domain rules.
    fn terminates(&self, conn: &ConnectionFacts<'_>) -> bool {
        let matching = || {
            self.rules
                .iter()
                .filter(|r| r.action == RuleAction::Allow && r.matches(conn))
        };
        if matching().any(|r| r.inspect) {
            return true;
        }
        let mut by_name = matching().filter(|r| r.allows_by_name()).peekable();
        if by_name.peek().is_some() {
            return !by_name.all(|r| r.pass_through);
        }
        self.mode == EgressMode::Denylist
            && self.rules.iter().any(|r| {
                r.action == RuleAction::Deny && matches!(r.destination, Destination::Domain(_))
            })
    }

    /// Decides one connection (see the module docs for the contract). Checks, in order:
    /// mode `none`; neither host nor address; the first matching deny rule; for a non-public
    /// address, the first allow CIDR rule that unlocks it; the first matching allow rule;
    /// the mode's default. With no address (a check before resolution) only domain rules can
    /// match: the gateway must decide again with the address before it connects.
    pub fn decide(&self, conn: &ConnectionFacts<'_>) -> Decision {
        if self.mode == EgressMode::None {
            return Decision::deny(DecisionReason::ModeNone);
        }
        if conn.host.is_none() && conn.addr.is_none() {
            return Decision::deny(DecisionReason::NoDestination);
        }
        let matching = |action: RuleAction| {
            self.rules
                .iter()
                .position(|r| r.action == action && r.matches(conn))
        };
        if let Some(rule) = matching(RuleAction::Deny) {
            return Decision::deny(DecisionReason::DeniedByRule { rule });
        }
        let allowed_by = match conn.addr.map(address_class) {
            Some(class) if !class.is_public() => {
                match self.rules.iter().position(|r| r.unlocks(conn, class)) {
                    Some(rule) => Some(rule),
                    None => return Decision::deny(DecisionReason::NonPublicAddress { class }),
                }
            }
            _ => matching(RuleAction::Allow),
        };
        let reason = match (allowed_by, self.mode) {
            (Some(rule), _) => DecisionReason::AllowedByRule { rule },
            (None, EgressMode::Denylist) => DecisionReason::AllowedByDefault,
            (None, EgressMode::Allowlist | EgressMode::None) => {
                return Decision::deny(DecisionReason::DeniedByDefault)
            }
        };
        let inspect = conn.protocol == Protocol::Tcp && self.terminates(conn);
        Decision {
            allowed: true,
            inspect,
            reason,
        }
    }
}

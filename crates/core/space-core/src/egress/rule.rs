//! The rules of a policy: [`EgressRule`], with its [`Destination`], ports and protocols;
//! whether a rule matches a connection or unlocks a non-public address, and whether it is
//! valid.

use std::fmt;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::address::{cidr_contains, embedded_ipv4_net, network_class, AddressClass};
use super::decision::ConnectionFacts;
use super::pattern::DomainPattern;
use super::policy::EgressPolicyError;

/// Most port ranges in one rule.
pub const MAX_PORT_RANGES_PER_RULE: usize = 64;
/// Lowest port a rule may name (port 0 is not a destination).
pub const MIN_PORT: u16 = 1;

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Allow (in allowlist mode), unlock a non-public network (CIDR), or ask for inspection.
    Allow,
    /// Refuse; always wins.
    Deny,
}

/// A transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// An inclusive range of destination ports, `start..=end` (one port: `start == end`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PortRange {
    /// First port, at least 1.
    pub start: u16,
    /// Last port, at least `start`.
    pub end: u16,
}

impl PortRange {
    /// The ports `start..=end` (checked by [`EgressPolicy::validate`](super::EgressPolicy::validate)).
    pub const fn new(start: u16, end: u16) -> PortRange {
        PortRange { start, end }
    }

    /// One port.
    pub const fn single(port: u16) -> PortRange {
        PortRange {
            start: port,
            end: port,
        }
    }

    /// Whether `port` is in the range.
    pub fn contains(self, port: u16) -> bool {
        self.start <= port && port <= self.end
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// What a rule is about: a host name pattern or an address block. Serialised as
/// `{"domain": "*.example.com"}` or `{"cidr": "10.0.0.0/8"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Destination {
    /// Matches connections whose host name the gateway knows and the pattern matches.
    Domain(DomainPattern),
    /// Matches connections to an address in the block (or an IPv6 address embedding one);
    /// the address must be the network address (no host bits set).
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = json!("10.0.0.0/8")))]
    Cidr(IpNet),
}

impl From<DomainPattern> for Destination {
    fn from(p: DomainPattern) -> Destination {
        Destination::Domain(p)
    }
}

impl From<IpNet> for Destination {
    fn from(net: IpNet) -> Destination {
        Destination::Cidr(net)
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Domain(p) => write!(f, "domain {p}"),
            Destination::Cidr(net) => write!(f, "cidr {net}"),
        }
    }
}

/// One rule of an egress policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EgressRule {
    /// Allow or deny.
    pub action: RuleAction,
    /// The host name pattern or address block.
    pub destination: Destination,
    /// Destination ports; absent = any port. At most 64 ranges, none empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<PortRange>>,
    /// Protocols; absent = any. Not an empty list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<Protocol>>,
    /// Allow rules only: make the gateway terminate TLS of matching (TCP) connections and
    /// check every request, even where it would not by default (a connection allowed by a
    /// CIDR rule, or by the `denylist` default). Not with `pass_through`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub inspect: bool,
    /// Allow *domain* rules only: TLS to a matching name passes through, checked by its SNI
    /// only, instead of being terminated and checked request by request. The weaker mode,
    /// for clients that pin certificates (or speak something other than HTTP over TLS): a
    /// name served by a shared front then reaches any name on that front. Not with
    /// `inspect`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pass_through: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl EgressRule {
    /// An allow rule for any port and protocol, without inspection.
    pub fn allow(destination: impl Into<Destination>) -> EgressRule {
        EgressRule {
            action: RuleAction::Allow,
            destination: destination.into(),
            ports: None,
            protocols: None,
            inspect: false,
            pass_through: false,
        }
    }

    /// A deny rule for any port and protocol.
    pub fn deny(destination: impl Into<Destination>) -> EgressRule {
        EgressRule {
            action: RuleAction::Deny,
            ..EgressRule::allow(destination)
        }
    }

    /// The same rule, for these ports only.
    pub fn with_ports(mut self, ports: impl IntoIterator<Item = PortRange>) -> EgressRule {
        self.ports = Some(ports.into_iter().collect());
        self
    }

    /// The same rule, for these protocols only.
    pub fn with_protocols(mut self, protocols: impl IntoIterator<Item = Protocol>) -> EgressRule {
        self.protocols = Some(protocols.into_iter().collect());
        self
    }

    /// The same rule, asking for inspection.
    pub fn inspected(mut self) -> EgressRule {
        self.inspect = true;
        self
    }

    /// The same rule, asking for TLS pass-through (checked by SNI only).
    pub fn passed_through(mut self) -> EgressRule {
        self.pass_through = true;
        self
    }

    /// Whether this is an allow rule for a host name pattern.
    pub(super) fn allows_by_name(&self) -> bool {
        self.action == RuleAction::Allow && matches!(self.destination, Destination::Domain(_))
    }

    fn port_matches(&self, port: u16) -> bool {
        self.ports
            .as_ref()
            .is_none_or(|ranges| ranges.iter().any(|r| r.contains(port)))
    }

    pub(super) fn protocol_matches(&self, protocol: Protocol) -> bool {
        self.protocols
            .as_ref()
            .is_none_or(|ps| ps.contains(&protocol))
    }

    /// Whether the rule matches the connection (destination, port and protocol).
    pub fn matches(&self, conn: &ConnectionFacts<'_>) -> bool {
        let destination = match &self.destination {
            Destination::Domain(p) => conn.host.is_some_and(|h| p.matches(h)),
            Destination::Cidr(net) => conn.addr.is_some_and(|a| cidr_contains(net, a)),
        };
        destination && self.port_matches(conn.port) && self.protocol_matches(conn.protocol)
    }

    /// Whether this allow rule unlocks the non-public destination of `conn`, of `class`.
    pub(super) fn unlocks(&self, conn: &ConnectionFacts<'_>, class: AddressClass) -> bool {
        match &self.destination {
            Destination::Cidr(net) => {
                self.action == RuleAction::Allow
                    && network_class(net) == Some(class)
                    && self.matches(conn)
            }
            Destination::Domain(_) => false,
        }
    }

    pub(super) fn validate(&self, rule: usize) -> Result<(), EgressPolicyError> {
        if let Some(ports) = &self.ports {
            if ports.is_empty() {
                return Err(EgressPolicyError::EmptyPorts { rule });
            }
            if ports.len() > MAX_PORT_RANGES_PER_RULE {
                return Err(EgressPolicyError::TooManyPortRanges {
                    rule,
                    count: ports.len(),
                });
            }
            if let Some(r) = ports.iter().find(|r| r.start < MIN_PORT || r.start > r.end) {
                return Err(EgressPolicyError::InvalidPortRange {
                    rule,
                    start: r.start,
                    end: r.end,
                });
            }
        }
        if self.protocols.as_ref().is_some_and(Vec::is_empty) {
            return Err(EgressPolicyError::EmptyProtocols { rule });
        }
        if self.inspect {
            if self.action != RuleAction::Allow {
                return Err(EgressPolicyError::InspectOnDeny { rule });
            }
            if !self.protocol_matches(Protocol::Tcp) {
                return Err(EgressPolicyError::InspectWithoutTcp { rule });
            }
        }
        if self.pass_through {
            if self.inspect {
                return Err(EgressPolicyError::PassThroughAndInspect { rule });
            }
            if !self.allows_by_name() {
                return Err(EgressPolicyError::PassThroughWithoutName { rule });
            }
            if !self.protocol_matches(Protocol::Tcp) {
                return Err(EgressPolicyError::PassThroughWithoutTcp { rule });
            }
        }
        if let Destination::Cidr(cidr) = &self.destination {
            let network = cidr.trunc();
            if network != *cidr {
                return Err(EgressPolicyError::CidrHostBits {
                    rule,
                    cidr: *cidr,
                    network,
                });
            }
            if let Some(ipv4) = embedded_ipv4_net(cidr) {
                return Err(EgressPolicyError::CidrInsideEmbedding {
                    rule,
                    cidr: *cidr,
                    ipv4,
                });
            }
        }
        Ok(())
    }
}

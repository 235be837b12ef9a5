//! The operator's ceiling over every egress policy ([`EgressCeiling`]): destinations that no
//! tenant, project or sandbox policy may open, whatever its rules say. By default the ceiling
//! forbids every non-public [`AddressClass`] (loopback, private, CGNAT, link-local, cloud
//! metadata, …) and the node's own addresses, whatever their class; the operator grants
//! networks back (an internal package mirror, say), and only the operator can.
//!
//! Two checks use it:
//! - [`EgressCeiling::check`], when a policy is set: a rule that could only ever reach what
//!   the ceiling forbids (an `allow` CIDR rule unlocking a non-public class outside every
//!   grant, or naming exactly a node address) is refused with the rule's index. A rule that
//!   merely *contains* forbidden space (`0.0.0.0/0`) is accepted: the ceiling carves that
//!   part out at the gateway.
//! - [`EgressCeiling::forbids`], for every connection the gateway is about to make, before the
//!   policy is asked: so a policy set before the ceiling changed cannot reach beyond it.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::address::{address_class, cidr_contains, network_class, AddressClass};
use super::policy::EgressPolicy;
use super::rule::{Destination, RuleAction};

/// Most networks an operator may grant.
pub const MAX_CEILING_GRANTS: usize = 256;

/// What the operator lets policies reach beyond public addresses, and what is the node's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressCeiling {
    /// Non-public networks the operator opens to tenants' `allow` CIDR rules.
    granted: Vec<IpNet>,
    /// The node's own addresses: forbidden, whatever their class, unless granted.
    node_addresses: Vec<IpAddr>,
}

/// Why a destination is beyond the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Forbidden {
    /// A non-public address class that no grant opens.
    Class {
        /// The class.
        class: AddressClass,
    },
    /// One of the node's own addresses.
    NodeAddress,
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Forbidden::Class { class } => write!(f, "{class} addresses"),
            Forbidden::NodeAddress => f.write_str("the node's own addresses"),
        }
    }
}

/// A policy rule that reaches only beyond the ceiling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rule {rule} ({network}) reaches {forbidden}, which the operator's egress ceiling forbids; \
     only the operator can grant them"
)]
pub struct BeyondCeiling {
    /// Index of the rule.
    pub rule: usize,
    /// Its network.
    pub network: IpNet,
    /// What it would reach.
    pub forbidden: Forbidden,
}

/// A grant the ceiling cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CeilingGrantError {
    #[error("{network} is public: grants open non-public networks only")]
    Public { network: IpNet },
    #[error("{network} is not written as its network address (write {truncated})")]
    NotANetwork { network: IpNet, truncated: IpNet },
    #[error("at most {MAX_CEILING_GRANTS} grants, not {count}")]
    TooMany { count: usize },
}

impl EgressCeiling {
    /// The ceiling of a node whose own addresses are `node_addresses`, with the operator's
    /// `granted` networks (each written as its network, non-public or holding a node address).
    pub fn new(
        granted: Vec<IpNet>,
        node_addresses: Vec<IpAddr>,
    ) -> Result<EgressCeiling, CeilingGrantError> {
        if granted.len() > MAX_CEILING_GRANTS {
            return Err(CeilingGrantError::TooMany {
                count: granted.len(),
            });
        }
        for network in &granted {
            if network.trunc() != *network {
                return Err(CeilingGrantError::NotANetwork {
                    network: *network,
                    truncated: network.trunc(),
                });
            }
            let holds_node = node_addresses.iter().any(|a| network.contains(a));
            if network_class(network).is_none() && !holds_node {
                return Err(CeilingGrantError::Public { network: *network });
            }
        }
        Ok(EgressCeiling {
            granted,
            node_addresses: node_addresses.iter().map(|a| a.to_canonical()).collect(),
        })
    }

    /// The non-public networks the operator granted.
    pub fn granted(&self) -> &[IpNet] {
        &self.granted
    }

    /// The node's own addresses.
    pub fn node_addresses(&self) -> &[IpAddr] {
        &self.node_addresses
    }

    /// Why the gateway must not connect to `addr`, if it must not. An IPv6 address embedding
    /// an IPv4 one is judged as that IPv4 address.
    pub fn forbids(&self, addr: IpAddr) -> Option<Forbidden> {
        if self.granted.iter().any(|net| cidr_contains(net, addr)) {
            return None;
        }
        // A node address is matched as a single-address network, as CIDR rules match: the
        // IPv6 forms embedding it included.
        if self
            .node_addresses
            .iter()
            .any(|a| cidr_contains(&IpNet::from(*a), addr))
        {
            return Some(Forbidden::NodeAddress);
        }
        let class = address_class(addr);
        (!class.is_public()).then_some(Forbidden::Class { class })
    }

    /// Refuses `policy` if one of its `allow` CIDR rules reaches only what the ceiling
    /// forbids (see the module docs). Deny rules and domain rules never reach beyond it.
    pub fn check(&self, policy: &EgressPolicy) -> Result<(), BeyondCeiling> {
        for (rule, r) in policy.rules.iter().enumerate() {
            let Destination::Cidr(network) = &r.destination else {
                continue;
            };
            if r.action != RuleAction::Allow || self.within_grant(network) {
                continue;
            }
            let beyond = |forbidden| BeyondCeiling {
                rule,
                network: *network,
                forbidden,
            };
            if let Some(class) = network_class(network) {
                return Err(beyond(Forbidden::Class { class }));
            }
            let single = network.prefix_len() == network.max_prefix_len();
            if single && self.forbids(network.addr()) == Some(Forbidden::NodeAddress) {
                return Err(beyond(Forbidden::NodeAddress));
            }
        }
        Ok(())
    }

    fn within_grant(&self, network: &IpNet) -> bool {
        self.granted.iter().any(|g| g.contains(network))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::{EgressMode, EgressRule};

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn allow(cidr: &str) -> EgressRule {
        EgressRule::allow(net(cidr))
    }

    fn policy(rules: Vec<EgressRule>) -> EgressPolicy {
        EgressPolicy {
            mode: EgressMode::Allowlist,
            rules,
        }
    }

    fn node() -> EgressCeiling {
        EgressCeiling::new(vec![], vec![ip("192.0.2.2"), ip("203.0.114.7")]).unwrap()
    }

    #[test]
    fn by_default_only_public_addresses_that_are_not_the_nodes_pass() {
        let c = node();
        assert_eq!(c.forbids(ip("1.1.1.1")), None);
        assert_eq!(
            c.forbids(ip("127.0.0.1")),
            Some(Forbidden::Class {
                class: AddressClass::Loopback
            })
        );
        assert_eq!(
            c.forbids(ip("169.254.169.254")),
            Some(Forbidden::Class {
                class: AddressClass::Metadata
            })
        );
        assert_eq!(
            c.forbids(ip("100.64.1.1")),
            Some(Forbidden::Class {
                class: AddressClass::SharedCgnat
            })
        );
        // A public address of the node, also written as IPv4-mapped IPv6.
        assert_eq!(c.forbids(ip("203.0.114.7")), Some(Forbidden::NodeAddress));
        assert_eq!(
            c.forbids(ip("::ffff:203.0.114.7")),
            Some(Forbidden::NodeAddress)
        );
        assert_eq!(c.forbids(ip("192.0.2.2")), Some(Forbidden::NodeAddress));
    }

    #[test]
    fn a_grant_opens_exactly_its_network() {
        let c = EgressCeiling::new(vec![net("10.1.2.0/24")], vec![ip("192.0.2.2")]).unwrap();
        assert_eq!(c.forbids(ip("10.1.2.9")), None);
        assert_eq!(c.forbids(ip("::ffff:10.1.2.9")), None);
        assert!(c.forbids(ip("10.1.3.9")).is_some());
        assert!(c.check(&policy(vec![allow("10.1.2.0/24")])).is_ok());
        assert!(c.check(&policy(vec![allow("10.1.2.8/29")])).is_ok());
        let err = c.check(&policy(vec![allow("10.0.0.0/8")])).unwrap_err();
        assert_eq!(err.rule, 0);
        assert_eq!(
            err.forbidden,
            Forbidden::Class {
                class: AddressClass::Private
            }
        );
    }

    #[test]
    fn rules_that_only_reach_beyond_are_refused_with_their_index() {
        let c = node();
        for (cidr, forbidden) in [
            (
                "127.0.0.1/32",
                Forbidden::Class {
                    class: AddressClass::Loopback,
                },
            ),
            (
                "169.254.169.254/32",
                Forbidden::Class {
                    class: AddressClass::Metadata,
                },
            ),
            ("203.0.114.7/32", Forbidden::NodeAddress),
            (
                "192.0.2.0/24",
                Forbidden::Class {
                    class: AddressClass::Documentation,
                },
            ),
        ] {
            let p = policy(vec![allow("1.2.3.0/24"), allow(cidr)]);
            let err = c.check(&p).unwrap_err();
            assert_eq!((err.rule, err.forbidden), (1, forbidden), "{cidr}");
            assert!(err.to_string().contains("rule 1"), "{err}");
        }
        // Containing forbidden space is not reaching only it: the gateway carves it out.
        assert!(c
            .check(&policy(vec![allow("0.0.0.0/0"), allow("::/0")]))
            .is_ok());
        // Deny rules never reach anything.
        let deny = EgressRule::deny(net("127.0.0.1/32"));
        assert!(c.check(&policy(vec![deny])).is_ok());
    }

    #[test]
    fn grants_are_checked() {
        let nodes = vec![ip("203.0.114.7")];
        assert!(matches!(
            EgressCeiling::new(vec![net("8.8.8.0/24")], nodes.clone()),
            Err(CeilingGrantError::Public { .. })
        ));
        // The node's own public address may be granted (a service the operator runs there).
        let c = EgressCeiling::new(vec![net("203.0.114.7/32")], nodes.clone()).unwrap();
        assert_eq!(c.forbids(ip("203.0.114.7")), None);
        assert!(matches!(
            EgressCeiling::new(vec![net("10.1.2.3/8")], nodes.clone()),
            Err(CeilingGrantError::NotANetwork { .. })
        ));
        let many = vec![net("10.0.0.0/8"); MAX_CEILING_GRANTS + 1];
        assert!(matches!(
            EgressCeiling::new(many, nodes),
            Err(CeilingGrantError::TooMany { .. })
        ));
    }
}

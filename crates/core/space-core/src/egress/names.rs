//! Names the resolver answers: [`EgressPolicy::allows_name`], whether some connection to a
//! name could be allowed by name, so that the gateway's resolver may resolve it.

use super::hostname::Hostname;
use super::policy::{EgressMode, EgressPolicy};
use super::rule::{Destination, Protocol, RuleAction, MIN_PORT};

/// Every port a rule can name, as an inclusive range.
const ALL_PORTS: (u32, u32) = (MIN_PORT as u32, u16::MAX as u32);

impl EgressPolicy {
    /// Whether the resolver should resolve `host`: could some connection to it, on some port
    /// and protocol, be allowed by name? In denylist mode: unless deny domain rules cover
    /// every port of both protocols for it. In allowlist mode: only if an allow *domain* rule
    /// matches it on some port and protocol that deny domain rules leave open (CIDR rules
    /// never make a name resolvable). Never in mode `none`. Addresses are not considered:
    /// [`EgressPolicy::decide`] still judges each connection.
    pub fn allows_name(&self, host: &Hostname) -> bool {
        let allow_any_port = match self.mode {
            EgressMode::None => return false,
            EgressMode::Allowlist => false,
            EgressMode::Denylist => true,
        };
        [Protocol::Tcp, Protocol::Udp].into_iter().any(|protocol| {
            let mut allowed = Vec::new();
            let mut denied = Vec::new();
            if allow_any_port {
                allowed.push(ALL_PORTS);
            }
            for rule in &self.rules {
                let Destination::Domain(pattern) = &rule.destination else {
                    continue;
                };
                if !pattern.matches(host) || !rule.protocol_matches(protocol) {
                    continue;
                }
                let ranges = match rule.action {
                    RuleAction::Allow => &mut allowed,
                    RuleAction::Deny => &mut denied,
                };
                match &rule.ports {
                    None => ranges.push(ALL_PORTS),
                    Some(ports) => {
                        ranges.extend(ports.iter().map(|p| (u32::from(p.start), u32::from(p.end))))
                    }
                }
            }
            !covers(&mut denied, &allowed)
        })
    }
}

/// Whether the union of the inclusive ranges `cover` includes every port of every range in
/// `ranges` (true when `ranges` is empty).
pub(super) fn covers(cover: &mut [(u32, u32)], ranges: &[(u32, u32)]) -> bool {
    cover.sort_unstable();
    ranges.iter().all(|&(start, end)| {
        // The first port of this range not yet known to be covered.
        let mut next = start;
        for &(s, e) in cover.iter() {
            if next > end || s > next {
                break;
            }
            next = next.max(e + 1);
        }
        next > end
    })
}

//! E2B's network options as a SPACE egress policy.
//!
//! E2B allows all outbound traffic unless told otherwise: `allow_internet_access: false`
//! blocks it, `network.denyOut` lists CIDRs (or `0.0.0.0/0`, everything) to block and
//! `network.allowOut` lists CIDRs, addresses or domain names allowed *in spite of* the deny
//! list. SPACE's policy is an allowlist or a denylist in which deny always wins, so:
//! - `allow_internet_access: false` → mode `none`;
//! - `denyOut` covering everything (`0.0.0.0/0`) → an allowlist of `allowOut`;
//! - `denyOut` of some blocks and no `allowOut` → a denylist of those blocks;
//! - `allow_internet_access: true` alone → a denylist with no rules (every public address);
//! - nothing said → `None`: the tenant's default egress policy, else the node's, applies
//!   (an operator's choice is not overridden by an SDK default);
//! - `allowOut` punching holes in a partial `denyOut` cannot be expressed with deny-wins
//!   rules and is refused rather than approximated.

use serde::Deserialize;
use serde_json::{json, Value};
use space_core::egress::EgressPolicy;
use space_core::sandbox::PublicPorts;

/// The `network` object of a create request (other fields are refused by the caller).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// Destinations allowed (CIDR, address or domain name, `*.` wildcards).
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// Destinations blocked (CIDR or address).
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// `true`: every port of the sandbox is public (host routes need no credential).
    /// Absent or `false`: SPACE's default, private ports (the traffic token or an API key of
    /// the tenant), where E2B's default is public.
    #[serde(default)]
    pub allow_public_traffic: Option<bool>,
}

/// The public ports E2B's options ask for: all with `allowPublicTraffic: true`, else none.
pub fn public_ports(network: Option<&NetworkConfig>) -> PublicPorts {
    match network.and_then(|n| n.allow_public_traffic) {
        Some(true) => PublicPorts::All,
        _ => PublicPorts::None,
    }
}

/// The CIDR that means "all IPv4 traffic" in E2B's SDKs (`ALL_TRAFFIC`).
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// The egress policy for E2B's options; `Ok(None)` = the tenant's or node's default.
pub fn egress_policy(
    allow_internet_access: Option<bool>,
    network: Option<&NetworkConfig>,
) -> Result<Option<EgressPolicy>, String> {
    if allow_internet_access == Some(false) {
        return parse(json!({"mode": "none"})).map(Some);
    }
    let net = network.cloned().unwrap_or_default();
    let denies_all = net.deny_out.iter().any(|d| d.trim() == ALL_TRAFFIC);
    if denies_all {
        let rules: Vec<Value> = net
            .allow_out
            .iter()
            .map(|d| rule("allow", d))
            .collect::<Result<_, _>>()?;
        return parse(json!({"mode": "allowlist", "rules": rules})).map(Some);
    }
    if !net.deny_out.is_empty() {
        if !net.allow_out.is_empty() {
            return Err("network: allowOut can only be combined with a denyOut of 0.0.0.0/0 (SPACE's deny rules always win)".into());
        }
        let rules: Vec<Value> = net
            .deny_out
            .iter()
            .map(|d| rule("deny", d))
            .collect::<Result<_, _>>()?;
        return parse(json!({"mode": "denylist", "rules": rules})).map(Some);
    }
    // allowOut alone narrows nothing in E2B (everything is allowed already).
    if allow_internet_access == Some(true) || network.is_some() {
        return parse(json!({"mode": "denylist", "rules": []})).map(Some);
    }
    Ok(None)
}

/// One rule for a destination as E2B writes it: `10.0.0.0/8`, `8.8.8.8`, `example.com`,
/// `*.example.com`.
fn rule(action: &str, dest: &str) -> Result<Value, String> {
    let dest = dest.trim();
    let destination = if let Ok(addr) = dest.parse::<std::net::IpAddr>() {
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        json!({"cidr": format!("{addr}/{bits}")})
    } else if dest.contains('/') {
        json!({"cidr": dest})
    } else {
        json!({"domain": dest})
    };
    Ok(json!({"action": action, "destination": destination}))
}

fn parse(v: Value) -> Result<EgressPolicy, String> {
    serde_json::from_value(v).map_err(|e| format!("network: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_core::egress::EgressMode;

    fn net(allow: &[&str], deny: &[&str]) -> NetworkConfig {
        NetworkConfig {
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            allow_public_traffic: None,
        }
    }

    #[test]
    fn e2b_options_map_onto_egress_modes() {
        assert_eq!(egress_policy(None, None), Ok(None));
        let none = egress_policy(Some(false), Some(&net(&["a.com"], &[]))).unwrap();
        assert_eq!(none.unwrap().mode, EgressMode::None);
        let open = egress_policy(Some(true), None).unwrap().unwrap();
        assert_eq!((open.mode, open.rules.len()), (EgressMode::Denylist, 0));
        let allow = egress_policy(
            None,
            Some(&net(&["*.github.com", "8.8.8.8"], &[ALL_TRAFFIC])),
        )
        .unwrap()
        .unwrap();
        assert_eq!((allow.mode, allow.rules.len()), (EgressMode::Allowlist, 2));
        let deny = egress_policy(None, Some(&net(&[], &["203.0.113.0/24"])))
            .unwrap()
            .unwrap();
        assert_eq!((deny.mode, deny.rules.len()), (EgressMode::Denylist, 1));
        assert!(egress_policy(None, Some(&net(&["a.com"], &["10.0.0.0/8"]))).is_err());
        assert!(egress_policy(None, Some(&net(&["not a name!"], &[ALL_TRAFFIC]))).is_err());
    }
}

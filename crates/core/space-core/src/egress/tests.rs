//! Tests of the egress policy, one file per module of it, and the helpers they share.

use std::net::IpAddr;

use super::{Destination, DomainPattern, EgressMode, EgressPolicy, EgressRule, Hostname};

mod address;
mod decision;
mod hostname;
mod names;
mod pattern;
mod policy;

fn host(s: &str) -> Hostname {
    Hostname::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn domain(s: &str) -> Destination {
    Destination::Domain(DomainPattern::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}")))
}

fn cidr(s: &str) -> Destination {
    Destination::Cidr(s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}")))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn policy(mode: EgressMode, rules: Vec<EgressRule>) -> EgressPolicy {
    let p = EgressPolicy { mode, rules };
    p.validate().unwrap_or_else(|e| panic!("{e}"));
    p
}

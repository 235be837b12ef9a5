//! The firewall of a sandbox's network namespace, as one nftables ruleset (pure: built here,
//! applied by [`super::netns`]).
//!
//! Two tables, both default-deny:
//! - `netdev space_guest`, on the TAP's ingress: the guest may only send IPv4 and ARP from
//!   its own MAC and address (no spoofing, no IPv6 at all, no VLAN tricks);
//! - `inet space_gateway`: every TCP connection the guest opens, whatever its destination,
//!   is redirected to the gateway proxy; DNS (UDP and TCP) is accepted only to the gateway's
//!   resolver; every other UDP datagram is handed, unchanged, to the gateway's UDP relay
//!   by TPROXY (marked, and routed locally by the namespace's policy routing), which lets
//!   out only what a CIDR rule allows ([`crate::udp`]); nothing else reaches the namespace,
//!   and nothing is forwarded anywhere (ICMP tunnels, TCP to the gateway's other ports, DoT
//!   to an outside resolver all die here, or in the proxy).

use std::borrow::Cow;
use std::net::Ipv4Addr;

use nftables::expr::{Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField};
use nftables::schema::{Chain, NfCmd, NfListObject, NfObject, Nftables, Rule, Table};
use nftables::stmt::{Mangle, Match, Operator, Statement, TProxy, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::GuestLink;

/// Name of the L2 table (netdev family, on the TAP).
pub const GUEST_TABLE: &str = "space_guest";
/// Name of the L3/L4 table (inet family: IPv4 and IPv6 alike).
pub const GATEWAY_TABLE: &str = "space_gateway";

/// The whole ruleset for one sandbox namespace: deletes nothing (the namespace is new).
pub fn ruleset(link: &GuestLink) -> Nftables<'static> {
    let mut objects = Vec::new();
    objects.extend(guest_table(link));
    objects.extend(gateway_table(link));
    Nftables {
        objects: Cow::Owned(objects),
    }
}

fn add(o: NfListObject<'static>) -> NfObject<'static> {
    NfObject::CmdObject(NfCmd::Add(o))
}

fn table(family: NfFamily, name: &'static str) -> NfObject<'static> {
    add(NfListObject::Table(Table {
        family,
        name: Cow::Borrowed(name),
        handle: None,
    }))
}

struct BaseChain {
    family: NfFamily,
    table: &'static str,
    name: &'static str,
    kind: NfChainType,
    hook: NfHook,
    prio: i32,
    dev: Option<String>,
    policy: NfChainPolicy,
}

fn chain(c: BaseChain) -> NfObject<'static> {
    add(NfListObject::Chain(Chain {
        family: c.family,
        table: Cow::Borrowed(c.table),
        name: Cow::Borrowed(c.name),
        newname: None,
        handle: None,
        _type: Some(c.kind),
        hook: Some(c.hook),
        prio: Some(c.prio),
        dev: c.dev.map(Cow::Owned),
        policy: Some(c.policy),
    }))
}

fn rule(
    family: NfFamily,
    table: &'static str,
    chain: &'static str,
    comment: &'static str,
    expr: Vec<Statement<'static>>,
) -> NfObject<'static> {
    add(NfListObject::Rule(Rule {
        family,
        table: Cow::Borrowed(table),
        chain: Cow::Borrowed(chain),
        expr: Cow::Owned(expr),
        handle: None,
        index: None,
        comment: Some(Cow::Borrowed(comment)),
    }))
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: Cow::Borrowed(protocol),
            field: Cow::Borrowed(field),
        },
    )))
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn text(s: impl Into<String>) -> Expression<'static> {
    Expression::String(Cow::Owned(s.into()))
}

fn is(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

fn is_not(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::NEQ,
    })
}

fn addr(a: Ipv4Addr) -> Expression<'static> {
    text(a.to_string())
}

fn ports(p: &[u16]) -> Expression<'static> {
    Expression::Named(NamedExpression::Set(
        p.iter()
            .map(|&p| nftables::expr::SetItem::Element(Expression::Number(u32::from(p))))
            .collect(),
    ))
}

fn drop() -> Statement<'static> {
    Statement::Drop(None)
}

fn accept() -> Statement<'static> {
    Statement::Accept(None)
}

/// L2 on the TAP: own MAC, own address, IPv4 and ARP only.
fn guest_table(link: &GuestLink) -> Vec<NfObject<'static>> {
    const F: NfFamily = NfFamily::NetDev;
    const C: &str = "ingress";
    let mac = link.guest_mac_text();
    vec![
        table(F, GUEST_TABLE),
        chain(BaseChain {
            family: F,
            table: GUEST_TABLE,
            name: C,
            kind: NfChainType::Filter,
            hook: NfHook::Ingress,
            prio: -500,
            dev: Some(link.tap.clone()),
            policy: NfChainPolicy::Drop,
        }),
        rule(
            F,
            GUEST_TABLE,
            C,
            "spoofed source MAC",
            vec![is_not(payload("ether", "saddr"), text(mac)), drop()],
        ),
        rule(
            F,
            GUEST_TABLE,
            C,
            "ARP for the guest's own address only",
            vec![
                is(payload("ether", "type"), text("arp")),
                is(payload("arp", "saddr ip"), addr(link.guest)),
                accept(),
            ],
        ),
        rule(
            F,
            GUEST_TABLE,
            C,
            "IPv4 from the guest's own address only",
            vec![
                is(payload("ether", "type"), text("ip")),
                is(payload("ip", "saddr"), addr(link.guest)),
                accept(),
            ],
        ),
        // Everything else (IPv6, spoofed IPv4 or ARP, VLAN-tagged frames): the policy drops it.
    ]
}

/// L3/L4 inside the namespace: TCP to the proxy, DNS to the resolver, nothing else.
/// Firewall mark of guest UDP handed to the relay.
pub const UDP_RELAY_MARK: u32 = 0x5350;
/// Routing table that delivers marked packets locally.
pub const UDP_RELAY_ROUTE_TABLE: u32 = 100;

fn gateway_table(link: &GuestLink) -> Vec<NfObject<'static>> {
    const F: NfFamily = NfFamily::INet;
    let t = GATEWAY_TABLE;
    let from_guest = || is(meta(MetaKey::Iifname), text(link.tap.clone()));
    let to_gateway = || is(payload("ip", "daddr"), addr(link.gateway));
    vec![
        table(F, t),
        chain(BaseChain {
            family: F,
            table: t,
            name: "prerouting",
            kind: NfChainType::NAT,
            hook: NfHook::Prerouting,
            prio: -100,
            dev: None,
            policy: NfChainPolicy::Accept,
        }),
        rule(
            F,
            t,
            "prerouting",
            "every guest TCP connection goes to the gateway proxy",
            vec![
                from_guest(),
                is(meta(MetaKey::L4proto), text("tcp")),
                is_not(payload("ip", "daddr"), addr(link.gateway)),
                Statement::Redirect(Some(NAT {
                    addr: None,
                    family: None,
                    port: Some(Expression::Number(u32::from(link.proxy_port))),
                    flags: None,
                })),
            ],
        ),
        chain(BaseChain {
            family: F,
            table: t,
            name: "udp_relay",
            kind: NfChainType::Filter,
            hook: NfHook::Prerouting,
            prio: -150,
            dev: None,
            policy: NfChainPolicy::Accept,
        }),
        rule(
            F,
            t,
            "udp_relay",
            "guest UDP but DNS to the gateway goes, unchanged, to the UDP relay (which decides)",
            vec![
                from_guest(),
                is(meta(MetaKey::L4proto), text("udp")),
                is_not(payload("ip", "daddr"), addr(link.gateway)),
                Statement::Mangle(Mangle {
                    key: meta(MetaKey::Mark),
                    value: Expression::Number(UDP_RELAY_MARK),
                }),
                Statement::TProxy(TProxy {
                    family: Some("ip".into()),
                    port: link.udp_relay_port,
                    addr: Some(link.gateway.to_string().into()),
                }),
            ],
        ),
        chain(BaseChain {
            family: F,
            table: t,
            name: "input",
            kind: NfChainType::Filter,
            hook: NfHook::Input,
            prio: 0,
            dev: None,
            policy: NfChainPolicy::Drop,
        }),
        rule(
            F,
            t,
            "input",
            "the gateway's own loopback",
            vec![is(meta(MetaKey::Iifname), text("lo")), accept()],
        ),
        rule(
            F,
            t,
            "input",
            "DNS over UDP to the gateway resolver",
            vec![
                from_guest(),
                to_gateway(),
                is(payload("udp", "dport"), Expression::Number(53)),
                accept(),
            ],
        ),
        rule(
            F,
            t,
            "input",
            "guest UDP the TPROXY rule handed to the relay",
            vec![
                from_guest(),
                is(meta(MetaKey::Mark), Expression::Number(UDP_RELAY_MARK)),
                is(meta(MetaKey::L4proto), text("udp")),
                accept(),
            ],
        ),
        rule(
            F,
            t,
            "input",
            "DNS over TCP, and the redirected connections, to the gateway",
            vec![
                from_guest(),
                to_gateway(),
                is(payload("tcp", "dport"), ports(&[53, link.proxy_port])),
                accept(),
            ],
        ),
        chain(BaseChain {
            family: F,
            table: t,
            name: "forward",
            kind: NfChainType::Filter,
            hook: NfHook::Forward,
            prio: 0,
            dev: None,
            policy: NfChainPolicy::Drop,
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_is_default_deny_and_names_the_guest() {
        let link = GuestLink::default();
        let json = serde_json::to_string(&ruleset(&link)).expect("serialise");
        // Both filter tables drop by default; nothing is forwarded.
        assert_eq!(json.matches(r#""policy":"drop""#).count(), 3, "{json}");
        assert!(json.contains(&link.guest_mac_text()));
        assert!(json.contains(r#""10.0.2.15""#));
        assert!(json.contains(r#""redirect":{"port":15001}"#), "{json}");
        // Parses back (the crate's schema is the one nft speaks).
        let back: Nftables = serde_json::from_str(&json).expect("parse");
        assert_eq!(back.objects.len(), ruleset(&link).objects.len());
    }
}

//! Address classes: what kind of destination an IP address is ([`address_class`]), the
//! IPv6 forms that embed an IPv4 address ([`embedded_ipv4`]), and what the CIDR rules need
//! from them (the class of a whole network, matching embedded addresses).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

/// What kind of destination an IP address is. Everything but [`AddressClass::Public`] is
/// refused unless an `allow` CIDR rule of the same class unlocks it (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AddressClass {
    /// Globally routable unicast.
    Public,
    /// `0.0.0.0/8` ("this network"; Linux connects `0.0.0.0` to the local host) and `::`.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918 (`10/8`, `172.16/12`, `192.168/16`), unique local `fc00::/7`, and the
    /// deprecated site-local `fec0::/10`.
    Private,
    /// Shared address space for carrier-grade NAT, `100.64.0.0/10` (RFC 6598).
    SharedCgnat,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// Cloud instance metadata and credential endpoints: `169.254.169.254` (AWS, GCP, Azure,
    /// OCI, …), `169.254.170.2` (AWS ECS task credentials), `fd00:ec2::254` (AWS IMDS over
    /// IPv6), `100.100.100.200` (Alibaba Cloud), `192.0.0.192` (Oracle Cloud). More specific
    /// than the range each lies in, so a rule for that range does not unlock it.
    Metadata,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// Everything else that is not globally routable unicast: `192.0.0.0/24`,
    /// `192.88.99.0/24`, `240.0.0.0/4`; in IPv6 all of `2001::/23` (IETF protocol
    /// assignments, Teredo included), `64:ff9b:1::/48` (local-use NAT64), `100::/64`
    /// (discard) and everything outside `2000::/3` not listed above (unassigned by IANA).
    Reserved,
}

impl AddressClass {
    /// Whether this is globally routable unicast, reachable without an explicit rule.
    pub fn is_public(self) -> bool {
        self == AddressClass::Public
    }

    /// The snake_case name, as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressClass::Public => "public",
            AddressClass::Unspecified => "unspecified",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::SharedCgnat => "shared_cgnat",
            AddressClass::LinkLocal => "link_local",
            AddressClass::Metadata => "metadata",
            AddressClass::Multicast => "multicast",
            AddressClass::Broadcast => "broadcast",
            AddressClass::Documentation => "documentation",
            AddressClass::Benchmarking => "benchmarking",
            AddressClass::Reserved => "reserved",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a range of the IPv6 table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V6Kind {
    /// A class of its own.
    Class(AddressClass),
    /// Embeds an IPv4 address in its low 32 bits (mapped, compatible, translated, NAT64).
    EmbedLow32,
    /// 6to4: embeds an IPv4 address in bits 16..48.
    Embed6to4,
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> u32 {
    u32::from_be_bytes([a, b, c, d])
}

#[allow(clippy::too_many_arguments)]
const fn v6(a: u16, b: u16, c: u16, d: u16, e: u16, f: u16, g: u16, h: u16) -> u128 {
    Ipv6Addr::new(a, b, c, d, e, f, g, h).to_bits()
}

/// The IPv4 ranges that are not public, as (network, prefix length, class). Lookups pick
/// the most specific range containing the address or network; nothing listed = public.
const V4_RANGES: &[(u32, u8, AddressClass)] = {
    use AddressClass::*;
    &[
        (v4(0, 0, 0, 0), 8, Unspecified),
        (v4(10, 0, 0, 0), 8, Private),
        (v4(100, 64, 0, 0), 10, SharedCgnat),
        (v4(100, 100, 100, 200), 32, Metadata),
        (v4(127, 0, 0, 0), 8, Loopback),
        (v4(169, 254, 0, 0), 16, LinkLocal),
        (v4(169, 254, 169, 254), 32, Metadata),
        (v4(169, 254, 170, 2), 32, Metadata),
        (v4(172, 16, 0, 0), 12, Private),
        (v4(192, 0, 0, 0), 24, Reserved),
        (v4(192, 0, 0, 192), 32, Metadata),
        (v4(192, 0, 2, 0), 24, Documentation),
        (v4(192, 88, 99, 0), 24, Reserved),
        (v4(192, 168, 0, 0), 16, Private),
        (v4(198, 18, 0, 0), 15, Benchmarking),
        (v4(198, 51, 100, 0), 24, Documentation),
        (v4(203, 0, 113, 0), 24, Documentation),
        (v4(224, 0, 0, 0), 4, Multicast),
        (v4(240, 0, 0, 0), 4, Reserved),
        (v4(255, 255, 255, 255), 32, Broadcast),
    ]
};

/// The IPv6 ranges that are not plain public, most specific wins; nothing listed = public
/// (which leaves only `2000::/3` minus the ranges below).
const V6_RANGES: &[(u128, u8, V6Kind)] = {
    use AddressClass::*;
    use V6Kind::*;
    &[
        (v6(0, 0, 0, 0, 0, 0, 0, 0), 128, Class(Unspecified)),
        (v6(0, 0, 0, 0, 0, 0, 0, 1), 128, Class(Loopback)),
        (v6(0, 0, 0, 0, 0, 0, 0, 0), 96, EmbedLow32),
        (v6(0, 0, 0, 0, 0, 0xffff, 0, 0), 96, EmbedLow32),
        (v6(0, 0, 0, 0, 0xffff, 0, 0, 0), 96, EmbedLow32),
        (v6(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96, EmbedLow32),
        (v6(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48, Class(Reserved)),
        (v6(0x100, 0, 0, 0, 0, 0, 0, 0), 64, Class(Reserved)),
        (v6(0, 0, 0, 0, 0, 0, 0, 0), 3, Class(Reserved)),
        (v6(0x2001, 0, 0, 0, 0, 0, 0, 0), 23, Class(Reserved)),
        (v6(0x2001, 2, 0, 0, 0, 0, 0, 0), 48, Class(Benchmarking)),
        (
            v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
            32,
            Class(Documentation),
        ),
        (v6(0x2002, 0, 0, 0, 0, 0, 0, 0), 16, Embed6to4),
        (v6(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20, Class(Documentation)),
        (v6(0x4000, 0, 0, 0, 0, 0, 0, 0), 2, Class(Reserved)),
        (v6(0x8000, 0, 0, 0, 0, 0, 0, 0), 2, Class(Reserved)),
        (v6(0xc000, 0, 0, 0, 0, 0, 0, 0), 3, Class(Reserved)),
        (v6(0xe000, 0, 0, 0, 0, 0, 0, 0), 4, Class(Reserved)),
        (v6(0xf000, 0, 0, 0, 0, 0, 0, 0), 5, Class(Reserved)),
        (v6(0xf800, 0, 0, 0, 0, 0, 0, 0), 6, Class(Reserved)),
        (v6(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, Class(Private)),
        (
            v6(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
            128,
            Class(Metadata),
        ),
        (v6(0xfe00, 0, 0, 0, 0, 0, 0, 0), 9, Class(Reserved)),
        (v6(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, Class(LinkLocal)),
        (v6(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, Class(Private)),
        (v6(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, Class(Multicast)),
    ]
};

/// Every range of the address classes above but public, as networks: what the uplink guard
/// refuses below the decisions (see `space_net::datapath::uplink_guard`). The IPv6 ranges
/// that embed an IPv4 address are included whole (the guard cannot judge the embedded one).
pub fn non_public_networks() -> Vec<IpNet> {
    let v4 = V4_RANGES
        .iter()
        .map(|&(bits, len, _)| IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::from_bits(bits), len)));
    let v6 = V6_RANGES.iter().map(|&(bits, len, _)| {
        IpNet::V6(ipnet::Ipv6Net::new_assert(Ipv6Addr::from_bits(bits), len))
    });
    v4.chain(v6).collect()
}

/// The most specific IPv4 range containing the network `bits/prefix`.
fn lookup_v4(bits: u32, prefix: u8) -> Option<AddressClass> {
    V4_RANGES
        .iter()
        .filter(|&&(net, len, _)| len <= prefix && mask_v4(bits, len) == net)
        .max_by_key(|&&(_, len, _)| len)
        .map(|&(_, _, class)| class)
}

/// The most specific IPv6 range containing the network `bits/prefix`, with its length.
fn lookup_v6(bits: u128, prefix: u8) -> Option<(V6Kind, u8)> {
    V6_RANGES
        .iter()
        .filter(|&&(net, len, _)| len <= prefix && mask_v6(bits, len) == net)
        .max_by_key(|&&(_, len, _)| len)
        .map(|&(_, len, kind)| (kind, len))
}

fn mask_v4(bits: u32, prefix: u8) -> u32 {
    bits & u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask_v6(bits: u128, prefix: u8) -> u128 {
    bits & u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

/// The IPv4 address an IPv6 address embeds: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
/// `::a.b.c.d` (but not `::` or `::1`), IPv4-translated `::ffff:0:a.b.c.d`, NAT64
/// `64:ff9b::a.b.c.d`, 6to4 `2002:aabb:ccdd::/48`.
pub fn embedded_ipv4(addr: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = addr.to_bits();
    match lookup_v6(bits, 128)?.0 {
        V6Kind::EmbedLow32 => Some(Ipv4Addr::from_bits(bits as u32)),
        V6Kind::Embed6to4 => Some(Ipv4Addr::from_bits((bits >> 80) as u32)),
        V6Kind::Class(_) => None,
    }
}

/// What kind of destination `ip` is. An IPv6 address embedding an IPv4 address (see
/// [`embedded_ipv4`]) has the class of the IPv4 address: `::ffff:127.0.0.1` is loopback.
pub fn address_class(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(a) => lookup_v4(a.to_bits(), 32).unwrap_or(AddressClass::Public),
        IpAddr::V6(a) => match lookup_v6(a.to_bits(), 128) {
            None => AddressClass::Public,
            Some((V6Kind::Class(class), _)) => class,
            Some(_) => match embedded_ipv4(a) {
                Some(v4) => address_class(IpAddr::V4(v4)),
                None => AddressClass::Reserved,
            },
        },
    }
}

/// The non-public class a whole network lies in (the most specific range containing all
/// of it), or `None` when it lies in public space, spans several classes, or is an IPv6
/// range embedding IPv4 addresses of any class.
pub(super) fn network_class(net: &IpNet) -> Option<AddressClass> {
    let class = match net {
        IpNet::V4(n) => lookup_v4(n.network().to_bits(), n.prefix_len())?,
        IpNet::V6(n) => match lookup_v6(n.network().to_bits(), n.prefix_len())? {
            (V6Kind::Class(class), _) => class,
            _ => return None,
        },
    };
    (!class.is_public()).then_some(class)
}

/// For an IPv6 network strictly inside a range that embeds IPv4, the IPv4 network it
/// stands for.
pub(super) fn embedded_ipv4_net(net: &IpNet) -> Option<Ipv4Net> {
    let IpNet::V6(n) = net else { return None };
    let bits = n.network().to_bits();
    let prefix = n.prefix_len();
    let (kind, len) = lookup_v6(bits, prefix)?;
    if prefix <= len {
        return None;
    }
    let (addr, v4_prefix) = match kind {
        V6Kind::EmbedLow32 => (bits as u32, prefix - 96),
        V6Kind::Embed6to4 => ((bits >> 80) as u32, prefix.min(48) - 16),
        V6Kind::Class(_) => return None,
    };
    Ipv4Net::new(Ipv4Addr::from_bits(addr), v4_prefix)
        .ok()
        .map(|n| n.trunc())
}

/// Whether a CIDR contains `addr` or the IPv4 address it embeds.
pub(super) fn cidr_contains(net: &IpNet, addr: IpAddr) -> bool {
    if net.contains(&addr) {
        return true;
    }
    match addr {
        IpAddr::V6(a) => embedded_ipv4(a).is_some_and(|v4| net.contains(&IpAddr::V4(v4))),
        IpAddr::V4(_) => false,
    }
}

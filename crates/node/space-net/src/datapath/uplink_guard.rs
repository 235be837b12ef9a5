//! The uplink guard: the kernel's own refusal of what the egress ceiling forbids, under the
//! gateway's decisions (issue 12, item 1).
//!
//! The gateway decides every connection (policy, ceiling) in user space, and its uplink
//! checks the ceiling again before connecting. The guard is the layer below both, so that
//! a bug in either is not enough to reach the node: the uplink's sockets are made by the
//! node manager (root) with a firewall mark ([`marked_socket`]), and an nftables table in
//! the uplink namespace ([`script`]) rejects every marked packet whose destination
//! - lies in a non-public range ([`space_core::egress::non_public_networks`]: loopback,
//!   private, CGNAT, link-local, metadata, multicast, reserved, …; IPv6 outside `2000::/3`,
//!   and the IPv4-embedding ranges whole), or
//! - is one of the node's own addresses (the ceiling's list, as the decisions use it),
//!
//! unless it lies in a network the operator granted (`--egress-grant`), which is accepted
//! first. A TCP connect is reset (`ECONNREFUSED` at once), anything else dropped (the
//! sender's `send` fails with `EPERM`). Unmarked sockets — the node's own connections to its database, object store or
//! KMS — are untouched. The table is replaced in one nftables transaction.
//!
//! The guard refuses somewhat more than the decision does: IPv6 addresses that embed an
//! IPv4 one (NAT64 `64:ff9b::/96`, 6to4 `2002::/16`, IPv4-compatible) are refused outright
//! rather than judged by the address they embed.

use std::fmt::Write as _;
use std::os::fd::OwnedFd;
use std::process::Command;

use ipnet::IpNet;
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType};
use serde::{Deserialize, Serialize};

use super::NetError;

/// What kind of socket the uplink asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UplinkSocketKind {
    /// TCP over IPv4.
    Tcp4,
    /// TCP over IPv6.
    Tcp6,
    /// UDP over IPv4.
    Udp4,
    /// UDP over IPv6.
    Udp6,
}

impl UplinkSocketKind {
    /// The kind for a destination and a transport.
    pub fn of(addr: &std::net::SocketAddr, tcp: bool) -> Self {
        match (addr.is_ipv4(), tcp) {
            (true, true) => Self::Tcp4,
            (false, true) => Self::Tcp6,
            (true, false) => Self::Udp4,
            (false, false) => Self::Udp6,
        }
    }
}

/// A new, unconnected, non-blocking socket of `kind` carrying firewall mark `mark` (needs
/// `CAP_NET_ADMIN`), in the calling thread's network namespace.
pub fn marked_socket(kind: UplinkSocketKind, mark: u32) -> std::io::Result<OwnedFd> {
    let (family, ty) = match kind {
        UplinkSocketKind::Tcp4 => (AddressFamily::Inet, SockType::Stream),
        UplinkSocketKind::Tcp6 => (AddressFamily::Inet6, SockType::Stream),
        UplinkSocketKind::Udp4 => (AddressFamily::Inet, SockType::Datagram),
        UplinkSocketKind::Udp6 => (AddressFamily::Inet6, SockType::Datagram),
    };
    let fd = socket::socket(
        family,
        ty,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::Mark, &mark)?;
    Ok(fd)
}

/// Makes marked sockets in one namespace, in this process (which needs `CAP_NET_ADMIN`,
/// and `CAP_SYS_ADMIN` to enter another namespace): the node manager's way of serving
/// [`crate::uplink::UplinkSockets`]. For another namespace a thread of its own stays in it,
/// so a socket costs a round trip to that thread, not a thread.
pub struct MarkedSockets {
    mark: u32,
    /// Requests to the thread inside the namespace; `None`: this thread's namespace.
    worker: Option<std::sync::Mutex<std::sync::mpsc::Sender<SocketOrder>>>,
}

type SocketOrder = (
    UplinkSocketKind,
    std::sync::mpsc::Sender<std::io::Result<OwnedFd>>,
);

impl MarkedSockets {
    /// Sockets marked `mark` in namespace `netns` (`None`: the caller's).
    pub fn new(netns: Option<&str>, mark: u32) -> Result<Self, NetError> {
        let Some(name) = netns else {
            return Ok(MarkedSockets { mark, worker: None });
        };
        let (tx, rx) = std::sync::mpsc::channel::<SocketOrder>();
        // The thread enters the namespace once and serves orders until every sender is gone.
        super::netns::spawn_in(name, move || {
            while let Ok((kind, reply)) = rx.recv() {
                let _ = reply.send(marked_socket(kind, mark));
            }
        })?;
        Ok(MarkedSockets {
            mark,
            worker: Some(std::sync::Mutex::new(tx)),
        })
    }

    /// A new socket of `kind`.
    pub fn socket(&self, kind: UplinkSocketKind) -> std::io::Result<OwnedFd> {
        let Some(worker) = &self.worker else {
            return marked_socket(kind, self.mark);
        };
        let (tx, rx) = std::sync::mpsc::channel();
        worker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send((kind, tx))
            .map_err(|_| std::io::Error::other("the uplink socket thread ended"))?;
        rx.recv()
            .map_err(|_| std::io::Error::other("the uplink socket thread ended"))?
    }
}

impl crate::uplink::UplinkSockets for MarkedSockets {
    fn socket(&self, kind: UplinkSocketKind) -> std::io::Result<OwnedFd> {
        MarkedSockets::socket(self, kind)
    }
}

/// What the guard forbids: every non-public range, and each of `node_addresses`.
pub fn forbidden_networks(node_addresses: &[std::net::IpAddr]) -> Vec<IpNet> {
    let mut out = space_core::egress::non_public_networks();
    out.extend(node_addresses.iter().map(|a| IpNet::from(*a)));
    out
}

/// The nftables script that (re)defines table `inet {table}` guarding sockets marked
/// `mark`: `granted` accepted, then `forbidden` rejected.
pub fn script(table: &str, mark: u32, forbidden: &[IpNet], granted: &[IpNet]) -> String {
    let set = |nets: &[IpNet], v4: bool| -> String {
        let elements: Vec<String> = nets
            .iter()
            .filter(|n| matches!(n, IpNet::V4(_)) == v4)
            .map(|n| n.trunc().to_string())
            .collect();
        if elements.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", elements.join(", "))
        }
    };
    let mut s = String::new();
    // Adding first makes the delete valid whether or not the table exists: one transaction.
    let _ = writeln!(s, "add table inet {table}");
    let _ = writeln!(s, "delete table inet {table}");
    let _ = writeln!(s, "table inet {table} {{");
    for (name, ty, nets, v4) in [
        ("granted4", "ipv4_addr", granted, true),
        ("granted6", "ipv6_addr", granted, false),
        ("forbidden4", "ipv4_addr", forbidden, true),
        ("forbidden6", "ipv6_addr", forbidden, false),
    ] {
        let _ = writeln!(
            s,
            "  set {name} {{ type {ty}; flags interval; auto-merge;{} }}",
            set(nets, v4)
        );
    }
    let _ = writeln!(
        s,
        "  chain output {{\n    type filter hook output priority filter; policy accept;\n    \
         meta mark != {mark:#010x} accept\n    \
         ip daddr @granted4 accept\n    \
         ip6 daddr @granted6 accept\n    \
         ip daddr @forbidden4 reject with tcp reset\n    \
         ip daddr @forbidden4 drop\n    \
         ip6 daddr @forbidden6 reject with tcp reset\n    \
         ip6 daddr @forbidden6 drop\n  }}"
    );
    let _ = writeln!(s, "}}");
    s
}

/// Loads `script` into the namespace `netns` (`None`: the caller's own).
pub fn apply(netns: Option<&str>, script: &str) -> Result<(), NetError> {
    let mut cmd = match netns {
        Some(name) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", name, "nft", "-f", "-"]);
            c
        }
        None => {
            let mut c = Command::new("nft");
            c.args(["-f", "-"]);
            c
        }
    };
    super::netns::run_with_input(&mut cmd, script.as_bytes(), "nft")
}

/// Removes the table from the namespace (nothing if it is not there).
pub fn remove(netns: Option<&str>, table: &str) -> Result<(), NetError> {
    apply(
        netns,
        &format!("add table inet {table}\ndelete table inet {table}\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_accepts_grants_first_and_rejects_local_and_forbidden() {
        let forbidden: Vec<IpNet> = [
            "10.0.0.0/8",
            "169.254.0.0/16",
            "169.254.169.254/32",
            "fc00::/7",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let granted: Vec<IpNet> = vec!["10.1.2.3/24".parse().unwrap()];
        let s = script("space_uplink_ab12", 0x5ace_1234, &forbidden, &granted);
        assert!(s.starts_with(
            "add table inet space_uplink_ab12\ndelete table inet space_uplink_ab12\n"
        ));
        assert!(s.contains("set granted4 { type ipv4_addr; flags interval; auto-merge; elements = { 10.1.2.0/24 }; }"), "{s}");
        assert!(
            s.contains("set granted6 { type ipv6_addr; flags interval; auto-merge; }"),
            "{s}"
        );
        assert!(
            s.contains("elements = { 10.0.0.0/8, 169.254.0.0/16, 169.254.169.254/32 }"),
            "{s}"
        );
        assert!(s.contains("elements = { fc00::/7 }"), "{s}");
        assert!(s.contains("meta mark != 0x5ace1234 accept"), "{s}");
        let order: Vec<usize> = ["@granted4 accept", "@granted6 accept", "@forbidden4 reject"]
            .iter()
            .map(|needle| s.find(needle).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{s}");
    }
}

//! The gateway's UDP relay: the way out for UDP (other than DNS to the gateway) that the
//! sandbox's policy allows, and only that.
//!
//! The namespace's firewall hands every other guest UDP datagram, unchanged, to the relay's
//! socket with TPROXY ([`crate::datapath`]); the relay learns the address the guest sent it
//! to (`IP_ORIGDSTADDR`) and decides. UDP carries no name the gateway could check (QUIC's is
//! encrypted, and a resolved name's address may be shared with names the policy denies: the
//! CDN bypass of the seeds), so **only CIDR rules allow UDP**: the decision is made for the
//! bare address ([`decide`]). An allowed flow gets a socket of its own on each side: in the
//! uplink namespace, connected to the destination; in the sandbox's, bound (transparently)
//! to the destination and connected to the guest, so replies reach the guest from the
//! address it wrote to, and the guest's later datagrams of the flow arrive there directly.
//! Flows end when idle, when the policy stops allowing them, or with the relay. Bounded:
//! flows per sandbox, datagram size; nothing is buffered beyond one datagram per direction.

use std::collections::HashSet;
use std::io::IoSliceMut;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::socket::{
    self, sockopt, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrIn,
};
use space_core::egress::{
    ConnectionFacts, Destination, EgressMode, EgressPolicy, Protocol, RuleAction,
};
use space_core::SandboxId;
use tokio::net::UdpSocket;

use crate::dns::PolicyHandle;
use crate::proxy::Uplink;

/// Bounds of one sandbox's relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpLimits {
    /// Flows at once; a new one beyond is dropped.
    pub max_flows: usize,
    /// A flow with no datagram either way for this long ends.
    pub idle: Duration,
}

impl Default for UdpLimits {
    fn default() -> Self {
        UdpLimits {
            max_flows: 128,
            idle: Duration::from_secs(60),
        }
    }
}

/// Largest datagram relayed (IPv4's limit); a larger one cannot exist.
const MAX_DATAGRAM: usize = 65_535;

/// Whether a guest datagram to `dst` may leave, and why not. UDP carries no name the
/// gateway can check, so it needs an allow rule naming the address by CIDR (in any mode:
/// a denylist of names cannot be enforced on UDP, so it does not open UDP either), and the
/// policy's own decision for the bare address (deny rules, non-public addresses).
pub fn decide(policy: &EgressPolicy, dst: SocketAddr) -> Result<(), String> {
    let facts = ConnectionFacts {
        host: None,
        addr: Some(dst.ip()),
        port: dst.port(),
        protocol: Protocol::Udp,
    };
    let named = policy.mode != EgressMode::None
        && policy.rules.iter().any(|r| {
            r.action == RuleAction::Allow
                && matches!(r.destination, Destination::Cidr(_))
                && r.matches(&facts)
        });
    if !named {
        return Err("no allow rule names this address by CIDR for UDP".into());
    }
    let decision = policy.decide(&facts);
    if decision.allowed {
        Ok(())
    } else {
        Err(format!("{:?}", decision.reason))
    }
}

/// One guest flow: the guest's port and where it wrote to.
type FlowKey = (u16, SocketAddrV4);

/// Opens the guest side of a flow: a transparent UDP socket inside the sandbox's namespace,
/// bound to the address the guest wrote to and connected to the guest's port
/// ([`flow_socket`], run in that namespace). Entering a namespace and `IP_TRANSPARENT`
/// need privilege, so the relay asks whoever has it: the node manager.
pub trait FlowSockets: Send + Sync {
    /// The socket of a flow from `guest` to `dst`.
    fn open(&self, dst: SocketAddrV4, guest: SocketAddrV4) -> std::io::Result<std::net::UdpSocket>;
}

/// The guest side of a flow (see [`FlowSockets`]), in the calling thread's namespace: call
/// it inside [`crate::datapath::netns::run_in`].
pub fn flow_socket(dst: SocketAddrV4, guest: SocketAddrV4) -> std::io::Result<std::net::UdpSocket> {
    let fd = transparent_socket()?;
    socket::bind(fd.as_raw_fd(), &SockaddrIn::from(dst))?;
    socket::connect(fd.as_raw_fd(), &SockaddrIn::from(guest))?;
    Ok(std::net::UdpSocket::from(fd))
}

/// A sandbox's UDP relay.
pub struct UdpRelay {
    sandbox: SandboxId,
    sockets: Arc<dyn FlowSockets>,
    policy: PolicyHandle,
    uplink: Arc<dyn Uplink>,
    limits: UdpLimits,
    /// The flows open now (each is served by its own task, which owns its sockets).
    flows: Mutex<HashSet<FlowKey>>,
}

/// The relay's transparent socket on `addr` (the address the firewall's TPROXY rule
/// names), in the calling thread's namespace: call it inside [`crate::datapath::netns::run_in`].
pub fn listener(addr: SocketAddrV4) -> std::io::Result<OwnedFd> {
    let fd = transparent_socket()?;
    socket::setsockopt(&fd, sockopt::Ipv4OrigDstAddr, &true)?;
    socket::bind(fd.as_raw_fd(), &SockaddrIn::from(addr))?;
    Ok(fd)
}

/// A non-blocking UDP socket that may use addresses that are not local (IP_TRANSPARENT).
fn transparent_socket() -> std::io::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::IpTransparent, &true)?;
    // Every flow to one destination binds that same address and port (each connected to
    // its own guest port).
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    Ok(fd)
}

impl UdpRelay {
    /// A relay for `sandbox`, whose flows' sockets `sockets` opens in its namespace.
    pub fn new(
        sandbox: SandboxId,
        sockets: Arc<dyn FlowSockets>,
        policy: PolicyHandle,
        uplink: Arc<dyn Uplink>,
        limits: UdpLimits,
    ) -> Self {
        UdpRelay {
            sandbox,
            sockets,
            policy,
            uplink,
            limits,
            flows: Mutex::new(HashSet::new()),
        }
    }

    fn flows(&self) -> std::sync::MutexGuard<'_, HashSet<FlowKey>> {
        self.flows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Flows open now.
    pub fn flow_count(&self) -> usize {
        self.flows().len()
    }

    /// Serves the listener (from [`listener`]) until the task is aborted.
    pub async fn serve(self: Arc<Self>, listener: OwnedFd) {
        let listener = match UdpSocket::from_std(std::net::UdpSocket::from(listener)) {
            Ok(l) => l,
            Err(error) => {
                tracing::warn!(sandbox = %self.sandbox, %error, "udp relay: cannot register its socket");
                return;
            }
        };
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let received = listener
                .async_io(tokio::io::Interest::READABLE, || {
                    recv_with_dst(listener.as_raw_fd(), &mut buf)
                })
                .await;
            match received {
                Ok((len, from, dst)) => self.first_datagram(from, dst, &buf[..len]).await,
                Err(error) => {
                    tracing::debug!(sandbox = %self.sandbox, %error, "udp relay: receive failed")
                }
            }
        }
    }

    /// A datagram the listener got: the first of a new flow (or one that raced the flow's
    /// own socket into existence).
    async fn first_datagram(self: &Arc<Self>, from: SocketAddrV4, dst: SocketAddrV4, data: &[u8]) {
        let key = (from.port(), dst);
        if self.flows().contains(&key) {
            // The flow exists; its upstream socket is private to its task, so this early
            // datagram is dropped (UDP may lose datagrams; the guest retries).
            return;
        }
        if let Err(reason) = decide(&self.policy.load(), SocketAddr::V4(dst)) {
            tracing::debug!(sandbox = %self.sandbox, %dst, %reason, "egress: udp denied");
            return;
        }
        if self.flows().len() >= self.limits.max_flows {
            tracing::debug!(sandbox = %self.sandbox, %dst, "egress: udp flow limit reached");
            return;
        }
        match self.open_flow(from, dst).await {
            Ok((guest_side, upstream)) => {
                if let Err(error) = upstream.send(data).await {
                    tracing::debug!(sandbox = %self.sandbox, %dst, %error, "egress: udp send failed");
                }
                self.flows().insert(key);
                let relay = Arc::clone(self);
                tokio::spawn(async move {
                    relay.run_flow(&guest_side, &upstream, dst).await;
                    relay.flows().remove(&key);
                });
                tracing::debug!(sandbox = %self.sandbox, %dst, "egress: udp flow opened");
            }
            Err(error) => {
                tracing::debug!(sandbox = %self.sandbox, %dst, %error, "egress: udp flow failed")
            }
        }
    }

    async fn open_flow(
        &self,
        guest: SocketAddrV4,
        dst: SocketAddrV4,
    ) -> std::io::Result<(UdpSocket, UdpSocket)> {
        let upstream = self.uplink.udp(SocketAddr::V4(dst)).await?;
        let sockets = self.sockets.clone();
        let guest_side = tokio::task::spawn_blocking(move || sockets.open(dst, guest))
            .await
            .map_err(std::io::Error::other)??;
        Ok((UdpSocket::from_std(guest_side)?, upstream))
    }

    /// Moves datagrams both ways until the flow is idle, the policy no longer allows it, or
    /// a socket fails.
    async fn run_flow(&self, guest: &UdpSocket, upstream: &UdpSocket, dst: SocketAddrV4) {
        let mut from_guest = vec![0u8; MAX_DATAGRAM];
        let mut from_upstream = vec![0u8; MAX_DATAGRAM];
        loop {
            let step = tokio::time::timeout(self.limits.idle, async {
                tokio::select! {
                    r = guest.recv(&mut from_guest) => {
                        let n = r?;
                        // The policy may have changed since the flow opened.
                        if let Err(reason) = decide(&self.policy.load(), SocketAddr::V4(dst)) {
                            return Err(std::io::Error::other(format!("no longer allowed: {reason}")));
                        }
                        upstream.send(&from_guest[..n]).await.map(drop)
                    }
                    r = upstream.recv(&mut from_upstream) => {
                        let n = r?;
                        guest.send(&from_upstream[..n]).await.map(drop)
                    }
                }
            })
            .await;
            match step {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::debug!(sandbox = %self.sandbox, %dst, %error, "egress: udp flow ended");
                    return;
                }
                Err(_idle) => return,
            }
        }
    }
}

/// One datagram and the address it was sent to (from `IP_ORIGDSTADDR`).
fn recv_with_dst(
    fd: std::os::fd::RawFd,
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddrV4, SocketAddrV4)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(nix::libc::sockaddr_in);
    let msg = socket::recvmsg::<SockaddrIn>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty())
        .map_err(std::io::Error::from)?;
    let from = msg
        .address
        .map(|a| SocketAddrV4::new(a.ip(), a.port()))
        .ok_or_else(|| std::io::Error::other("datagram without a source"))?;
    let mut dst = None;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::Ipv4OrigDstAddr(a) = c {
            dst = Some(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            ));
        }
    }
    let dst = dst.ok_or_else(|| std::io::Error::other("datagram without its destination"))?;
    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
        return Err(std::io::Error::other("datagram truncated"));
    }
    Ok((msg.bytes, from, dst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_core::egress::{EgressMode, EgressRule, PortRange};

    fn cidr(c: &str) -> space_core::egress::Destination {
        space_core::egress::Destination::Cidr(c.parse().unwrap())
    }

    #[test]
    fn udp_leaves_only_by_cidr_rules() {
        let dst: SocketAddr = "203.0.113.7:443".parse().unwrap();
        let domain_only = EgressPolicy {
            mode: EgressMode::Allowlist,
            rules: vec![EgressRule::allow(
                space_core::egress::DomainPattern::parse("example.com").unwrap(),
            )],
        };
        assert!(
            decide(&domain_only, dst).is_err(),
            "a name never allows UDP"
        );
        let by_cidr = EgressPolicy {
            mode: EgressMode::Allowlist,
            rules: vec![EgressRule::allow(cidr("203.0.113.0/24"))
                .with_protocols([Protocol::Udp])
                .with_ports([PortRange {
                    start: 443,
                    end: 443,
                }])],
        };
        assert!(decide(&by_cidr, dst).is_ok());
        assert!(decide(&by_cidr, "203.0.113.7:53".parse().unwrap()).is_err());
        assert!(decide(&by_cidr, "198.51.100.1:443".parse().unwrap()).is_err());
        let tcp_only = EgressPolicy {
            mode: EgressMode::Allowlist,
            rules: vec![EgressRule::allow(cidr("203.0.113.0/24")).with_protocols([Protocol::Tcp])],
        };
        assert!(decide(&tcp_only, dst).is_err());
        // A denylist of names opens no UDP: it could not be enforced on it.
        let denylist = EgressPolicy {
            mode: EgressMode::Denylist,
            rules: vec![EgressRule::deny(
                space_core::egress::DomainPattern::parse("evil.example").unwrap(),
            )],
        };
        assert!(decide(&denylist, dst).is_err());
        // A CIDR that covers everything still does not open private or metadata addresses.
        let everything = EgressPolicy {
            mode: EgressMode::Allowlist,
            rules: vec![EgressRule::allow(cidr("0.0.0.0/0"))],
        };
        assert!(decide(&everything, "1.1.1.1:443".parse().unwrap()).is_ok());
        // (203.0.113.0/24 is a documentation range: only a narrow CIDR naming it opens it.)
        assert!(decide(&everything, dst).is_err());
        for private in ["10.1.2.3:443", "169.254.169.254:80", "127.0.0.1:53"] {
            assert!(
                decide(&everything, private.parse().unwrap()).is_err(),
                "{private}"
            );
        }
        // A deny rule wins; mode none allows nothing.
        let mut denied = by_cidr.clone();
        denied.rules.push(EgressRule::deny(cidr("203.0.113.7/32")));
        assert!(decide(&denied, dst).is_err());
        let mut none = by_cidr;
        none.mode = EgressMode::None;
        assert!(decide(&none, dst).is_err());
    }
}

//! The data path of one sandbox: a network namespace of its own holding the VM's TAP device,
//! the gateway's address on it, and a default-deny firewall (see [`firewall`]).
//!
//! Every sandbox uses the same guest address and MAC ([`GuestLink::default`]): the host tells
//! sandboxes apart by namespace, so clones and forks of a VM need no re-addressing. The VMM
//! runs inside the namespace (it opens the TAP there); the gateway's DNS, proxy and UDP
//! relay sockets are created inside it too ([`netns::run_in`]), and connect out from the uplink namespace
//! (the host's, or a test's "internet"), never from the sandbox's.
//!
//! Invariant: a namespace made here holds nothing that can route a packet out of it; the
//! only way out is a socket of the gateway.

pub mod firewall;
pub mod netns;
pub mod uplink_guard;

use std::net::Ipv4Addr;

/// Errors of the data path.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A system tool (iproute2, nft) failed.
    #[error("{command}: {message}")]
    Command {
        /// What was run.
        command: String,
        /// Why it failed (its stderr).
        message: String,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A name that cannot be a namespace or interface name.
    #[error("invalid network name {0:?}")]
    InvalidName(String),
}

/// Longest namespace name we make (well under NAME_MAX; names are also file names).
pub const MAX_NETNS_NAME: usize = 64;

/// The guest's side of its link, identical in every sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestLink {
    /// TAP device in the namespace (the VMM attaches the guest's NIC to it); with
    /// [`SandboxNetwork::create_with_veth`], the namespace's end of the veth pair.
    pub tap: String,
    /// The guest's MAC address.
    pub guest_mac: [u8; 6],
    /// The gateway's MAC (of the TAP). Fixed, not random per TAP: a guest restored from a
    /// checkpoint or image made in another namespace keeps the gateway in its ARP cache, and
    /// a random MAC would leave it sending to a dead address until the entry expires.
    pub gateway_mac: [u8; 6],
    /// The guest's IPv4 address.
    pub guest: Ipv4Addr,
    /// The gateway's address on the TAP: the guest's default route and DNS server.
    pub gateway: Ipv4Addr,
    /// Prefix length of the link.
    pub prefix: u8,
    /// Port of the gateway proxy that guest TCP connections are redirected to.
    pub proxy_port: u16,
    /// Port of the gateway's UDP relay that guest UDP (but DNS to the gateway) is handed
    /// to, unchanged, by TPROXY ([`crate::udp`]).
    pub udp_relay_port: u16,
    /// MTU of the link.
    pub mtu: u16,
}

impl Default for GuestLink {
    fn default() -> Self {
        GuestLink {
            tap: "tap0".into(),
            // Locally administered, unicast.
            guest_mac: [0x02, 0x53, 0x50, 0x00, 0x02, 0x0f],
            gateway_mac: [0x02, 0x53, 0x50, 0x00, 0x02, 0x01],
            guest: Ipv4Addr::new(10, 0, 2, 15),
            gateway: Ipv4Addr::new(10, 0, 2, 1),
            prefix: 24,
            proxy_port: 15001,
            udp_relay_port: 15002,
            mtu: 1500,
        }
    }
}

impl GuestLink {
    /// The MAC as `aa:bb:cc:dd:ee:ff`.
    pub fn guest_mac_text(&self) -> String {
        space_core::mac::format(&self.guest_mac)
    }
}

/// The network of one sandbox VM: its namespace, made ready for the VMM and the gateway.
#[derive(Debug, Clone)]
pub struct SandboxNetwork {
    /// Namespace name (under `/run/netns`).
    pub netns: String,
    /// The link inside it.
    pub link: GuestLink,
}

impl SandboxNetwork {
    /// Creates the namespace `netns` with the TAP, the gateway address and the firewall. If
    /// any step fails, whatever was made is removed again.
    pub fn create(netns: &str, link: GuestLink) -> Result<SandboxNetwork, NetError> {
        Self::create_with(netns, link, GuestDevice::Tap)
    }

    /// Like [`SandboxNetwork::create`], but the guest's device is one end of a veth pair
    /// (named `link.tap`) instead of a TAP; its other end, `guest_dev`, is moved into the
    /// existing namespace `guest_netns` and given the guest's MAC and the link's MTU.
    ///
    /// Why: benchmarks (and tests) need a guest without a VM. A TAP only carries frames a
    /// process writes to its file descriptor, so without a VMM nothing can stand behind it
    /// but a user-space network stack, which would measure itself. A veth end in the
    /// guest's place carries the kernel's own TCP/IP from `guest_netns` through exactly the
    /// rules a VM's frames meet: the same device name, so the same anti-spoofing ingress
    /// chain, TCP redirect to the proxy and DNS-only-to-the-gateway input rules. The caller
    /// configures `guest_dev` as the guest's OS would (address, default route via the
    /// gateway, up). Production sandboxes use [`SandboxNetwork::create`] and the TAP.
    pub fn create_with_veth(
        netns: &str,
        link: GuestLink,
        guest_netns: &str,
        guest_dev: &str,
    ) -> Result<SandboxNetwork, NetError> {
        validate_name(guest_netns)?;
        validate_name(guest_dev)?;
        Self::create_with(
            netns,
            link,
            GuestDevice::Veth {
                guest_netns,
                guest_dev,
            },
        )
    }

    fn create_with(
        netns: &str,
        link: GuestLink,
        device: GuestDevice<'_>,
    ) -> Result<SandboxNetwork, NetError> {
        validate_name(netns)?;
        netns::create(netns)?;
        let net = SandboxNetwork {
            netns: netns.to_owned(),
            link,
        };
        if let Err(e) = net.configure(device) {
            // A veth pair goes with its namespace end, so this removes the guest's end too.
            let _ = netns::delete(netns);
            return Err(e);
        }
        tracing::debug!(netns, "sandbox network created");
        Ok(net)
    }

    /// The network of an existing namespace (after a node restart), if it exists.
    pub fn existing(netns: &str, link: GuestLink) -> Option<SandboxNetwork> {
        netns::exists(netns).then(|| SandboxNetwork {
            netns: netns.to_owned(),
            link,
        })
    }

    fn configure(&self, device: GuestDevice<'_>) -> Result<(), NetError> {
        let n = self.netns.as_str();
        let tap = self.link.tap.as_str();
        // No IPv6 at all: the guest must not reach anything by a family we do not filter
        // for it (the firewall drops it too; this keeps the namespace from even answering).
        netns::run_in(n, || {
            netns::write_sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
            netns::write_sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
            netns::write_sysctl("net.ipv4.ip_forward", "0")
        })?;
        netns::ip(&["-n", n, "link", "set", "lo", "up"])?;
        let mtu = self.link.mtu.to_string();
        match device {
            GuestDevice::Tap => netns::ip(&[
                "-n", n, "tuntap", "add", "dev", tap, "mode", "tap", "vnet_hdr",
            ])?,
            GuestDevice::Veth {
                guest_netns,
                guest_dev,
            } => {
                netns::ip(&[
                    "-n",
                    n,
                    "link",
                    "add",
                    tap,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    guest_dev,
                    "netns",
                    guest_netns,
                ])?;
                let mac = self.link.guest_mac_text();
                netns::ip(&[
                    "-n",
                    guest_netns,
                    "link",
                    "set",
                    guest_dev,
                    "address",
                    &mac,
                    "mtu",
                    &mtu,
                ])?;
            }
        }
        let gateway_mac = space_core::mac::format(&self.link.gateway_mac);
        netns::ip(&[
            "-n",
            n,
            "link",
            "set",
            tap,
            "address",
            &gateway_mac,
            "mtu",
            &mtu,
        ])?;
        let gw = format!("{}/{}", self.link.gateway, self.link.prefix);
        netns::ip(&["-n", n, "addr", "add", &gw, "dev", tap])?;
        // TPROXY marks guest UDP for the relay; marked packets are delivered locally (to the
        // relay's transparent socket) whatever their destination address.
        let mark = format!("{:#x}", firewall::UDP_RELAY_MARK);
        let table = firewall::UDP_RELAY_ROUTE_TABLE.to_string();
        netns::ip(&["-n", n, "rule", "add", "fwmark", &mark, "lookup", &table])?;
        netns::ip(&[
            "-n",
            n,
            "route",
            "add",
            "local",
            "0.0.0.0/0",
            "dev",
            "lo",
            "table",
            &table,
        ])?;
        netns::apply_nft(n, &firewall::ruleset(&self.link))?;
        netns::ip(&["-n", n, "link", "set", tap, "up"])?;
        Ok(())
    }

    /// Removes the namespace (and with it the TAP and the firewall).
    pub fn destroy(&self) -> Result<(), NetError> {
        netns::delete(&self.netns)
    }
}

/// The device on the guest's side of the link.
#[derive(Debug, Clone, Copy)]
enum GuestDevice<'a> {
    /// A TAP the VMM attaches the guest's NIC to (production).
    Tap,
    /// A veth pair whose other end is in `guest_netns` (see
    /// [`SandboxNetwork::create_with_veth`]).
    Veth {
        guest_netns: &'a str,
        guest_dev: &'a str,
    },
}

/// Namespace names become file names and `ip` arguments: keep them plain.
fn validate_name(name: &str) -> Result<(), NetError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NETNS_NAME
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(NetError::InvalidName(name.chars().take(80).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain() {
        assert!(validate_name("spc-1234-sbx-abc").is_ok());
        for bad in ["", "-n", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mac_text() {
        assert_eq!(GuestLink::default().guest_mac_text(), "02:53:50:00:02:0f");
    }
}

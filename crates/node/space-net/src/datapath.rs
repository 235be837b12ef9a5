//! The data path of one sandbox: a network namespace of its own holding the VM's TAP device,
//! the gateway's address on it, and a default-deny firewall (see [`firewall`]).
//!
//! Every sandbox uses the same guest address and MAC ([`GuestLink::default`]): the host tells
//! sandboxes apart by namespace, so clones and forks of a VM need no re-addressing. The VMM
//! runs inside the namespace (it opens the TAP there); the gateway's DNS and proxy sockets
//! are created inside it too ([`netns::run_in`]), and connect out from the uplink namespace
//! (the host's, or a test's "internet"), never from the sandbox's.
//!
//! Invariant: a namespace made here holds nothing that can route a packet out of it; the
//! only way out is a socket of the gateway.

pub mod firewall;
pub mod netns;

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
    /// TAP device in the namespace (the VMM attaches the guest's NIC to it).
    pub tap: String,
    /// The guest's MAC address.
    pub guest_mac: [u8; 6],
    /// The guest's IPv4 address.
    pub guest: Ipv4Addr,
    /// The gateway's address on the TAP: the guest's default route and DNS server.
    pub gateway: Ipv4Addr,
    /// Prefix length of the link.
    pub prefix: u8,
    /// Port of the gateway proxy that guest TCP connections are redirected to.
    pub proxy_port: u16,
    /// MTU of the link.
    pub mtu: u16,
}

impl Default for GuestLink {
    fn default() -> Self {
        GuestLink {
            tap: "tap0".into(),
            // Locally administered, unicast.
            guest_mac: [0x02, 0x53, 0x50, 0x00, 0x02, 0x0f],
            guest: Ipv4Addr::new(10, 0, 2, 15),
            gateway: Ipv4Addr::new(10, 0, 2, 1),
            prefix: 24,
            proxy_port: 15001,
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
        validate_name(netns)?;
        netns::create(netns)?;
        let net = SandboxNetwork {
            netns: netns.to_owned(),
            link,
        };
        if let Err(e) = net.configure() {
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

    fn configure(&self) -> Result<(), NetError> {
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
        netns::ip(&[
            "-n", n, "tuntap", "add", "dev", tap, "mode", "tap", "vnet_hdr",
        ])?;
        let mtu = self.link.mtu.to_string();
        netns::ip(&["-n", n, "link", "set", tap, "mtu", &mtu])?;
        let gw = format!("{}/{}", self.link.gateway, self.link.prefix);
        netns::ip(&["-n", n, "addr", "add", &gw, "dev", tap])?;
        netns::apply_nft(n, &firewall::ruleset(&self.link))?;
        netns::ip(&["-n", n, "link", "set", tap, "up"])?;
        Ok(())
    }

    /// Removes the namespace (and with it the TAP and the firewall).
    pub fn destroy(&self) -> Result<(), NetError> {
        netns::delete(&self.netns)
    }
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

//! The protocol between the node (host) and `spaced` (guest) over the private channel.
//!
//! The channel is a byte stream: a virtio-serial port under QEMU, a vsock connection under
//! Firecracker, a Unix socket in development. On it:
//!
//! 1. **Handshake** (text lines, see [`handshake`]): the host sends `SPACE-HELLO`, the guest
//!    answers `SPACE-READY`. This resynchronises a stream that may hold stale bytes from an
//!    earlier host connection (a virtio-serial port outlives host reconnects) and carries the
//!    protocol version.
//! 2. **HTTP/2** with prior knowledge: the guest is the server, the host the client. HTTP/2
//!    gives multiplexing, per-stream flow control (one chatty process cannot starve another)
//!    and bounded frames; the limits both sides configure are in [`limits`]. The routes are in
//!    [`routes`]; bodies are the JSON types of `space-core` and of this crate; every error is a
//!    status code plus a `space_core::ErrorBody`.
//!
//! Architecture invariant: the guest listens on no network socket; this protocol is the only
//! way into the guest for the platform.

pub mod handshake;
pub mod limits;
pub mod routes;

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_FREEZE_TIMEOUT_MS, MAX_HOSTNAME, MAX_IDENTITY_ENTROPY, MAX_TIME_UNIX_MS,
    MAX_TRUSTED_CA_PEM, MIN_FREEZE_TIMEOUT_MS, MIN_IDENTITY_ENTROPY,
};

/// The protocol version spoken after the handshake. Bumped on incompatible route changes.
pub const PROTOCOL_VERSION: u32 = 1;

/// Name of the virtio-serial port (`/sys/class/virtio-ports/vport*/name`).
pub const VIRTIO_SERIAL_PORT_NAME: &str = "space.agent";

/// vsock port the daemon listens on under Firecracker (guest side, CID any).
pub const VSOCK_PORT: u32 = 1024;

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Daemon version (crate version).
    pub version: String,
    /// Random id chosen at boot; changes when the guest reboots.
    pub boot_id: String,
    /// Milliseconds since the daemon started.
    pub uptime_ms: u64,
    /// Processes currently running.
    pub processes: u32,
}

/// `POST /v1/configure`: what the node tells a freshly booted guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestConfig {
    /// Hostname to set.
    pub hostname: String,
    /// Environment every process gets (below the process's own env).
    pub env: BTreeMap<String, String>,
    /// User processes and file operations run as when a request names none.
    pub default_user: String,
    /// Directory processes start in when a request names none (the template image's
    /// `WorkingDir`); absent: the user's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_workdir: Option<String>,
    /// Grow the root filesystem to fill its block device.
    pub resize_root: bool,
    /// Host wall clock, ms since the Unix epoch; the guest sets its clock from it.
    pub time_unix_ms: i64,
    /// The guest's network card and how to address it; absent when the sandbox has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<GuestNetwork>,
    /// The sandbox CA's certificate (PEM), which the gateway signs its TLS interception
    /// certificates with: the guest adds it to its trust store. Absent without a network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_ca_pem: Option<String>,
}

impl GuestConfig {
    /// Checks the bounds both ends enforce on the parts the hostname and env checks miss.
    pub fn validate(&self) -> Result<(), RequestError> {
        if !valid_hostname(&self.hostname) {
            return Err(RequestError::Hostname);
        }
        if let Some(dir) = &self.default_workdir {
            if !dir.starts_with('/') || dir.len() > 4096 || dir.contains('\0') {
                return Err(RequestError::Path);
            }
        }
        if let Some(net) = &self.network {
            net.validate()?;
        }
        if let Some(pem) = &self.trusted_ca_pem {
            validate_certificate_pem(pem)?;
        }
        Ok(())
    }
}

/// One PEM `CERTIFICATE` block, at most [`MAX_TRUSTED_CA_PEM`] bytes, base64 lines only:
/// what the guest is willing to write into its trust store.
pub fn validate_certificate_pem(pem: &str) -> Result<(), RequestError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let body = pem
        .trim_end()
        .strip_prefix(BEGIN)
        .and_then(|rest| rest.strip_suffix(END));
    let ok = pem.len() <= MAX_TRUSTED_CA_PEM
        && body.is_some_and(|b| {
            !b.trim().is_empty()
                && b.bytes().all(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'\n' | b'\r')
                })
        });
    if ok {
        Ok(())
    } else {
        Err(RequestError::TrustedCa)
    }
}

/// Static addressing of the guest's one network card (the gateway is the node's, on the
/// other end of the link; there is no DHCP).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestNetwork {
    /// MAC of the card to configure (`aa:bb:cc:dd:ee:ff`): the guest finds it by this.
    pub mac: String,
    /// The guest's IPv4 address.
    pub address: std::net::Ipv4Addr,
    /// Prefix length of the link (1..=30).
    pub prefix: u8,
    /// Default gateway.
    pub gateway: std::net::Ipv4Addr,
    /// The only DNS server (written to /etc/resolv.conf).
    pub dns: std::net::Ipv4Addr,
    /// Link MTU (576..=9000).
    pub mtu: u16,
}

impl GuestNetwork {
    /// The MAC as bytes, if it is six `:`-separated hex octets.
    pub fn mac_bytes(&self) -> Option<[u8; 6]> {
        space_core::mac::parse(&self.mac)
    }

    /// Checks the bounds both ends enforce.
    pub fn validate(&self) -> Result<(), RequestError> {
        let ok = self.mac_bytes().is_some_and(|m| m[0] & 1 == 0)
            && (1..=30).contains(&self.prefix)
            && (576..=9000).contains(&self.mtu)
            && !self.address.is_unspecified()
            && self.address != self.gateway;
        if ok {
            Ok(())
        } else {
            Err(RequestError::Network)
        }
    }
}

/// A hostname the kernel and resolvers accept: 1-64 bytes of letters, digits, `-` and `.`,
/// not starting with `-` or `.`.
pub fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HOSTNAME
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// A request body that breaks one of the protocol's bounds. Both ends check: the host
/// before sending, the guest on receipt (it trusts nothing from the host either).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// `FreezeRequest::timeout_ms` out of range.
    #[error("timeout_ms must be {MIN_FREEZE_TIMEOUT_MS}..={MAX_FREEZE_TIMEOUT_MS}, got {0}")]
    FreezeTimeout(u32),
    /// `IdentityRequest::entropy` is not standard, padded base64.
    #[error("entropy must be standard base64")]
    EntropyEncoding,
    /// `IdentityRequest::entropy` decodes to too few or too many bytes.
    #[error("entropy must be {MIN_IDENTITY_ENTROPY}..={MAX_IDENTITY_ENTROPY} bytes, got {0}")]
    EntropyLength(usize),
    /// A hostname [`valid_hostname`] refuses.
    #[error("hostname must be 1-64 letters, digits, '-' or '.'")]
    Hostname,
    /// `IdentityRequest::time_unix_ms` out of range.
    #[error("time_unix_ms must be 1..={MAX_TIME_UNIX_MS}, got {0}")]
    Time(i64),
    /// A `GuestNetwork` out of bounds.
    #[error("network: want a unicast MAC aa:bb:cc:dd:ee:ff, prefix 1..=30, MTU 576..=9000, an address other than the gateway's")]
    Network,
    /// `GuestConfig::trusted_ca_pem` is not one bounded PEM certificate.
    #[error(
        "trusted_ca_pem must be one PEM CERTIFICATE block of at most {MAX_TRUSTED_CA_PEM} bytes"
    )]
    TrustedCa,
    /// `GuestConfig::default_workdir` is not an absolute path of at most 4096 bytes.
    #[error("default_workdir must be an absolute path of at most 4096 bytes")]
    Path,
}

/// `POST /v1/fs/freeze`: freeze the guest's disk file systems (FIFREEZE) so the host can
/// copy the disks consistently; answered 204 once they are frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreezeRequest {
    /// The guest thaws by itself this long after freezing if no `POST /v1/fs/thaw` came
    /// (a host that dies mid-snapshot never leaves the guest frozen).
    /// [`MIN_FREEZE_TIMEOUT_MS`]..=[`MAX_FREEZE_TIMEOUT_MS`].
    pub timeout_ms: u32,
}

impl FreezeRequest {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), RequestError> {
        if (MIN_FREEZE_TIMEOUT_MS..=MAX_FREEZE_TIMEOUT_MS).contains(&self.timeout_ms) {
            Ok(())
        } else {
            Err(RequestError::FreezeTimeout(self.timeout_ms))
        }
    }
}

/// `POST /v1/identity`: restore the uniqueness of a guest restored from a snapshot or
/// forked: fresh kernel RNG state, hostname, wall clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityRequest {
    /// Host entropy, standard base64 of [`MIN_IDENTITY_ENTROPY`]..=[`MAX_IDENTITY_ENTROPY`]
    /// bytes; mixed into the kernel RNG (credited) before it is reseeded.
    pub entropy: String,
    /// Hostname to set (also mapped in `/etc/hosts`), as `POST /v1/configure` does.
    pub hostname: String,
    /// Host wall clock, ms since the Unix epoch (1..=[`MAX_TIME_UNIX_MS`]).
    pub time_unix_ms: i64,
}

impl IdentityRequest {
    /// A request carrying `entropy` (encoded here).
    pub fn new(entropy: &[u8], hostname: impl Into<String>, time_unix_ms: i64) -> Self {
        Self {
            entropy: base64::engine::general_purpose::STANDARD.encode(entropy),
            hostname: hostname.into(),
            time_unix_ms,
        }
    }

    /// Checks every bound; returns the decoded entropy.
    pub fn validate(&self) -> Result<Vec<u8>, RequestError> {
        // Refuse oversize text before decoding it.
        let max_encoded = MAX_IDENTITY_ENTROPY.div_ceil(3) * 4;
        if self.entropy.len() > max_encoded {
            return Err(RequestError::EntropyLength(self.entropy.len() / 4 * 3));
        }
        let entropy = base64::engine::general_purpose::STANDARD
            .decode(&self.entropy)
            .map_err(|_| RequestError::EntropyEncoding)?;
        if !(MIN_IDENTITY_ENTROPY..=MAX_IDENTITY_ENTROPY).contains(&entropy.len()) {
            return Err(RequestError::EntropyLength(entropy.len()));
        }
        if !valid_hostname(&self.hostname) {
            return Err(RequestError::Hostname);
        }
        if !(1..=MAX_TIME_UNIX_MS).contains(&self.time_unix_ms) {
            return Err(RequestError::Time(self.time_unix_ms));
        }
        Ok(entropy)
    }
}

/// `GET /v1/activity`: cumulative counters since boot. The host compares two samples to
/// decide whether a sandbox is idle; absolute values mean little.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    /// Processes in the workload cgroup and its descendants now (without a workload
    /// cgroup: the processes the daemon started that are still running).
    pub workload_processes: u32,
    /// CPU time used by the workload cgroup, microseconds (`usage_usec` of `cpu.stat`;
    /// 0 without a workload cgroup).
    pub workload_cpu_usec: u64,
    /// Bytes read and written on the virtio disks (`/proc/diskstats`, sectors × 512).
    pub disk_io_bytes: u64,
    /// Bytes received and sent on every interface but `lo` (`/proc/net/dev`).
    pub net_bytes: u64,
    /// TCP connections in state ESTABLISHED now (IPv4 and IPv6).
    pub tcp_connections: u32,
    /// Requests the daemon has served, except the platform's housekeeping
    /// ([`routes::NOT_ACTIVITY`]: health, activity, metrics, configure, identity, freeze and
    /// thaw).
    pub api_requests: u64,
}

/// `GET /v1/metrics`: how much of the guest's CPU, memory and root disk is in use. CPU
/// counters are cumulative since boot; the host computes rates from two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestMetrics {
    /// Online CPUs (`cpuN` lines of `/proc/stat`).
    pub cpu_count: u32,
    /// Ticks all CPUs spent busy (not idle, not waiting for I/O) since boot.
    pub cpu_busy_ticks: u64,
    /// Ticks all CPUs spent in any state since boot.
    pub cpu_total_ticks: u64,
    /// `MemTotal` of `/proc/meminfo`, bytes.
    pub mem_total_bytes: u64,
    /// `MemAvailable`, bytes.
    pub mem_available_bytes: u64,
    /// `Cached` (the page cache), bytes.
    pub mem_cache_bytes: u64,
    /// Size of the root file system (`statfs /`), bytes.
    pub disk_total_bytes: u64,
    /// Bytes in use on it.
    pub disk_used_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostname_rules() {
        assert!(valid_hostname("sbx-abc.local"));
        assert!(valid_hostname(&"a".repeat(64)));
        assert!(!valid_hostname(""));
        assert!(!valid_hostname("-x"));
        assert!(!valid_hostname(".x"));
        assert!(!valid_hostname("a b"));
        assert!(!valid_hostname("a\nb"));
        assert!(!valid_hostname(&"a".repeat(65)));
    }

    #[test]
    fn trusted_ca_must_be_one_bounded_certificate() {
        let good = "-----BEGIN CERTIFICATE-----\nMIIBtjCCAVyg+/A=\n-----END CERTIFICATE-----\n";
        assert!(validate_certificate_pem(good).is_ok());
        let two = format!("{good}{good}");
        let huge = good.replace("MIIB", &"A".repeat(MAX_TRUSTED_CA_PEM));
        for bad in [
            "",
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----",
            "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----",
            "-----BEGIN CERTIFICATE-----\nMII B\n-----END CERTIFICATE-----",
            "x-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
            two.as_str(),
            huge.as_str(),
        ] {
            assert_eq!(
                validate_certificate_pem(bad),
                Err(RequestError::TrustedCa),
                "{bad}"
            );
        }
    }

    #[test]
    fn freeze_timeout_bounds() {
        let v = |t| FreezeRequest { timeout_ms: t }.validate();
        assert_eq!(v(0), Err(RequestError::FreezeTimeout(0)));
        assert!(v(1).is_ok());
        assert!(v(30_000).is_ok());
        assert_eq!(v(30_001), Err(RequestError::FreezeTimeout(30_001)));
        assert!(serde_json::from_str::<FreezeRequest>(r#"{"timeout_ms":-1}"#).is_err());
        assert!(
            serde_json::from_str::<FreezeRequest>(r#"{"timeout_ms":5,"x":1}"#).is_err(),
            "unknown fields are refused"
        );
    }

    #[test]
    fn identity_bounds() {
        let ok = IdentityRequest::new(&[7u8; 32], "sbx-1", 1_700_000_000_000);
        assert_eq!(ok.validate().unwrap(), vec![7u8; 32]);
        assert!(IdentityRequest::new(&[0u8; 512], "h", 1).validate().is_ok());
        assert_eq!(
            IdentityRequest::new(&[0u8; 31], "h", 1).validate(),
            Err(RequestError::EntropyLength(31))
        );
        assert_eq!(
            IdentityRequest::new(&[0u8; 513], "h", 1).validate(),
            Err(RequestError::EntropyLength(513))
        );
        let huge = IdentityRequest {
            entropy: "A".repeat(1 << 20),
            ..ok.clone()
        };
        assert!(matches!(
            huge.validate(),
            Err(RequestError::EntropyLength(_))
        ));
        let bad = IdentityRequest {
            entropy: "not base64!".repeat(10),
            ..ok.clone()
        };
        assert_eq!(bad.validate(), Err(RequestError::EntropyEncoding));
        let unpadded = IdentityRequest {
            entropy: ok.entropy.trim_end_matches('=').to_owned(),
            ..ok.clone()
        };
        assert_eq!(unpadded.validate(), Err(RequestError::EntropyEncoding));
        assert_eq!(
            IdentityRequest::new(&[0u8; 32], "-bad", 1).validate(),
            Err(RequestError::Hostname)
        );
        assert_eq!(
            IdentityRequest::new(&[0u8; 32], "h", 0).validate(),
            Err(RequestError::Time(0))
        );
        assert_eq!(
            IdentityRequest::new(&[0u8; 32], "h", MAX_TIME_UNIX_MS + 1).validate(),
            Err(RequestError::Time(MAX_TIME_UNIX_MS + 1))
        );
    }

    #[test]
    fn activity_round_trips() {
        let a = Activity {
            workload_processes: 3,
            workload_cpu_usec: 1,
            disk_io_bytes: 2,
            net_bytes: 4,
            tcp_connections: 5,
            api_requests: 6,
        };
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Activity>(&text).unwrap(), a);
    }
}

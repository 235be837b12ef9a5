//! Sandbox networking, on the node.
//!
//! A sandbox's only way out is the node's gateway: its VM's TAP device sits in a network
//! namespace of its own, whose nftables rules drop everything the gateway does not serve;
//! the gateway (a DNS resolver and a transparent TCP proxy, listening inside that namespace)
//! enforces the sandbox's `EgressPolicy` and connects upstream itself, only to addresses it
//! resolved for allowed names.
//!
//! - `datapath`: the sandbox's namespace, TAP and default-deny firewall (privileged: the
//!   node manager calls it).
//! - `uplink`: the gateway's way out: connections and upstream DNS made from the uplink
//!   namespace (the host's, or a test's "internet"), never a sandbox's.
//! - `sniff`: what a guest's TCP stream is for — TLS ClientHello SNI or HTTP Host — parsed
//!   from bytes the guest controls (bounded, fail-closed).
//! - `ca`: the per-sandbox certificate authority and the leaf certificates it mints for TLS
//!   termination.
//! - `dns`: the resolver a sandbox talks to: answers only names its policy allows, never
//!   with private or metadata addresses, and remembers (pins) what it answered.
//! - `proxy`: the transparent TCP proxy every guest connection is redirected to: connects
//!   only to addresses pinned for allowed names (or named by a CIDR rule), splices, or
//!   terminates TLS to inspect and inject credentials.

pub mod ca;
pub mod datapath;
pub mod dns;
pub mod proxy;
pub mod sniff;
pub mod udp;
pub mod uplink;

#[cfg(test)]
pub(crate) mod test_util;

//! Where a guest connection may go, decided from what its first bytes said, the original
//! destination, the policy and the pin table — without I/O (see the module docs of
//! [`crate::proxy`] for the rules).

use std::net::SocketAddr;

use space_core::egress::{
    ConnectionFacts, Decision, DecisionReason, Destination, EgressPolicy, Hostname, Protocol,
};

use super::first_bytes::{FirstBytes, Unnamed};
use crate::dns::PinTable;

/// The default port of cleartext HTTP, assumed for a `Host` without a port.
pub(super) const HTTP_PORT: u16 = 80;
/// The default port of HTTPS, assumed for an `:authority` / `Host` without a port over TLS.
pub(super) const HTTPS_PORT: u16 = 443;

/// Why a guest connection was refused. Messages never contain guest bytes beyond a host
/// name, and never a header value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The sandbox already has its maximum of open connections.
    #[error("too many open connections (limit {limit})")]
    TooManyConnections {
        /// The limit.
        limit: usize,
    },
    /// The sandbox's tenant already has its maximum of open connections on this node.
    #[error("too many open connections of the tenant (limit {limit})")]
    TooManyTenantConnections {
        /// The limit.
        limit: u64,
    },
    /// The connection's original destination could not be read.
    #[error("no original destination: {0}")]
    NoOriginalDestination(String),
    /// The connection is addressed to the proxy's own listener.
    #[error("connection to the proxy itself")]
    Loop,
    /// HTTP `CONNECT`: the guest asked for a tunnel; the proxy is transparent and makes none.
    #[error("HTTP CONNECT is not supported")]
    Connect,
    /// The policy does not allow the name (the resolver would not answer it).
    #[error("the policy does not allow the name")]
    NameNotAllowed,
    /// The destination address is not one the resolver gave the sandbox for the name: the
    /// guest connected to an address of its own choosing (or an IP literal) and claimed an
    /// allowed name.
    #[error("the destination address is not one the resolver gave the sandbox for the name")]
    NotPinned,
    /// The `Host` header's port (or the scheme's default) is not the destination port.
    #[error("Host port {host_port} differs from the destination port {dst_port}")]
    PortMismatch {
        /// The port the `Host` header names (or 80).
        host_port: u16,
        /// The port the guest connected to.
        dst_port: u16,
    },
    /// The policy refuses the (name, address, port).
    #[error("denied by the policy: {0}")]
    Denied(DecisionReason),
    /// The stream names no host, and no CIDR rule allows its destination.
    #[error("{what}, and no CIDR rule allows the destination ({why})")]
    Unnamed {
        /// What the stream was.
        what: Unnamed,
        /// Why its destination is not allowed without a name.
        why: String,
    },
    /// Termination is required but the guest offers ALPN without `h2` or `http/1.1`.
    #[error("TLS termination required, but the guest offers neither h2 nor http/1.1 by ALPN")]
    UnsupportedAlpn,
    /// Termination is required but the proxy has no TLS server configuration.
    #[error("TLS termination unavailable: {0}")]
    TerminationUnavailable(String),
    /// The TLS handshake with the guest failed (it may not trust the sandbox CA).
    #[error("TLS handshake with the guest failed: {0}")]
    Handshake(String),
    /// A stream spliced to an address (no host name: no credential is injected there)
    /// carried a credential placeholder; it was cut before the placeholder went upstream.
    #[error("a credential placeholder in a stream to an address allowed only by a CIDR rule")]
    PlaceholderInStream,
    /// The server name rustls saw is not the sniffed one.
    #[error("the handshake's server name differs from the sniffed one")]
    SniMismatch,
}

/// What to do with an admitted connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Plan {
    /// Replay the first bytes to `addr` and copy bytes both ways: TLS the decision passes
    /// through (checked by its SNI only) and no credential applies to, or a stream without
    /// a name to an address a CIDR rule allows.
    Splice {
        /// Where to connect.
        addr: SocketAddr,
    },
    /// Cleartext HTTP/1: serve the guest with hyper, check and forward every request.
    Http {
        /// The connection's host.
        host: Hostname,
        /// Where to connect (a pinned address of `host`).
        addr: SocketAddr,
    },
    /// Terminate the guest's TLS, then as [`Plan::Http`] over TLS both sides.
    Terminate {
        /// The server name.
        host: Hostname,
        /// Where to connect (a pinned address of `host`).
        addr: SocketAddr,
    },
}

/// Decides a connection. `needs_credentials` says whether a credential may apply to a host
/// (then TLS to it is terminated even where the rule asks for `pass_through`).
pub(super) fn plan(
    policy: &EgressPolicy,
    pins: &PinTable,
    what: &FirstBytes,
    dst: SocketAddr,
    needs_credentials: impl FnOnce(&Hostname) -> bool,
) -> Result<Plan, Refusal> {
    match what {
        FirstBytes::Connect => Err(Refusal::Connect),
        FirstBytes::Unnamed(unnamed) => address_allowed(policy, dst)
            .map(|addr| Plan::Splice { addr })
            .map_err(|why| Refusal::Unnamed {
                what: unnamed.clone(),
                why,
            }),
        FirstBytes::Http { host, port } => {
            let host_port = port.unwrap_or(HTTP_PORT);
            if host_port != dst.port() {
                return Err(Refusal::PortMismatch {
                    host_port,
                    dst_port: dst.port(),
                });
            }
            let (addr, _) = admit_name(policy, pins, host, dst)?;
            Ok(Plan::Http {
                host: host.clone(),
                addr,
            })
        }
        FirstBytes::Tls { sni, alpn } => {
            let (addr, decision) = admit_name(policy, pins, sni, dst)?;
            if !decision.inspect && !needs_credentials(sni) {
                return Ok(Plan::Splice { addr });
            }
            if !alpn.is_empty() && !alpn.iter().any(|p| p == "h2" || p == "http/1.1") {
                return Err(Refusal::UnsupportedAlpn);
            }
            Ok(Plan::Terminate {
                host: sni.clone(),
                addr,
            })
        }
    }
}

/// The facts of a TCP connection to `addr` (canonical) on `dst`'s port.
pub(super) fn facts<'a>(
    host: Option<&'a Hostname>,
    addr: std::net::IpAddr,
    port: u16,
) -> ConnectionFacts<'a> {
    ConnectionFacts {
        host,
        addr: Some(addr),
        port,
        protocol: Protocol::Tcp,
    }
}

/// A connection naming `host` to `dst`: the name must be one the resolver would answer, the
/// destination address one it pinned for that name, and the policy must allow (name,
/// pinned address, port). Returns the upstream address — the pinned one, never anything the
/// guest chose beyond picking which of its pinned addresses — and the decision.
pub(super) fn admit_name(
    policy: &EgressPolicy,
    pins: &PinTable,
    host: &Hostname,
    dst: SocketAddr,
) -> Result<(SocketAddr, Decision), Refusal> {
    if !policy.allows_name(host) {
        return Err(Refusal::NameNotAllowed);
    }
    let wanted = dst.ip().to_canonical();
    let pinned = pins
        .addresses_for(host)
        .into_iter()
        .find(|addr| *addr == wanted)
        .ok_or(Refusal::NotPinned)?;
    let decision = policy.decide(&facts(Some(host), pinned, dst.port()));
    if !decision.allowed {
        return Err(Refusal::Denied(decision.reason));
    }
    Ok((SocketAddr::new(pinned, dst.port()), decision))
}

/// A connection without a name to `dst`: allowed only when a CIDR rule allows the address
/// and port explicitly (not merely the mode's default). Returns the address to connect to
/// (`dst`, canonical) or why not.
pub(super) fn address_allowed(
    policy: &EgressPolicy,
    dst: SocketAddr,
) -> Result<SocketAddr, String> {
    let addr = dst.ip().to_canonical();
    let decision = policy.decide(&facts(None, addr, dst.port()));
    let by_cidr = match decision.reason {
        DecisionReason::AllowedByRule { rule } => policy
            .rules
            .get(rule)
            .is_some_and(|r| matches!(r.destination, Destination::Cidr(_))),
        _ => false,
    };
    match (decision.allowed, by_cidr) {
        (true, true) => Ok(SocketAddr::new(addr, dst.port())),
        (true, false) => Err("without a host name only a CIDR rule allows a destination".into()),
        (false, _) => Err(decision.reason.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use space_core::egress::{DomainPattern, EgressMode, EgressRule, PortRange};

    use super::*;

    fn name(s: &str) -> Hostname {
        Hostname::parse(s).unwrap()
    }

    fn policy(mode: EgressMode, rules: Vec<EgressRule>) -> EgressPolicy {
        let policy = EgressPolicy { mode, rules };
        policy.validate().unwrap();
        policy
    }

    fn domain(s: &str) -> DomainPattern {
        DomainPattern::parse(s).unwrap()
    }

    fn cidr(s: &str) -> ipnet::IpNet {
        s.parse().unwrap()
    }

    fn pins(entries: &[(&str, &str)]) -> PinTable {
        let table = PinTable::default();
        for (host, addr) in entries {
            let addr: IpAddr = addr.parse().unwrap();
            table.pin(&name(host), &[addr], Duration::from_secs(300));
        }
        table
    }

    fn tls(sni: &str) -> FirstBytes {
        FirstBytes::Tls {
            sni: name(sni),
            alpn: vec!["h2".into(), "http/1.1".into()],
        }
    }

    fn dst(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn never(_: &Hostname) -> bool {
        false
    }

    #[test]
    fn a_pinned_allowed_name_is_spliced_to_its_pinned_address() {
        let p = policy(
            EgressMode::Allowlist,
            vec![EgressRule::allow(domain("api.example.com")).passed_through()],
        );
        let t = pins(&[("api.example.com", "93.184.215.14")]);
        let plan = plan(
            &p,
            &t,
            &tls("api.example.com"),
            dst("93.184.215.14:443"),
            never,
        );
        assert_eq!(
            plan,
            Ok(Plan::Splice {
                addr: dst("93.184.215.14:443")
            })
        );
        // An IPv4-mapped spelling of the destination is the same address.
        let plan2 = super::plan(
            &p,
            &t,
            &tls("api.example.com"),
            dst("[::ffff:93.184.215.14]:443"),
            never,
        );
        assert_eq!(
            plan2,
            Ok(Plan::Splice {
                addr: dst("93.184.215.14:443")
            })
        );
    }

    #[test]
    fn an_allowed_name_towards_another_address_is_refused() {
        let p = policy(EgressMode::Denylist, vec![]);
        let t = pins(&[("api.example.com", "93.184.215.14")]);
        let plan = plan(
            &p,
            &t,
            &tls("api.example.com"),
            dst("198.51.100.7:443"),
            never,
        );
        assert_eq!(plan, Err(Refusal::NotPinned));
        // Pinned for another name is not pinned for this one.
        let t = pins(&[("other.example.com", "198.51.100.7")]);
        let plan = super::plan(
            &p,
            &t,
            &tls("api.example.com"),
            dst("198.51.100.7:443"),
            never,
        );
        assert_eq!(plan, Err(Refusal::NotPinned));
    }

    #[test]
    fn a_name_the_policy_no_longer_allows_is_refused_despite_its_pin() {
        let p = policy(
            EgressMode::Allowlist,
            vec![EgressRule::allow(domain("api.example.com"))],
        );
        let t = pins(&[("evil.example.net", "93.184.215.14")]);
        let plan = plan(
            &p,
            &t,
            &tls("evil.example.net"),
            dst("93.184.215.14:443"),
            never,
        );
        assert_eq!(plan, Err(Refusal::NameNotAllowed));
    }

    #[test]
    fn the_port_is_judged() {
        let p = policy(
            EgressMode::Allowlist,
            vec![EgressRule::allow(domain("api.example.com")).with_ports([PortRange::single(443)])],
        );
        let t = pins(&[("api.example.com", "93.184.215.14")]);
        let plan = plan(
            &p,
            &t,
            &tls("api.example.com"),
            dst("93.184.215.14:8443"),
            never,
        );
        assert_eq!(plan, Err(Refusal::Denied(DecisionReason::DeniedByDefault)));
    }

    #[test]
    fn a_pinned_private_address_needs_its_cidr_rule() {
        let p = policy(
            EgressMode::Allowlist,
            vec![EgressRule::allow(domain("db.example.com"))],
        );
        let t = pins(&[("db.example.com", "10.1.2.3")]);
        let plan = plan(&p, &t, &tls("db.example.com"), dst("10.1.2.3:443"), never);
        assert!(matches!(
            plan,
            Err(Refusal::Denied(DecisionReason::NonPublicAddress { .. }))
        ));
    }

    #[test]
    fn domain_rules_terminate_unless_they_ask_for_pass_through() {
        let t = pins(&[("api.example.com", "93.184.215.14")]);
        let terminate = Ok(Plan::Terminate {
            host: name("api.example.com"),
            addr: dst("93.184.215.14:443"),
        });
        let splice = Ok(Plan::Splice {
            addr: dst("93.184.215.14:443"),
        });
        let by_default = policy(
            EgressMode::Allowlist,
            vec![EgressRule::allow(domain("api.example.com"))],
        );
        let pass_through = policy(
            EgressMode::Allowlist,
            vec![EgressRule::allow(domain("api.example.com")).passed_through()],
        );
        let hello = tls("api.example.com");
        let to = dst("93.184.215.14:443");
        assert_eq!(plan(&by_default, &t, &hello, to, never), terminate);
        assert_eq!(plan(&pass_through, &t, &hello, to, never), splice);
        // A credential makes the proxy terminate whatever the rule says.
        assert_eq!(plan(&pass_through, &t, &hello, to, |_| true), terminate);
        // Terminated TLS must be HTTP; passed through it need not.
        let other_alpn = FirstBytes::Tls {
            sni: name("api.example.com"),
            alpn: vec!["imap".into()],
        };
        assert_eq!(
            plan(&by_default, &t, &other_alpn, to, never),
            Err(Refusal::UnsupportedAlpn)
        );
        assert_eq!(plan(&pass_through, &t, &other_alpn, to, never), splice);
        // The open denylist has no names to check: any name is allowed there.
        let open = policy(EgressMode::Denylist, vec![]);
        assert_eq!(plan(&open, &t, &hello, to, never), splice);
    }

    #[test]
    fn cleartext_http_checks_the_host_port() {
        let p = policy(EgressMode::Denylist, vec![]);
        let t = pins(&[("api.example.com", "93.184.215.14")]);
        let http = |port| FirstBytes::Http {
            host: name("api.example.com"),
            port,
        };
        assert_eq!(
            plan(&p, &t, &http(None), dst("93.184.215.14:80"), never),
            Ok(Plan::Http {
                host: name("api.example.com"),
                addr: dst("93.184.215.14:80")
            })
        );
        assert_eq!(
            plan(&p, &t, &http(None), dst("93.184.215.14:8080"), never),
            Err(Refusal::PortMismatch {
                host_port: 80,
                dst_port: 8080
            })
        );
        assert!(plan(&p, &t, &http(Some(8080)), dst("93.184.215.14:8080"), never).is_ok());
        assert_eq!(
            plan(&p, &t, &FirstBytes::Connect, dst("93.184.215.14:80"), never),
            Err(Refusal::Connect)
        );
    }

    #[test]
    fn unnamed_streams_need_an_explicit_cidr_rule() {
        let unnamed = FirstBytes::Unnamed(Unnamed::NotHttp);
        let t = PinTable::default();
        // Everything public by default is not explicit.
        let p = policy(EgressMode::Denylist, vec![]);
        let plan1 = plan(&p, &t, &unnamed, dst("198.51.100.7:22"), never);
        assert!(matches!(plan1, Err(Refusal::Unnamed { .. })), "{plan1:?}");
        // A CIDR rule is.
        let p = policy(
            EgressMode::Allowlist,
            vec![EgressRule::allow(cidr("10.1.0.0/16")).with_ports([PortRange::single(22)])],
        );
        assert_eq!(
            plan(&p, &t, &unnamed, dst("10.1.2.3:22"), never),
            Ok(Plan::Splice {
                addr: dst("10.1.2.3:22")
            })
        );
        assert!(plan(&p, &t, &unnamed, dst("10.1.2.3:23"), never).is_err());
        assert!(plan(&p, &t, &unnamed, dst("10.2.0.1:22"), never).is_err());
    }
}

//! Egress policy: what a sandbox may reach on the network, decided without I/O.
//!
//! A sandbox's traffic leaves only through its node's gateway: a DNS resolver and a
//! transparent TCP proxy that learns the host name of a connection from the DNS answer it
//! gave itself, the TLS SNI or the HTTP `Host` header. The gateway gathers those facts into a
//! [`ConnectionFacts`] and asks [`EgressPolicy::decide`]; its resolver asks
//! [`EgressPolicy::allows_name`] before it resolves a name at all. This module is the whole
//! decision; the gateway does the I/O.
//!
//! The guest is hostile (root in its VM) and will try IP literals, forged DNS, odd spellings
//! of names (trailing dots, case, NUL, full-width or compatibility characters, look-alikes),
//! the cloud metadata address, private ranges and IPv6 forms of IPv4 addresses. Hence the
//! strict [`Hostname`] canonicalisation and the [`address_class`] classification below.
//!
//! # The contract
//!
//! **Modes** ([`EgressMode`]):
//! - `none`: nothing leaves. Rules, if any, are kept but ignored.
//! - `allowlist`: a connection is allowed iff at least one `allow` rule matches it and no
//!   `deny` rule does.
//! - `denylist`: a connection is allowed iff no `deny` rule matches it.
//!
//! **Deny always wins**: a matching `deny` rule refuses the connection whatever else matches,
//! in every mode.
//!
//! **Matching.** A rule matches a connection when its destination, its ports and its
//! protocols all match (`ports`/`protocols` absent = any):
//! - a **domain** rule matches only when the gateway knows the connection's host name (from a
//!   DNS answer it gave itself, the TLS SNI or the HTTP `Host` header). `example.com` matches
//!   exactly that name; `*.example.com` matches every strict subdomain at any depth, never
//!   the apex, compared label by label.
//! - a **CIDR** rule matches the destination address. It also matches an IPv6 destination
//!   that embeds an IPv4 address inside the CIDR (IPv4-mapped `::ffff:a.b.c.d`,
//!   IPv4-compatible `::a.b.c.d`, IPv4-translated `::ffff:0:a.b.c.d`, NAT64
//!   `64:ff9b::a.b.c.d`, 6to4 `2002:aabb:ccdd::/48`), so `deny 1.2.3.0/24` cannot be dodged by
//!   writing the address in IPv6. A CIDR rule written *inside* one of those IPv6 ranges is
//!   refused by validation (write the IPv4 network instead).
//!
//! **Non-public addresses.** A destination whose [`AddressClass`] is anything but `public`
//! (loopback, private, CGNAT, link-local, cloud metadata, multicast, reserved, …) is refused
//! in every mode unless an `allow` CIDR rule *explicitly* covers it: the rule must match the
//! connection (address, port, protocol) **and its whole prefix must lie inside one range of
//! the same class**. So `10.0.0.0/8` or `10.1.2.3/32` unlock `10.1.2.3`, but `0.0.0.0/0`,
//! `::/0` or `10.0.0.0/7` (private `10/8` plus public `11/8`) do not (they merely contain private space); `169.254.0.0/16` unlocks
//! link-local addresses but not the metadata address `169.254.169.254`, which only a rule
//! for exactly that address (`169.254.169.254/32`) unlocks. A domain rule never unlocks a
//! non-public address: a name that resolves to one (DNS rebinding) is refused. `deny` rules
//! still win over an unlocking rule.
//!
//! **Before resolution.** [`ConnectionFacts::addr`] may be absent for a check on the name
//! alone; then CIDR rules and the non-public rule cannot apply, so the gateway must decide
//! again with the address it is about to connect to.
//!
//! **TLS termination** ([`Decision::inspect`]). A TLS connection checked by its SNI alone
//! reaches whatever the server behind that name serves: a name on a shared CDN front (or
//! ECH with an allowed outer name) reaches every other name on the front. So the gateway
//! terminates TLS and checks the `Host` / `:authority` of every request, by default, for
//! connections a domain rule allows:
//! - a matching `allow` rule with `inspect` asks for termination, always;
//! - otherwise, when `allow` domain rules match, TLS is terminated unless every one of them
//!   sets `pass_through` (the weaker mode, SNI only, for certificate-pinning clients or
//!   protocols other than HTTP over TLS);
//! - when no `allow` domain rule matches (the `denylist` default, a CIDR rule), any name
//!   on that address is allowed anyway, so TLS passes through; except in `denylist` mode
//!   with `deny` domain rules, whose names a request could otherwise dodge behind an
//!   allowed SNI.
//!
//! It is never set for UDP or for refused connections. (Credentials make the gateway
//! terminate too, whatever the rule says: it injects them into requests.)
//!
//! **Names the resolver answers** ([`EgressPolicy::allows_name`]): a name is resolved iff some
//! connection to it could be allowed by name: in `denylist` mode unless `deny` domain rules
//! cover every port of both protocols for it; in `allowlist` mode only when an `allow`
//! *domain* rule matches it (and is not wholly covered by `deny` domain rules). CIDR rules
//! never make a name resolvable: a name must be allowed by name, so in `allowlist` mode the
//! resolver cannot be used to leak data through the query names of arbitrary domains.
//!
//! # Host names
//!
//! [`Hostname::parse`] accepts only a fully qualified DNS host name and returns its one
//! canonical spelling, so that a rule and a guest's spelling of the same name always compare
//! equal, and two different names never do:
//! - ASCII letters are lower-cased; one trailing dot is removed (more is an empty label).
//! - Each label is letters, digits and hyphens (LDH), 1..=63 bytes, no hyphen at either
//!   end; the whole name is at most 253 bytes. The underscore is refused.
//! - At least two labels: a single label (`localhost`, `metadata`) is refused, as the
//!   gateway has no search domain to complete it with.
//! - IP address literals are refused, including forms URL parsers read as IPv4 (`127.1`,
//!   `0x7f.0.0.1`, `0177.0.0.1`, `2130706433`): any name whose last label is a decimal or
//!   `0x` hexadecimal number. IPv6 literals with or without brackets or zone are refused.
//! - NUL, control characters, white space and the non-ASCII full stops (`。` U+3002, `．`
//!   U+FF0E, `｡` U+FF61, which UTS 46 would map to `.`) are refused rather than mapped:
//!   `example。com` is an error, never `example.com`.
//! - **IDN.** A label with non-ASCII characters is converted to its A-label (`xn--…`) by the
//!   `idna` crate (UTS 46, non-transitional, STD3 ASCII rules, IDNA 2008 hyphen, bidi and
//!   joiner checks), and is accepted only if (a) the result is an `xn--` label and (b) that
//!   A-label decodes back to exactly the input label (after ASCII lower-casing). That is, the
//!   input must already be in the form UTS 46 maps it to: a label that mapping would change
//!   (full-width `ｅxample`, the Kelvin sign `K`, ligatures, soft hyphens and other ignored
//!   characters, non-ASCII capitals like `Ü`, non-NFC sequences) is refused. So a non-ASCII
//!   spelling can never be folded into an existing ASCII name (`ｅxample.com` does not
//!   become `example.com`) nor into another IDN. An ASCII label starting `xn--` must be a
//!   valid A-label of a valid U-label. Look-alikes that IDNA itself allows (`еxample.com`
//!   with a Cyrillic `е`) are accepted *as the different name they are*
//!   (`xn--xample-2of.com`): they match no rule written for `example.com`.
//!
//! [`Hostname::from_sni`] is for TLS server names: ASCII only (RFC 6066 requires A-labels)
//! and no trailing dot (RFC 6066 forbids it), then the same checks.

mod address;
mod ceiling;
mod decision;
mod hostname;
mod names;
mod pattern;
mod policy;
mod rule;

#[cfg(test)]
mod tests;

pub use address::{address_class, embedded_ipv4, non_public_networks, AddressClass};
pub use ceiling::{BeyondCeiling, CeilingGrantError, EgressCeiling, Forbidden, MAX_CEILING_GRANTS};
pub use decision::{ConnectionFacts, Decision, DecisionReason};
pub use hostname::{
    Hostname, HostnameError, MAX_HOSTNAME_BYTES, MAX_HOSTNAME_INPUT_BYTES, MAX_LABEL_BYTES,
};
pub use pattern::{DomainPattern, DomainPatternError};
pub use policy::{EgressMode, EgressPolicy, EgressPolicyError, MAX_EGRESS_RULES};
pub use rule::{
    Destination, EgressRule, PortRange, Protocol, RuleAction, MAX_PORT_RANGES_PER_RULE, MIN_PORT,
};

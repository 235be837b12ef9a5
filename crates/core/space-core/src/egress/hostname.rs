//! Host names: [`Hostname`], the one canonical spelling of a fully qualified DNS name (the
//! rules are in the [module docs](super)), also from a TLS server name
//! ([`Hostname::from_sni`]).

use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};
use serde::{Deserialize, Serialize};

/// Longest host name, in bytes of its ASCII form without the trailing dot (RFC 1035).
pub const MAX_HOSTNAME_BYTES: usize = 253;
/// Longest label of a host name, in bytes of its ASCII form (RFC 1035).
pub const MAX_LABEL_BYTES: usize = 63;
/// Longest input [`Hostname::parse`] looks at, in bytes: a bound on the work done for a
/// hostile string before any conversion (a Unicode label is longer in UTF-8 than the
/// A-label limits allow well before this).
pub const MAX_HOSTNAME_INPUT_BYTES: usize = 1024;

/// Full stops other than `.` that UTS 46 maps to `.`; refused rather than mapped.
const NON_ASCII_DOTS: [char; 3] = ['\u{3002}', '\u{FF0E}', '\u{FF61}'];

/// Why a string is not an acceptable host name. Messages never echo the (hostile) input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostnameError {
    /// Nothing, or only a dot.
    #[error("host name is empty")]
    Empty,
    /// The name (or the raw input) is too long.
    #[error("host name is {len} bytes long; at most {MAX_HOSTNAME_BYTES} are allowed (in its ASCII form, without the trailing dot)")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Two dots in a row, a leading dot, or more than one trailing dot.
    #[error("label {index} of the host name is empty (two dots in a row, a leading dot, or more than one trailing dot)")]
    EmptyLabel {
        /// Index of the label (0-based, from the left).
        index: usize,
    },
    /// A label is longer than 63 bytes.
    #[error("label {index} of the host name is {len} bytes long; at most {MAX_LABEL_BYTES} are allowed (in its ASCII form)")]
    LabelTooLong {
        /// Index of the label (0-based, from the left).
        index: usize,
        /// Its length in bytes (of its A-label for a Unicode label).
        len: usize,
    },
    /// NUL or another control character.
    #[error("host name contains the control character U+{code:04X}")]
    ControlCharacter {
        /// The code point.
        code: u32,
    },
    /// A space or other white space.
    #[error("host name contains white space (U+{code:04X})")]
    Whitespace {
        /// The code point.
        code: u32,
    },
    /// A full stop other than the ASCII dot.
    #[error("host name contains U+{code:04X}, a full stop other than '.'; separate labels with ASCII dots")]
    NonAsciiDot {
        /// The code point.
        code: u32,
    },
    /// An ASCII character that is not a letter, digit, hyphen or dot.
    #[error("host name contains {ch:?}; labels may only have letters, digits and hyphens")]
    InvalidCharacter {
        /// The character.
        ch: char,
    },
    /// A label starts or ends with a hyphen.
    #[error("label {index} of the host name starts or ends with a hyphen")]
    HyphenAtLabelEdge {
        /// Index of the label (0-based, from the left).
        index: usize,
    },
    /// An IP address, or a name URL parsers would read as one.
    #[error("an IP address is not a host name (and a name whose last label is a number reads as one); use a CIDR rule for addresses")]
    IpLiteral,
    /// A name of one label.
    #[error(
        "host name has a single label; a fully qualified name (such as example.com) is required"
    )]
    SingleLabel,
    /// A label IDNA refuses (disallowed characters, bad A-label, hyphen, bidi or joiner rules).
    #[error("label {index} of the host name is not a valid internationalised label (IDNA: UTS 46 with IDNA 2008 checks)")]
    Idna {
        /// Index of the label (0-based, from the left).
        index: usize,
    },
    /// A Unicode label that IDNA mapping would change.
    #[error("label {index} of the host name is not in normalised form (full-width, compatibility or ignored characters, non-ASCII capitals, or not NFC); write it in normalised form or as its xn-- A-label")]
    NotNormalised {
        /// Index of the label (0-based, from the left).
        index: usize,
    },
    /// The name breaks an IDNA rule that spans labels (e.g. the bidirectional-text rule).
    #[error(
        "host name breaks an IDNA rule across its labels (such as the bidirectional text rule)"
    )]
    IdnaName,
    /// A TLS server name with a non-ASCII byte.
    #[error("TLS server name is not ASCII (RFC 6066 requires A-labels)")]
    SniNotAscii,
    /// A TLS server name ending in a dot.
    #[error("TLS server name ends in a dot, which RFC 6066 forbids")]
    SniTrailingDot,
}

/// A canonical, fully qualified DNS host name: lower-case ASCII LDH labels (IDN as
/// `xn--` A-labels), no trailing dot, at least two labels, not an IP address. See the
/// [module docs](super) for the exact rules. Serialised as a string; deserialising validates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = String, example = json!("api.example.com")))]
pub struct Hostname(String);

impl Hostname {
    /// Parses and canonicalises a host name (a policy rule, a DNS question, an HTTP `Host`
    /// without its port). Unicode labels become A-labels.
    pub fn parse(input: &str) -> Result<Hostname, HostnameError> {
        canonicalise(input, 2).map(Hostname)
    }

    /// Parses a TLS server name (the SNI `host_name`, RFC 6066): ASCII only, no trailing
    /// dot, then the checks of [`Hostname::parse`].
    pub fn from_sni(sni: &[u8]) -> Result<Hostname, HostnameError> {
        if !sni.is_ascii() {
            return Err(HostnameError::SniNotAscii);
        }
        if sni.ends_with(b".") {
            return Err(HostnameError::SniTrailingDot);
        }
        let s = std::str::from_utf8(sni).map_err(|_| HostnameError::SniNotAscii)?;
        Hostname::parse(s)
    }

    /// The canonical name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The labels, from the left (`www`, `example`, `com`).
    pub fn labels(&self) -> impl DoubleEndedIterator<Item = &str> + '_ {
        self.0.split('.')
    }
}

impl FromStr for Hostname {
    type Err = HostnameError;
    fn from_str(s: &str) -> Result<Self, HostnameError> {
        Hostname::parse(s)
    }
}

impl TryFrom<String> for Hostname {
    type Error = HostnameError;
    fn try_from(s: String) -> Result<Self, HostnameError> {
        Hostname::parse(&s)
    }
}

impl From<Hostname> for String {
    fn from(h: Hostname) -> String {
        h.0
    }
}

impl AsRef<str> for Hostname {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The canonical form of `input`, which must have at least `min_labels` labels.
pub(super) fn canonicalise(input: &str, min_labels: usize) -> Result<String, HostnameError> {
    if input.is_empty() {
        return Err(HostnameError::Empty);
    }
    if input.len() > MAX_HOSTNAME_INPUT_BYTES {
        return Err(HostnameError::TooLong { len: input.len() });
    }
    for c in input.chars() {
        if c.is_control() {
            return Err(HostnameError::ControlCharacter { code: c.into() });
        }
        if c.is_whitespace() {
            return Err(HostnameError::Whitespace { code: c.into() });
        }
        if NON_ASCII_DOTS.contains(&c) {
            return Err(HostnameError::NonAsciiDot { code: c.into() });
        }
    }
    let body = input.strip_suffix('.').unwrap_or(input);
    if body.is_empty() {
        return Err(HostnameError::Empty);
    }
    if looks_like_ip(body) {
        return Err(HostnameError::IpLiteral);
    }
    let labels = body
        .split('.')
        .enumerate()
        .map(|(index, label)| canonical_label(index, label))
        .collect::<Result<Vec<_>, _>>()?;
    if labels.len() < min_labels {
        return Err(HostnameError::SingleLabel);
    }
    let name = labels.join(".");
    if name.len() > MAX_HOSTNAME_BYTES {
        return Err(HostnameError::TooLong { len: name.len() });
    }
    if labels.last().is_some_and(|l| is_numeric_label(l)) {
        return Err(HostnameError::IpLiteral);
    }
    // The rules that span labels (bidi) are checked on the whole name; it must come back
    // unchanged.
    match Uts46::new().to_ascii(
        name.as_bytes(),
        AsciiDenyList::STD3,
        Hyphens::CheckFirstLast,
        DnsLength::Verify,
    ) {
        Ok(checked) if checked == name => Ok(name),
        _ => Err(HostnameError::IdnaName),
    }
}

/// The canonical form of one label (`index` for error messages).
fn canonical_label(index: usize, label: &str) -> Result<String, HostnameError> {
    if label.is_empty() {
        return Err(HostnameError::EmptyLabel { index });
    }
    if label.is_ascii() {
        if let Some(ch) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(HostnameError::InvalidCharacter { ch });
        }
        if label.len() > MAX_LABEL_BYTES {
            return Err(HostnameError::LabelTooLong {
                index,
                len: label.len(),
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(HostnameError::HyphenAtLabelEdge { index });
        }
        let lower = label.to_ascii_lowercase();
        if lower.starts_with("xn--") {
            // An A-label: it must decode to a valid U-label in normalised form, which
            // `to_ascii` checks (and then returns the label unchanged).
            match Uts46::new().to_ascii(
                lower.as_bytes(),
                AsciiDenyList::STD3,
                Hyphens::Check,
                DnsLength::Verify,
            ) {
                Ok(a) if a == lower => {}
                _ => return Err(HostnameError::Idna { index }),
            }
        }
        return Ok(lower);
    }
    // A Unicode label: convert, then insist the conversion changed nothing but the
    // encoding (see the module docs).
    let ascii = Uts46::new()
        .to_ascii(
            label.as_bytes(),
            AsciiDenyList::STD3,
            Hyphens::Check,
            DnsLength::Ignore,
        )
        .map_err(|_| HostnameError::Idna { index })?;
    if !ascii.starts_with("xn--") || ascii.contains('.') {
        return Err(HostnameError::NotNormalised { index });
    }
    let (unicode, decoded) =
        Uts46::new().to_unicode(ascii.as_bytes(), AsciiDenyList::STD3, Hyphens::Check);
    if decoded.is_err() || unicode != label.to_ascii_lowercase() {
        return Err(HostnameError::NotNormalised { index });
    }
    if ascii.len() > MAX_LABEL_BYTES {
        return Err(HostnameError::LabelTooLong {
            index,
            len: ascii.len(),
        });
    }
    Ok(ascii.into_owned())
}

/// Whether `body` (no trailing dot) is an IPv6 literal (bracketed or not, with or without a
/// zone) or reads as IPv4 to a URL parser (its last label is a number).
fn looks_like_ip(body: &str) -> bool {
    let inner = body
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(body);
    let inner = inner.split_once('%').map_or(inner, |(addr, _zone)| addr);
    if inner.parse::<Ipv6Addr>().is_ok() {
        return true;
    }
    body.rsplit('.').next().is_some_and(is_numeric_label)
}

/// Whether a label is a number as the WHATWG URL IPv4 parser reads one: decimal (octal
/// included) or `0x` hexadecimal (`0x` alone is zero).
fn is_numeric_label(label: &str) -> bool {
    let b = label.as_bytes();
    match b.strip_prefix(b"0x").or_else(|| b.strip_prefix(b"0X")) {
        Some(hex) => hex.iter().all(u8::is_ascii_hexdigit),
        None => !b.is_empty() && b.iter().all(u8::is_ascii_digit),
    }
}

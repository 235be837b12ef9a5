//! The text handshake that starts every channel session.
//!
//! ```text
//! host  -> guest   SPACE-HELLO <version> <nonce>\n        (repeated every 250 ms until answered)
//! guest -> host    SPACE-READY <version> <nonce> <boot_id> <daemon_version>\n
//! ```
//!
//! The guest ignores every byte that is not a complete, well-formed HELLO line (stale data
//! from an earlier host connection). After answering READY it drops further HELLO lines (the
//! host's retries) until the HTTP/2 client preface (`PRI * HTTP/2.0`) starts. The host skips
//! everything before the READY line that carries its own nonce. Lines are at most
//! [`crate::limits::MAX_HANDSHAKE_LINE`] bytes. Pure parsing lives here; the I/O loops live in
//! `spaced` and `space-guest-client`.

/// Prefix of the host's line.
pub const HELLO: &str = "SPACE-HELLO";
/// Prefix of the guest's answer.
pub const READY: &str = "SPACE-READY";
/// Prefix of the guest's refusal (unsupported version).
pub const REFUSED: &str = "SPACE-REFUSED";
/// First bytes of the HTTP/2 client preface.
pub const H2_PREFACE_START: &[u8] = b"PRI * HTTP/2.0";

/// A parsed HELLO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version the host speaks.
    pub version: u32,
    /// Host-chosen nonce (1-64 hex chars).
    pub nonce: String,
}

/// A parsed READY.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// Protocol version the guest will speak.
    pub version: u32,
    /// The nonce of the HELLO being answered.
    pub nonce: String,
    /// Random id chosen at guest boot.
    pub boot_id: String,
    /// Daemon version.
    pub daemon_version: String,
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'+')
}

fn is_nonce(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Hello {
    /// The line to send, newline included.
    pub fn encode(&self) -> String {
        format!("{HELLO} {} {}\n", self.version, self.nonce)
    }

    /// Parses one line (without its newline). `None` if it is not a well-formed HELLO.
    pub fn parse(line: &[u8]) -> Option<Hello> {
        let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
        let mut parts = line.split(' ');
        if parts.next()? != HELLO {
            return None;
        }
        let version = parts.next()?.parse().ok()?;
        let nonce = parts.next()?;
        if !is_nonce(nonce) || parts.next().is_some() {
            return None;
        }
        Some(Hello {
            version,
            nonce: nonce.to_owned(),
        })
    }
}

impl Ready {
    /// The line to send, newline included.
    pub fn encode(&self) -> String {
        format!(
            "{READY} {} {} {} {}\n",
            self.version, self.nonce, self.boot_id, self.daemon_version
        )
    }

    /// Parses one line (without its newline). `None` if it is not a well-formed READY.
    pub fn parse(line: &[u8]) -> Option<Ready> {
        let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
        let mut parts = line.split(' ');
        if parts.next()? != READY {
            return None;
        }
        let version = parts.next()?.parse().ok()?;
        let nonce = parts.next()?;
        let boot_id = parts.next()?;
        let daemon_version = parts.next()?;
        if !is_nonce(nonce)
            || !is_token(boot_id)
            || !is_token(daemon_version)
            || parts.next().is_some()
        {
            return None;
        }
        Some(Ready {
            version,
            nonce: nonce.to_owned(),
            boot_id: boot_id.to_owned(),
            daemon_version: daemon_version.to_owned(),
        })
    }
}

/// The guest's refusal line for an unsupported version.
pub fn refused(supported: u32) -> String {
    format!("{REFUSED} unsupported-version {supported}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = Hello {
            version: 1,
            nonce: "00ff".into(),
        };
        assert_eq!(Hello::parse(h.encode().trim_end().as_bytes()), Some(h));
        let r = Ready {
            version: 1,
            nonce: "ab".into(),
            boot_id: "x1".into(),
            daemon_version: "0.1.0".into(),
        };
        assert_eq!(Ready::parse(r.encode().trim_end().as_bytes()), Some(r));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            &b"SPACE-HELLO"[..],
            b"SPACE-HELLO x 00",
            b"SPACE-HELLO 1 zz",
            b"SPACE-HELLO 1 00 extra",
            b"\xff\xfe",
            b"PRI * HTTP/2.0",
        ] {
            assert_eq!(Hello::parse(bad), None);
        }
        assert_eq!(Ready::parse(b"SPACE-READY 1 ab x y z"), None);
        assert_eq!(Ready::parse(b"SPACE-READY 1 ab x\ty 1"), None);
    }
}

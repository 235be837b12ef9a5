//! Signed `/files` URLs (the SDKs' `download_url` / `upload_url`): a URL that carries, in
//! place of the access token, `signature = "v1_" + base64(sha256("{path}:{op}:{user}:
//! {token}[:{expiration}]"))` (standard alphabet, no padding) and optionally
//! `signature_expiration` (Unix seconds). It authorises that one operation on that one
//! path as that user, until it expires. Pure; compared in constant time.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a signed URL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `GET /files`.
    Read,
    /// `POST /files`.
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// Prefix of the signature scheme the SDKs use.
const V1: &str = "v1_";

/// The signature of `op` on `path` as `user` (`""`: the default user).
pub fn sign(path: &str, op: Operation, user: &str, token: &str, expiration: Option<i64>) -> String {
    let raw = match expiration {
        None => format!("{path}:{}:{user}:{token}", op.as_str()),
        Some(exp) => format!("{path}:{}:{user}:{token}:{exp}", op.as_str()),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "{V1}{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// A signature as a request presents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presented<'a> {
    /// The `signature` parameter.
    pub signature: &'a str,
    /// The `signature_expiration` parameter.
    pub expiration: Option<i64>,
    /// The `path` parameter, as sent.
    pub path: &'a str,
    /// The `username` parameter (`""` if absent).
    pub user: &'a str,
    /// What the request does.
    pub op: Operation,
}

/// Why a signed URL is refused, in E2B envd's words (`internal/api/auth.go`), which the
/// SDKs show their users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureRefusal {
    /// Neither an access token nor a signature.
    Missing,
    /// Not made with the sandbox's token for this path, operation and user.
    Invalid,
    /// Made right, but its `signature_expiration` has passed.
    Expired,
}

impl std::fmt::Display for SignatureRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for SignatureRefusal {}

impl SignatureRefusal {
    /// The refusal as a static message (what access errors carry).
    pub fn message(self) -> &'static str {
        match self {
            SignatureRefusal::Missing => "missing signature query parameter",
            SignatureRefusal::Invalid => "invalid signature",
            SignatureRefusal::Expired => "signature is already expired",
        }
    }
}

impl Presented<'_> {
    /// Whether it was made with `token` (expired or not).
    pub fn made_with(&self, token: &str) -> bool {
        let expected = sign(self.path, self.op, self.user, token, self.expiration);
        expected.as_bytes().ct_eq(self.signature.as_bytes()).into()
    }

    /// Whether it was made with `token` and has not expired at `now` (Unix seconds); as
    /// E2B, a wrong signature is `Invalid` whatever its expiry.
    pub fn check(&self, token: &str, now: i64) -> Result<(), SignatureRefusal> {
        if !self.made_with(token) {
            return Err(SignatureRefusal::Invalid);
        }
        if self.expiration.is_some_and(|exp| exp < now) {
            return Err(SignatureRefusal::Expired);
        }
        Ok(())
    }

    /// [`Self::check`] as a yes or no.
    pub fn verify(&self, token: &str, now: i64) -> bool {
        self.check(token, now).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdks_and_expire() {
        // python: get_signature("/home/user/a.txt", "read", None, "tok", None)
        let sig = sign("/home/user/a.txt", Operation::Read, "", "tok", None);
        let digest = Sha256::digest(b"/home/user/a.txt:read::tok");
        assert_eq!(
            sig,
            format!(
                "v1_{}",
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
            )
        );
        let p = Presented {
            signature: &sig,
            expiration: None,
            path: "/home/user/a.txt",
            user: "",
            op: Operation::Read,
        };
        assert!(p.verify("tok", 0));
        assert!(!p.verify("other", 0));
        assert!(!Presented {
            op: Operation::Write,
            ..p.clone()
        }
        .verify("tok", 0));
        assert!(!Presented {
            path: "/etc/shadow",
            ..p.clone()
        }
        .verify("tok", 0));
        let timed = sign("/a", Operation::Write, "root", "tok", Some(100));
        let p = Presented {
            signature: &timed,
            expiration: Some(100),
            path: "/a",
            user: "root",
            op: Operation::Write,
        };
        assert!(p.verify("tok", 99));
        assert!(!p.verify("tok", 101), "expired");
        assert_eq!(p.check("tok", 101), Err(SignatureRefusal::Expired));
        assert_eq!(
            p.check("other", 101),
            Err(SignatureRefusal::Invalid),
            "a wrong signature is invalid, expired or not"
        );
        // envd's words (internal/api/auth.go), which the SDKs show.
        for (r, words) in [
            (
                SignatureRefusal::Missing,
                "missing signature query parameter",
            ),
            (SignatureRefusal::Invalid, "invalid signature"),
            (SignatureRefusal::Expired, "signature is already expired"),
        ] {
            assert_eq!(r.to_string(), words);
        }
        assert!(
            !Presented {
                expiration: Some(200),
                ..p
            }
            .verify("tok", 99),
            "extended"
        );
    }
}

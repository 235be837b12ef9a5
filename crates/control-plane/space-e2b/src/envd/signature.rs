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

impl Presented<'_> {
    /// Whether it was made with `token` and has not expired at `now` (Unix seconds).
    pub fn verify(&self, token: &str, now: i64) -> bool {
        if self.expiration.is_some_and(|exp| exp < now) {
            return false;
        }
        let expected = sign(self.path, self.op, self.user, token, self.expiration);
        expected.as_bytes().ct_eq(self.signature.as_bytes()).into()
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

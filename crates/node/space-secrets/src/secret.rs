//! The secret value itself: the one type in this crate that holds credential material.
//!
//! [`SecretValue`] wipes its bytes when dropped (`zeroize`), prints as `[redacted]` through
//! both `Debug` and `Display`, is not `Serialize`, and is bounded in size. Reading the value
//! takes an explicit call to [`SecretValue::expose`], so every place the value leaves this
//! type is greppable. Copies made while building a request (the header value handed to the
//! HTTP stack) are outside our control and are not wiped.

use std::fmt;

use zeroize::Zeroizing;

/// Largest secret value, in bytes.
pub const MAX_SECRET_LEN: usize = 64 * 1024;

/// Why bytes are not an acceptable secret value. Never contains the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Zero bytes.
    #[error("secret value is empty")]
    Empty,
    /// Over [`MAX_SECRET_LEN`].
    #[error("secret value is {len} bytes, more than the {MAX_SECRET_LEN}-byte limit")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Not UTF-8.
    #[error("secret value is not UTF-8")]
    NotUtf8,
    /// Contains a NUL byte.
    #[error("secret value contains a NUL byte")]
    Nul,
    /// Would be used in a header but contains a control character (CR, LF, ...).
    #[error("secret value contains a control character and cannot be used in a header")]
    NotHeaderSafe,
}

/// A credential's value: zeroized on drop, redacted in every formatting, bounded, UTF-8, no
/// NUL. Not `Clone`: share it behind an `Arc`.
pub struct SecretValue(Zeroizing<String>);

impl SecretValue {
    /// Takes ownership of `value` (wiped on error too).
    pub fn new(value: String) -> Result<SecretValue, SecretError> {
        let value = Zeroizing::new(value);
        check(value.as_bytes())?;
        Ok(SecretValue(value))
    }

    /// From bytes (wiped on error too): must be UTF-8.
    pub fn from_bytes(bytes: Zeroizing<Vec<u8>>) -> Result<SecretValue, SecretError> {
        check(&bytes)?;
        let text = std::str::from_utf8(&bytes).map_err(|_| SecretError::NotUtf8)?;
        // Copy into an exactly-sized zeroizing string; the source is wiped when dropped.
        let mut value = Zeroizing::new(String::with_capacity(text.len()));
        value.push_str(text);
        Ok(SecretValue(value))
    }

    /// The value. Every caller is a place the secret leaves this type: keep them few.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A second copy (wiped on drop like the first), for handing to another task.
    pub fn duplicate(&self) -> SecretValue {
        let mut copy = Zeroizing::new(String::with_capacity(self.0.len()));
        copy.push_str(&self.0);
        SecretValue(copy)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true for a constructed value; here for API completeness.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks the value may appear literally in a header value: visible ASCII, space or tab
    /// only (no CR, LF or other control characters; no non-ASCII).
    pub fn check_header_safe(&self) -> Result<(), SecretError> {
        if self.0.bytes().all(crate::rule::header_safe_byte) {
            Ok(())
        } else {
            Err(SecretError::NotHeaderSafe)
        }
    }
}

fn check(bytes: &[u8]) -> Result<(), SecretError> {
    if bytes.is_empty() {
        return Err(SecretError::Empty);
    }
    if bytes.len() > MAX_SECRET_LEN {
        return Err(SecretError::TooLong { len: bytes.len() });
    }
    if bytes.contains(&0) {
        return Err(SecretError::Nul);
    }
    Ok(())
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue([redacted])")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_never_shows_the_value() {
        let v = SecretValue::new("sk-live-very-secret".into()).unwrap();
        assert_eq!(format!("{v:?}"), "SecretValue([redacted])");
        assert_eq!(format!("{v}"), "[redacted]");
        assert_eq!(format!("{v:#?}"), "SecretValue([redacted])");
        assert_eq!(v.expose(), "sk-live-very-secret");
    }

    #[test]
    fn values_are_bounded_and_checked() {
        assert_eq!(
            SecretValue::new(String::new()).unwrap_err(),
            SecretError::Empty
        );
        assert_eq!(
            SecretValue::new("a".repeat(MAX_SECRET_LEN + 1)).unwrap_err(),
            SecretError::TooLong {
                len: MAX_SECRET_LEN + 1
            }
        );
        assert!(SecretValue::new("a".repeat(MAX_SECRET_LEN)).is_ok());
        assert_eq!(
            SecretValue::new("a\0b".into()).unwrap_err(),
            SecretError::Nul
        );
        assert_eq!(
            SecretValue::from_bytes(Zeroizing::new(vec![0xff, 0xfe])).unwrap_err(),
            SecretError::NotUtf8
        );
        let multi = SecretValue::new("line1\nline2".into()).unwrap();
        assert_eq!(multi.check_header_safe(), Err(SecretError::NotHeaderSafe));
        let cr = SecretValue::new("a\rb".into()).unwrap();
        assert_eq!(cr.check_header_safe(), Err(SecretError::NotHeaderSafe));
        assert!(SecretValue::new("tok en\t1".into())
            .unwrap()
            .check_header_safe()
            .is_ok());
    }
}

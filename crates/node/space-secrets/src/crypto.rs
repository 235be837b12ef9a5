//! Authenticated encryption of values at rest: XChaCha20-Poly1305 with a fresh random 24-byte
//! nonce per write (random nonces are safe at this size) and caller-chosen associated data,
//! which binds a ciphertext to the credential it belongs to. Pure: no I/O.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use crate::keyfile::KEY_LEN;

/// Nonce length of XChaCha20-Poly1305.
pub const NONCE_LEN: usize = 24;
/// Authentication tag length (appended to the ciphertext).
pub const TAG_LEN: usize = 16;

/// Encryption or decryption failed. Decryption failure means the ciphertext, the nonce or the
/// associated data changed, or the key is not the one used to encrypt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// Authentication failed on decryption.
    #[error("authentication failed (tampered data, swapped file or wrong key)")]
    Authentication,
    /// Encryption failed (only possible for absurd lengths).
    #[error("encryption failed")]
    Encryption,
    /// The nonce has the wrong length.
    #[error("nonce must be {NONCE_LEN} bytes")]
    NonceLength,
}

/// Encrypts `plaintext` under `key` with associated data `aad`; returns (nonce, ciphertext
/// with tag).
pub fn seal(
    key: &[u8; KEY_LEN],
    aad: &[u8],
    plaintext: &[u8],
) -> Result<([u8; NONCE_LEN], Vec<u8>), CryptoError> {
    let cipher = XChaCha20Poly1305::new(Key::from_slice(key));
    let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
    let ciphertext = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .map_err(|_| CryptoError::Encryption)?;
    Ok((nonce.into(), ciphertext))
}

/// Decrypts and authenticates; the plaintext is wiped when dropped.
pub fn open(
    key: &[u8; KEY_LEN],
    aad: &[u8],
    nonce: &[u8],
    ciphertext: &[u8],
) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    if nonce.len() != NONCE_LEN {
        return Err(CryptoError::NonceLength);
    }
    let cipher = XChaCha20Poly1305::new(Key::from_slice(key));
    cipher
        .decrypt(
            XNonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad,
            },
        )
        .map(Zeroizing::new)
        .map_err(|_| CryptoError::Authentication)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; KEY_LEN] = [7u8; KEY_LEN];

    #[test]
    fn round_trip() {
        let (nonce, ct) = seal(&KEY, b"crd-a", b"hunter2").unwrap();
        assert_eq!(ct.len(), b"hunter2".len() + TAG_LEN);
        assert!(!ct.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(&*open(&KEY, b"crd-a", &nonce, &ct).unwrap(), b"hunter2");
    }

    #[test]
    fn nonces_are_fresh() {
        let (n1, c1) = seal(&KEY, b"", b"x").unwrap();
        let (n2, c2) = seal(&KEY, b"", b"x").unwrap();
        assert_ne!(n1, n2);
        assert_ne!(c1, c2);
    }

    #[test]
    fn any_change_fails_authentication() {
        let (nonce, ct) = seal(&KEY, b"crd-a", b"hunter2").unwrap();
        for i in 0..ct.len() {
            let mut bad = ct.clone();
            bad[i] ^= 1;
            assert_eq!(
                open(&KEY, b"crd-a", &nonce, &bad).unwrap_err(),
                CryptoError::Authentication
            );
        }
        let mut bad_nonce = nonce;
        bad_nonce[0] ^= 1;
        assert!(open(&KEY, b"crd-a", &bad_nonce, &ct).is_err());
        assert!(open(&KEY, b"crd-b", &nonce, &ct).is_err());
        assert!(open(&[8u8; KEY_LEN], b"crd-a", &nonce, &ct).is_err());
        assert_eq!(
            open(&KEY, b"crd-a", &nonce[..23], &ct).unwrap_err(),
            CryptoError::NonceLength
        );
    }
}

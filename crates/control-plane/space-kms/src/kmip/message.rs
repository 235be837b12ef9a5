//! The KMIP 1.4 messages SPACE sends (Encrypt, Decrypt with AES-GCM: 1.4 added their
//! additional data and tag fields) and what it reads from the answers (KMIP 1.4 §4.29,
//! §4.30; result reasons §9.1.3.2.29).

use zeroize::Zeroizing;

use super::ttlv::{Item, Value};
use crate::error::{sanitize, KmsError, Unavailable};

/// KMIP tags used here.
mod tag {
    pub const BATCH_COUNT: u32 = 0x42000D;
    pub const BATCH_ITEM: u32 = 0x42000F;
    pub const BLOCK_CIPHER_MODE: u32 = 0x420011;
    pub const CRYPTOGRAPHIC_ALGORITHM: u32 = 0x420028;
    pub const CRYPTOGRAPHIC_PARAMETERS: u32 = 0x42002B;
    pub const IV_COUNTER_NONCE: u32 = 0x42003D;
    pub const OPERATION: u32 = 0x42005C;
    pub const PROTOCOL_VERSION: u32 = 0x420069;
    pub const PROTOCOL_VERSION_MAJOR: u32 = 0x42006A;
    pub const PROTOCOL_VERSION_MINOR: u32 = 0x42006B;
    pub const REQUEST_HEADER: u32 = 0x420077;
    pub const REQUEST_MESSAGE: u32 = 0x420078;
    pub const REQUEST_PAYLOAD: u32 = 0x420079;
    pub const RESPONSE_MESSAGE: u32 = 0x42007B;
    pub const RESPONSE_PAYLOAD: u32 = 0x42007C;
    pub const RESULT_MESSAGE: u32 = 0x42007D;
    pub const RESULT_REASON: u32 = 0x42007E;
    pub const RESULT_STATUS: u32 = 0x42007F;
    pub const UNIQUE_IDENTIFIER: u32 = 0x420094;
    pub const DATA: u32 = 0x4200C2;
    pub const TAG_LENGTH: u32 = 0x4200CE;
    pub const AEAD_ADDITIONAL_DATA: u32 = 0x4200FE;
    pub const AEAD_TAG: u32 = 0x4200FF;
}

const OPERATION_ENCRYPT: u32 = 0x1F;
const OPERATION_DECRYPT: u32 = 0x20;
const ALGORITHM_AES: u32 = 0x03;
const MODE_GCM: u32 = 0x09;
/// GCM's nonce and tag lengths (NIST SP 800-38D's recommended 96-bit nonce).
pub const GCM_NONCE_LEN: usize = 12;
pub const GCM_TAG_LEN: usize = 16;

/// Result reasons (KMIP 1.4 §9.1.3.2.29) that say something about the key.
const REASON_ITEM_NOT_FOUND: u32 = 0x01;
const REASON_AUTHENTICATION_NOT_SUCCESSFUL: u32 = 0x03;
const REASON_CRYPTOGRAPHIC_FAILURE: u32 = 0x0A;
const REASON_ILLEGAL_OPERATION: u32 = 0x0B;
const REASON_PERMISSION_DENIED: u32 = 0x0C;
const REASON_OBJECT_ARCHIVED: u32 = 0x0D;
const REASON_WRONG_KEY_LIFECYCLE_STATE: u32 = 0x13;

fn request(operation: u32, payload: Vec<Item>) -> Item {
    Item::structure(
        tag::REQUEST_MESSAGE,
        vec![
            Item::structure(
                tag::REQUEST_HEADER,
                vec![
                    Item::structure(
                        tag::PROTOCOL_VERSION,
                        vec![
                            Item::new(tag::PROTOCOL_VERSION_MAJOR, Value::Integer(1)),
                            Item::new(tag::PROTOCOL_VERSION_MINOR, Value::Integer(4)),
                        ],
                    ),
                    Item::new(tag::BATCH_COUNT, Value::Integer(1)),
                ],
            ),
            Item::structure(
                tag::BATCH_ITEM,
                vec![
                    Item::new(tag::OPERATION, Value::Enumeration(operation)),
                    Item::structure(tag::REQUEST_PAYLOAD, payload),
                ],
            ),
        ],
    )
}

fn aes_gcm() -> Item {
    Item::structure(
        tag::CRYPTOGRAPHIC_PARAMETERS,
        vec![
            Item::new(tag::BLOCK_CIPHER_MODE, Value::Enumeration(MODE_GCM)),
            Item::new(
                tag::CRYPTOGRAPHIC_ALGORITHM,
                Value::Enumeration(ALGORITHM_AES),
            ),
            Item::new(tag::TAG_LENGTH, Value::Integer(GCM_TAG_LEN as i32)),
        ],
    )
}

fn bytes(b: &[u8]) -> Value {
    Value::ByteString(Zeroizing::new(b.to_vec()))
}

/// Encrypt `plaintext` with key `uid` (AES-GCM, our `nonce`, `aad` bound).
pub fn encrypt(uid: &str, plaintext: &[u8], nonce: &[u8], aad: &[u8]) -> Item {
    request(
        OPERATION_ENCRYPT,
        vec![
            Item::new(tag::UNIQUE_IDENTIFIER, Value::TextString(uid.to_owned())),
            aes_gcm(),
            Item::new(tag::DATA, bytes(plaintext)),
            Item::new(tag::IV_COUNTER_NONCE, bytes(nonce)),
            Item::new(tag::AEAD_ADDITIONAL_DATA, bytes(aad)),
        ],
    )
}

/// Decrypt `ciphertext` (with its GCM `auth_tag`) with key `uid`.
pub fn decrypt(uid: &str, ciphertext: &[u8], nonce: &[u8], aad: &[u8], auth_tag: &[u8]) -> Item {
    request(
        OPERATION_DECRYPT,
        vec![
            Item::new(tag::UNIQUE_IDENTIFIER, Value::TextString(uid.to_owned())),
            aes_gcm(),
            Item::new(tag::DATA, bytes(ciphertext)),
            Item::new(tag::IV_COUNTER_NONCE, bytes(nonce)),
            Item::new(tag::AEAD_ADDITIONAL_DATA, bytes(aad)),
            Item::new(tag::AEAD_TAG, bytes(auth_tag)),
        ],
    )
}

/// What an Encrypt or Decrypt answered.
#[derive(Debug, Default)]
pub struct CryptoAnswer {
    /// `Data`: the ciphertext or plaintext.
    pub data: Zeroizing<Vec<u8>>,
    /// `Authenticated Encryption Tag` (Encrypt with GCM).
    pub auth_tag: Option<Vec<u8>>,
}

/// The payload of a one-item response, or the failure it reports as our error.
pub fn crypto_answer(response: &Item) -> Result<CryptoAnswer, KmsError> {
    let protocol = |what: &str| KmsError::Protocol(format!("KMIP response: {what}"));
    if response.tag.0 != tag::RESPONSE_MESSAGE {
        return Err(protocol("not a Response Message"));
    }
    let item = response
        .child(tag::BATCH_ITEM)
        .ok_or_else(|| protocol("no Batch Item"))?;
    let status = match item.child(tag::RESULT_STATUS).map(|i| &i.value) {
        Some(Value::Enumeration(s)) => *s,
        _ => return Err(protocol("no Result Status")),
    };
    if status != 0 {
        let reason = match item.child(tag::RESULT_REASON).map(|i| &i.value) {
            Some(Value::Enumeration(r)) => *r,
            _ => 0,
        };
        let message = match item.child(tag::RESULT_MESSAGE).map(|i| &i.value) {
            Some(Value::TextString(m)) => sanitize(m),
            _ => String::new(),
        };
        return Err(failure(status, reason, message));
    }
    let payload = item
        .child(tag::RESPONSE_PAYLOAD)
        .ok_or_else(|| protocol("no Response Payload"))?;
    let field = |t: u32| match payload.child(t).map(|i| &i.value) {
        Some(Value::ByteString(b)) => Some(b.clone()),
        _ => None,
    };
    Ok(CryptoAnswer {
        data: field(tag::DATA).ok_or_else(|| protocol("no Data"))?,
        auth_tag: field(tag::AEAD_TAG).map(|t| t.to_vec()),
    })
}

/// A failed operation as our error: what the key service says about the key is the
/// customer's verdict; anything else is the service misbehaving.
fn failure(status: u32, reason: u32, message: String) -> KmsError {
    let unavailable = |reason| KmsError::KeyUnavailable {
        reason,
        detail: message.clone(),
    };
    match reason {
        REASON_ITEM_NOT_FOUND => unavailable(Unavailable::NotFound),
        // PyKMIP and others answer "Permission Denied" for a key that is not Active
        // (deactivated by a Revoke, compromised); the message says which.
        REASON_PERMISSION_DENIED
        | REASON_ILLEGAL_OPERATION
        | REASON_OBJECT_ARCHIVED
        | REASON_WRONG_KEY_LIFECYCLE_STATE => unavailable(Unavailable::Revoked),
        REASON_AUTHENTICATION_NOT_SUCCESSFUL => unavailable(Unavailable::NotPermitted),
        REASON_CRYPTOGRAPHIC_FAILURE => KmsError::WrappedKeyRejected,
        _ => KmsError::Protocol(format!(
            "operation failed (status {status}, reason 0x{reason:x}): {message}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(batch: Vec<Item>) -> Item {
        Item::structure(
            tag::RESPONSE_MESSAGE,
            vec![Item::structure(tag::BATCH_ITEM, batch)],
        )
    }

    #[test]
    fn requests_carry_version_one_four_and_gcm() {
        let req = encrypt("42", &[1; 32], &[2; 12], b"ctx");
        let header = req.child(tag::REQUEST_HEADER).unwrap();
        let version = header.child(tag::PROTOCOL_VERSION).unwrap();
        assert_eq!(
            version.child(tag::PROTOCOL_VERSION_MINOR).unwrap().value,
            Value::Integer(4)
        );
        let payload = req
            .child(tag::BATCH_ITEM)
            .unwrap()
            .child(tag::REQUEST_PAYLOAD)
            .unwrap();
        let params = payload.child(tag::CRYPTOGRAPHIC_PARAMETERS).unwrap();
        assert_eq!(
            params.child(tag::BLOCK_CIPHER_MODE).unwrap().value,
            Value::Enumeration(MODE_GCM)
        );
    }

    #[test]
    fn failures_map_to_what_the_caller_acts_on() {
        let failed = |reason: u32| {
            answer(vec![
                Item::new(tag::RESULT_STATUS, Value::Enumeration(1)),
                Item::new(tag::RESULT_REASON, Value::Enumeration(reason)),
                Item::new(tag::RESULT_MESSAGE, Value::TextString("the\nkey".into())),
            ])
        };
        assert!(matches!(
            crypto_answer(&failed(REASON_ITEM_NOT_FOUND)),
            Err(KmsError::KeyUnavailable {
                reason: Unavailable::NotFound,
                ..
            })
        ));
        match crypto_answer(&failed(REASON_PERMISSION_DENIED)) {
            Err(KmsError::KeyUnavailable {
                reason: Unavailable::Revoked,
                detail,
            }) => {
                assert_eq!(detail, "the key")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            crypto_answer(&failed(REASON_CRYPTOGRAPHIC_FAILURE)),
            Err(KmsError::WrappedKeyRejected)
        ));
        assert!(matches!(
            crypto_answer(&failed(0x100)),
            Err(KmsError::Protocol(_))
        ));
        assert!(matches!(
            crypto_answer(&answer(vec![])),
            Err(KmsError::Protocol(_))
        ));
        let ok = answer(vec![
            Item::new(tag::RESULT_STATUS, Value::Enumeration(0)),
            Item::structure(
                tag::RESPONSE_PAYLOAD,
                vec![
                    Item::new(tag::DATA, bytes(&[9; 32])),
                    Item::new(tag::AEAD_TAG, bytes(&[8; 16])),
                ],
            ),
        ]);
        let got = crypto_answer(&ok).unwrap();
        assert_eq!(got.data.as_slice(), &[9; 32]);
        assert_eq!(got.auth_tag, Some(vec![8; 16]));
    }
}

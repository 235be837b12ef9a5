//! envd, the in-sandbox API the SDKs call (Connect-RPC over HTTP): its messages, written as
//! serde types in the proto3 JSON mapping ([`process`], [`filesystem`]). Handlers come next.

pub mod filesystem;
pub mod process;

/// `bytes` fields: standard base64 with padding in JSON (proto3 JSON also accepts the
/// URL-safe alphabet and missing padding on input).
pub(crate) mod base64_bytes {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD
            .decode(&text)
            .or_else(|_| URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')))
            .map_err(|_| serde::de::Error::custom("bytes must be base64"))
    }
}

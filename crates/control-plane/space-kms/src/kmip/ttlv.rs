//! KMIP's binary encoding, TTLV (tag, type, length, value; KMIP 1.x §9.1), as a tree of
//! [`Item`]s.
//!
//! Written here rather than taken from a crate: `kmip-protocol` (NLnet Labs) has no Encrypt or
//! Decrypt and closed payload types, and its codec `kmip-ttlv` maps tags through serde
//! renames with string matchers to pick response variants. A plain tree is ~200 lines, and
//! lets the decoder bound what a hostile server can make us allocate ([`MAX_MESSAGE_LEN`],
//! [`MAX_DEPTH`]).

use thiserror::Error;
use zeroize::Zeroizing;

/// Largest message read or written: every message SPACE exchanges is a few hundred bytes.
pub const MAX_MESSAGE_LEN: usize = 64 * 1024;
/// Deepest nesting of structures accepted.
pub const MAX_DEPTH: usize = 16;

/// A three-byte KMIP tag (`0x42xxxx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag(pub u32);

/// One TTLV item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// What it is.
    pub tag: Tag,
    /// Its value.
    pub value: Value,
}

/// A TTLV value, by type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Type 0x01.
    Structure(Vec<Item>),
    /// Type 0x02.
    Integer(i32),
    /// Type 0x03.
    LongInteger(i64),
    /// Type 0x04 (two's complement, big-endian, length a multiple of 8).
    BigInteger(Vec<u8>),
    /// Type 0x05.
    Enumeration(u32),
    /// Type 0x06.
    Boolean(bool),
    /// Type 0x07.
    TextString(String),
    /// Type 0x08 (wiped when dropped: a Decrypt's answer is a plaintext data key).
    ByteString(Zeroizing<Vec<u8>>),
    /// Type 0x09 (seconds since the Unix epoch).
    DateTime(i64),
    /// Type 0x0A (seconds).
    Interval(u32),
}

/// Why bytes are not a TTLV message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TtlvError {
    /// Fewer bytes than an item announces.
    #[error("TTLV: truncated")]
    Truncated,
    /// More bytes than [`MAX_MESSAGE_LEN`].
    #[error("TTLV: message longer than {MAX_MESSAGE_LEN} bytes")]
    TooLong,
    /// Structures nested deeper than [`MAX_DEPTH`].
    #[error("TTLV: nested deeper than {MAX_DEPTH}")]
    TooDeep,
    /// An unknown type byte.
    #[error("TTLV: unknown type 0x{0:02x}")]
    UnknownType(u8),
    /// A length that does not fit its type.
    #[error("TTLV: length {len} is wrong for type 0x{ty:02x}")]
    BadLength {
        /// The type.
        ty: u8,
        /// The announced length.
        len: u32,
    },
    /// A text string that is not UTF-8.
    #[error("TTLV: text string is not UTF-8")]
    NotUtf8,
    /// Bytes left after the message.
    #[error("TTLV: trailing bytes")]
    Trailing,
}

impl Item {
    /// An item.
    pub fn new(tag: u32, value: Value) -> Item {
        Item {
            tag: Tag(tag),
            value,
        }
    }

    /// A structure of `items`.
    pub fn structure(tag: u32, items: Vec<Item>) -> Item {
        Item::new(tag, Value::Structure(items))
    }

    /// The first child with `tag`, if this is a structure.
    pub fn child(&self, tag: u32) -> Option<&Item> {
        match &self.value {
            Value::Structure(items) => items.iter().find(|i| i.tag.0 == tag),
            _ => None,
        }
    }

    /// The item's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.tag.0.to_be_bytes()[1..]);
        let (ty, body): (u8, Vec<u8>) = match &self.value {
            Value::Structure(items) => {
                let mut body = Vec::new();
                for item in items {
                    item.encode_into(&mut body);
                }
                (0x01, body)
            }
            Value::Integer(v) => (0x02, v.to_be_bytes().to_vec()),
            Value::LongInteger(v) => (0x03, v.to_be_bytes().to_vec()),
            Value::BigInteger(v) => (0x04, v.clone()),
            Value::Enumeration(v) => (0x05, v.to_be_bytes().to_vec()),
            Value::Boolean(v) => (0x06, u64::from(*v).to_be_bytes().to_vec()),
            Value::TextString(v) => (0x07, v.as_bytes().to_vec()),
            Value::ByteString(v) => (0x08, v.to_vec()),
            Value::DateTime(v) => (0x09, v.to_be_bytes().to_vec()),
            Value::Interval(v) => (0x0A, v.to_be_bytes().to_vec()),
        };
        out.push(ty);
        // Every message we build is far below 4 GiB.
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out.resize(out.len() + padding(body.len()), 0);
    }

    /// One whole message: exactly one item, nothing after it.
    pub fn decode(bytes: &[u8]) -> Result<Item, TtlvError> {
        if bytes.len() > MAX_MESSAGE_LEN {
            return Err(TtlvError::TooLong);
        }
        let (item, used) = decode_item(bytes, 0)?;
        if used != bytes.len() {
            return Err(TtlvError::Trailing);
        }
        Ok(item)
    }
}

/// Zero bytes after a value of `len` bytes, to the next multiple of 8.
fn padding(len: usize) -> usize {
    (8 - len % 8) % 8
}

/// The length of a whole item whose 8-byte header is `header` (for reading one message off a
/// stream): header plus padded value.
pub fn item_len(header: &[u8; 8]) -> Result<usize, TtlvError> {
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let total = 8 + len + padding(len);
    if total > MAX_MESSAGE_LEN {
        return Err(TtlvError::TooLong);
    }
    Ok(total)
}

fn decode_item(bytes: &[u8], depth: usize) -> Result<(Item, usize), TtlvError> {
    if depth > MAX_DEPTH {
        return Err(TtlvError::TooDeep);
    }
    let header = bytes.get(..8).ok_or(TtlvError::Truncated)?;
    let tag = u32::from_be_bytes([0, header[0], header[1], header[2]]);
    let ty = header[3];
    let len32 = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let len = len32 as usize;
    let padded = len.checked_add(padding(len)).ok_or(TtlvError::TooLong)?;
    let body = bytes
        .get(8..8usize.saturating_add(len))
        .ok_or(TtlvError::Truncated)?;
    if bytes.len() < 8 + padded {
        return Err(TtlvError::Truncated);
    }
    let bad = || TtlvError::BadLength { ty, len: len32 };
    let fixed = |n: usize| -> Result<&[u8], TtlvError> {
        if len == n {
            Ok(body)
        } else {
            Err(bad())
        }
    };
    let value = match ty {
        0x01 => {
            let mut items = Vec::new();
            let mut at = 0;
            while at < body.len() {
                let (item, used) = decode_item(&body[at..], depth + 1)?;
                items.push(item);
                at += used;
            }
            Value::Structure(items)
        }
        0x02 => Value::Integer(i32::from_be_bytes(arr4(fixed(4)?))),
        0x03 => Value::LongInteger(i64::from_be_bytes(arr8(fixed(8)?))),
        0x04 => {
            if !len.is_multiple_of(8) {
                return Err(bad());
            }
            Value::BigInteger(body.to_vec())
        }
        0x05 => Value::Enumeration(u32::from_be_bytes(arr4(fixed(4)?))),
        0x06 => Value::Boolean(u64::from_be_bytes(arr8(fixed(8)?)) != 0),
        0x07 => Value::TextString(
            std::str::from_utf8(body)
                .map_err(|_| TtlvError::NotUtf8)?
                .to_owned(),
        ),
        0x08 => Value::ByteString(Zeroizing::new(body.to_vec())),
        0x09 => Value::DateTime(i64::from_be_bytes(arr8(fixed(8)?))),
        0x0A => Value::Interval(u32::from_be_bytes(arr4(fixed(4)?))),
        other => return Err(TtlvError::UnknownType(other)),
    };
    Ok((Item::new(tag, value), 8 + padded))
}

fn arr4(b: &[u8]) -> [u8; 4] {
    let mut a = [0; 4];
    a.copy_from_slice(b);
    a
}

fn arr8(b: &[u8]) -> [u8; 8] {
    let mut a = [0; 8];
    a.copy_from_slice(b);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KMIP 1.0 §9.1.2's examples.
    #[test]
    fn the_specifications_examples_encode_byte_for_byte() {
        let int = Item::new(0x420020, Value::Integer(8));
        assert_eq!(hex(&int.encode()), "42002002000000040000000800000000");
        let text = Item::new(0x420020, Value::TextString("Hello World".into()));
        assert_eq!(
            hex(&text.encode()),
            "420020070000000b48656c6c6f20576f726c640000000000"
        );
        let s = Item::structure(
            0x420020,
            vec![
                Item::new(0x420004, Value::Enumeration(254)),
                Item::new(0x420005, Value::Integer(255)),
            ],
        );
        assert_eq!(
            hex(&s.encode()),
            "42002001000000204200040500000004000000fe000000004200050200000004000000ff00000000"
        );
        assert_eq!(Item::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn every_type_round_trips() {
        let all = Item::structure(
            0x420001,
            vec![
                Item::new(0x420002, Value::LongInteger(-5)),
                Item::new(0x420003, Value::BigInteger(vec![1; 16])),
                Item::new(0x420004, Value::Boolean(true)),
                Item::new(0x420005, Value::ByteString(Zeroizing::new(vec![7; 13]))),
                Item::new(0x420006, Value::DateTime(1_700_000_000)),
                Item::new(0x420007, Value::Interval(86400)),
                Item::structure(0x420008, vec![]),
            ],
        );
        let bytes = all.encode();
        assert_eq!(bytes.len() % 8, 0);
        assert_eq!(Item::decode(&bytes).unwrap(), all);
        assert_eq!(
            item_len(bytes[..8].try_into().unwrap()).unwrap(),
            bytes.len()
        );
    }

    #[test]
    fn hostile_bytes_are_refused_without_panics() {
        let good = Item::structure(
            0x420001,
            vec![Item::new(0x420002, Value::TextString("abc".into()))],
        )
        .encode();
        for cut in 0..good.len() {
            assert!(Item::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = good.clone();
        trailing.extend_from_slice(&[0; 8]);
        assert_eq!(Item::decode(&trailing), Err(TtlvError::Trailing));
        let mut huge = good.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Item::decode(&huge).is_err());
        let mut unknown = good.clone();
        unknown[3] = 0x0B;
        assert_eq!(Item::decode(&unknown), Err(TtlvError::UnknownType(0x0B)));
        let mut bad_int = Item::new(0x420002, Value::Integer(1)).encode();
        bad_int[7] = 8;
        bad_int.extend_from_slice(&[0; 8]);
        assert!(matches!(
            Item::decode(&bad_int),
            Err(TtlvError::BadLength { .. })
        ));
        // Structures nested beyond the bound.
        let mut deep = Item::structure(0x420001, vec![]);
        for _ in 0..MAX_DEPTH + 1 {
            deep = Item::structure(0x420001, vec![deep]);
        }
        assert_eq!(Item::decode(&deep.encode()), Err(TtlvError::TooDeep));
        // Every single-byte corruption decodes or fails; none panics.
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0xff;
            let _ = Item::decode(&b);
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}

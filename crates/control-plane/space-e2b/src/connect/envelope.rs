//! Envelopes: each message of a streaming call is one flags byte, a 4-byte big-endian
//! length, then the payload. Flag `0x01` marks a compressed payload (the SDKs never send
//! one: refused), `0x02` the end-of-stream envelope that closes a response.
//!
//! The decoder is incremental (a request body arrives in chunks of any size) and bounded:
//! a declared length over [`MAX_MESSAGE_BYTES`] is refused before anything is buffered.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Flag: the payload is compressed.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag: the end-of-stream envelope.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Bytes before the payload.
pub const PREFIX_LEN: usize = 5;
/// Largest message accepted (the SDKs' stdin chunks and file events are far smaller; a
/// file's bytes go over `/files`, not Connect).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// One framed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The flags byte.
    pub flags: u8,
    /// The payload (a JSON message, or the end-of-stream JSON).
    pub payload: Bytes,
}

/// Why a stream's framing was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The declared length is over the bound.
    #[error("message of {len} bytes is larger than the {MAX_MESSAGE_BYTES}-byte limit")]
    TooLarge {
        /// The declared length.
        len: usize,
    },
    /// A compressed message (no compression was negotiated).
    #[error("compressed message, but no compression was negotiated")]
    Compressed,
    /// Flags this version does not know.
    #[error("unknown envelope flags {0:#04x}")]
    UnknownFlags(u8),
    /// The stream ended inside an envelope.
    #[error("the stream ended inside a message ({0} bytes left over)")]
    Truncated(usize),
}

impl Envelope {
    /// A message envelope.
    pub fn message(payload: impl Into<Bytes>) -> Envelope {
        Envelope {
            flags: 0,
            payload: payload.into(),
        }
    }

    /// The end-of-stream envelope carrying `json`.
    pub fn end_of_stream(json: impl Into<Bytes>) -> Envelope {
        Envelope {
            flags: FLAG_END_STREAM,
            payload: json.into(),
        }
    }

    /// Whether it ends the stream.
    pub fn is_end_of_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }

    /// The framed bytes.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(PREFIX_LEN + self.payload.len());
        out.put_u8(self.flags);
        // Payloads we send are bounded far below 4 GiB (one message or trailer).
        out.put_u32(u32::try_from(self.payload.len()).unwrap_or(u32::MAX));
        out.put_slice(&self.payload);
        out.freeze()
    }
}

/// Splits a byte stream into envelopes as its chunks arrive.
#[derive(Debug, Default)]
pub struct EnvelopeDecoder {
    buf: BytesMut,
}

impl EnvelopeDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a chunk of the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete envelope, `None` until one is complete. Checks the flags and the
    /// length as soon as the prefix is in, before the payload is buffered.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, EnvelopeError> {
        if self.buf.len() < PREFIX_LEN {
            return Ok(None);
        }
        let flags = self.buf[0];
        if flags & FLAG_COMPRESSED != 0 {
            return Err(EnvelopeError::Compressed);
        }
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(EnvelopeError::UnknownFlags(flags));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE_BYTES {
            return Err(EnvelopeError::TooLarge { len });
        }
        if self.buf.len() < PREFIX_LEN + len {
            return Ok(None);
        }
        self.buf.advance(PREFIX_LEN);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Envelope { flags, payload }))
    }

    /// At the end of the stream: an error if bytes of an unfinished envelope are left.
    pub fn finish(&self) -> Result<(), EnvelopeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(EnvelopeError::Truncated(self.buf.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_across_any_chunking() {
        let a = Envelope::message(&b"{\"pid\":7}"[..]);
        let end = Envelope::end_of_stream(&b"{}"[..]);
        let mut wire = a.encode().to_vec();
        wire.extend_from_slice(&end.encode());
        assert_eq!(&wire[..5], &[0, 0, 0, 0, 9]);
        for chunk in 1..wire.len() {
            let mut d = EnvelopeDecoder::new();
            let mut got = Vec::new();
            for c in wire.chunks(chunk) {
                d.push(c);
                while let Some(e) = d.next_envelope().unwrap() {
                    got.push(e);
                }
            }
            d.finish().unwrap();
            assert_eq!(got, vec![a.clone(), end.clone()], "chunks of {chunk}");
            assert!(got[1].is_end_of_stream() && !got[0].is_end_of_stream());
        }
    }

    #[test]
    fn bad_framing_is_refused_before_buffering() {
        let mut d = EnvelopeDecoder::new();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            d.next_envelope(),
            Err(EnvelopeError::TooLarge {
                len: u32::MAX as usize
            })
        );
        let mut d = EnvelopeDecoder::new();
        d.push(&[FLAG_COMPRESSED, 0, 0, 0, 1, b'x']);
        assert_eq!(d.next_envelope(), Err(EnvelopeError::Compressed));
        let mut d = EnvelopeDecoder::new();
        d.push(&[0x80, 0, 0, 0, 0]);
        assert_eq!(d.next_envelope(), Err(EnvelopeError::UnknownFlags(0x80)));
        let mut d = EnvelopeDecoder::new();
        d.push(&[0, 0, 0, 0, 3, b'a']);
        assert_eq!(d.next_envelope(), Ok(None));
        assert_eq!(d.finish(), Err(EnvelopeError::Truncated(6)));
    }
}

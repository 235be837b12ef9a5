//! Scrubbing injected values out of responses (issue 12, item 7).
//!
//! A request the gateway injected a credential into may come back with it: an echo endpoint,
//! a debug page that shows request headers, an error that quotes the `Authorization` it
//! refused. Before such a response reaches the guest, every occurrence of each injected value
//! is masked — in header values and in the body, also across the body's chunk boundaries —
//! in the forms it is commonly returned in:
//! - as is, JSON-escaped, percent-encoded, hex (lower and upper case);
//! - base64 (standard and URL-safe alphabets), at each of the three alignments it can have
//!   inside a longer encoded string (so `Basic base64(user:value)` and a base64 of a whole
//!   request are caught, not only base64 of the value alone).
//!
//! Masking replaces each byte of a match with `*`: lengths stay the same (no
//! `Content-Length` to rewrite), and nothing of the value is left. Values shorter than
//! [`MIN_SCRUBBED_LEN`] bytes are not scrubbed (they would mask innocent text, and are no
//! secret worth the name). What this cannot catch, and the docs say so: a response the host
//! compressed (the gateway asks credentialed hosts for `identity` encoding, but a host may
//! ignore it), encrypted, hashed or otherwise transformed the value in.

use std::sync::Arc;

use aho_corasick::AhoCorasick;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use base64::Engine;
use zeroize::Zeroizing;

/// Shortest value that is scrubbed.
pub const MIN_SCRUBBED_LEN: usize = 8;
/// The byte a match is replaced with.
pub const MASK: u8 = b'*';

/// The forms of some values to mask. Debug prints no needle.
pub struct Scrubber {
    matcher: AhoCorasick,
    /// The longest needle, bytes: how much of a stream is held back for a match that
    /// continues in the next chunk.
    longest: usize,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("needles", &self.matcher.patterns_len())
            .finish_non_exhaustive()
    }
}

/// `value` as it may come back, each form at least [`MIN_SCRUBBED_LEN`] bytes.
pub fn encodings(value: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    if value.len() < MIN_SCRUBBED_LEN {
        return Vec::new();
    }
    let mut out: Vec<Zeroizing<Vec<u8>>> = vec![Zeroizing::new(value.to_vec())];
    if let Ok(text) = std::str::from_utf8(value) {
        if let Ok(json) = serde_json::to_string(text).map(Zeroizing::new) {
            // Without the quotes.
            out.push(Zeroizing::new(json.as_bytes()[1..json.len() - 1].to_vec()));
        }
    }
    out.push(percent_encoded(value));
    let hex = Zeroizing::new(value.iter().flat_map(|b| hex_pair(*b)).collect::<Vec<u8>>());
    out.push(Zeroizing::new(hex.to_ascii_uppercase()));
    out.push(hex);
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        for offset in 0..3 {
            out.push(base64_fragment(engine, value, offset));
        }
    }
    out.retain(|n| n.len() >= MIN_SCRUBBED_LEN);
    out.sort_by(|a, b| a.as_slice().cmp(b.as_slice()));
    out.dedup_by(|a, b| a.as_slice() == b.as_slice());
    out
}

fn hex_pair(b: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]]
}

/// Every byte but RFC 3986's unreserved ones as `%XX` (upper case, as most encoders write).
fn percent_encoded(value: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * 3));
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.push(b'%');
            out.extend(hex_pair(b).iter().map(u8::to_ascii_uppercase));
        }
    }
    out
}

/// The base64 characters that encode only bytes of `value` when it starts `offset` bytes
/// (0-2) into a longer encoded string: whatever precedes and follows it, these characters
/// appear in its encoding.
fn base64_fragment(
    engine: &base64::engine::GeneralPurpose,
    value: &[u8],
    offset: usize,
) -> Zeroizing<Vec<u8>> {
    let mut input = Zeroizing::new(vec![0u8; offset]);
    input.extend_from_slice(value);
    let encoded = Zeroizing::new(engine.encode(input.as_slice()));
    // Character i covers bits 6i..6i+6: it is the value's alone from the first character
    // past the offset's 8·offset bits to the last whole one before the end.
    let first = (8 * offset).div_ceil(6);
    let end = (8 * (offset + value.len())) / 6;
    Zeroizing::new(encoded.as_bytes()[first..end.max(first)].to_vec())
}

impl Scrubber {
    /// A scrubber of `values` in all their [`encodings`]; `None` when none is long enough
    /// to scrub.
    pub fn new<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Arc<Scrubber>> {
        let needles: Vec<Zeroizing<Vec<u8>>> = values.into_iter().flat_map(encodings).collect();
        let longest = needles.iter().map(|n| n.len()).max()?;
        let matcher = AhoCorasick::new(needles.iter().map(|n| n.as_slice())).ok()?;
        Some(Arc::new(Scrubber { matcher, longest }))
    }

    /// Masks every match in `buf`; whether there was one.
    pub fn mask(&self, buf: &mut [u8]) -> bool {
        let spans: Vec<(usize, usize)> = self
            .matcher
            .find_overlapping_iter(&*buf)
            .map(|m| (m.start(), m.end()))
            .collect();
        for &(start, end) in &spans {
            buf[start..end].fill(MASK);
        }
        !spans.is_empty()
    }

    /// A scrubber of one stream (a response body).
    pub fn stream(self: &Arc<Self>) -> StreamScrubber {
        StreamScrubber {
            scrubber: Arc::clone(self),
            held: Vec::new(),
            masked: false,
        }
    }
}

/// Masks matches in a stream fed chunk by chunk, holding back the bytes a match could still
/// continue from (one needle length less a byte) until the next chunk or the end.
pub struct StreamScrubber {
    scrubber: Arc<Scrubber>,
    held: Vec<u8>,
    masked: bool,
}

impl StreamScrubber {
    /// The next chunk in; what may go out now (possibly nothing).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(chunk);
        self.masked |= self.scrubber.mask(&mut buf);
        // A match starting before `keep_from` ends within `buf`, so it is masked already;
        // one starting later may go on in the next chunk.
        let keep_from = buf.len().saturating_sub(self.scrubber.longest - 1);
        self.held = buf.split_off(keep_from);
        buf
    }

    /// The end of the stream: what is still held back.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }

    /// Whether anything was masked so far.
    pub fn masked(&self) -> bool {
        self.masked
    }
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::STANDARD;

    use super::*;

    const SECRET: &str = "sk-live-7c1e9a3b5d2f";

    fn scrubbed(text: &[u8]) -> Vec<u8> {
        let s = Scrubber::new([SECRET.as_bytes()]).unwrap();
        let mut buf = text.to_vec();
        s.mask(&mut buf);
        buf
    }

    fn has_secret_trace(buf: &[u8]) -> bool {
        let s = Scrubber::new([SECRET.as_bytes()]).unwrap();
        s.matcher.find(buf).is_some()
    }

    #[test]
    fn masks_the_value_and_its_encodings_keeping_the_length() {
        let basic = format!("Basic {}", STANDARD.encode(format!("user:{SECRET}")));
        let whole_request = STANDARD.encode(format!(
            "GET / HTTP/1.1\r\nAuthorization: Bearer {SECRET}\r\n"
        ));
        for text in [
            format!("{{\"authorization\": \"Bearer {SECRET}\"}}"),
            SECRET
                .bytes()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            SECRET
                .bytes()
                .map(|b| format!("{b:02X}"))
                .collect::<String>(),
            basic,
            whole_request,
            URL_SAFE_NO_PAD.encode(format!("xy{SECRET}z")),
        ] {
            let out = scrubbed(text.as_bytes());
            assert_eq!(out.len(), text.len());
            assert_ne!(out, text.as_bytes(), "{text}");
            assert!(!has_secret_trace(&out), "{text}");
        }
        let out = scrubbed(format!("?key={SECRET}&x=1").as_bytes());
        assert_eq!(
            out,
            format!("?key={}&x=1", "*".repeat(SECRET.len())).as_bytes()
        );
        // A value with reserved characters, percent-encoded as a query echo shows it.
        let s = Scrubber::new([b"pa ss/w:rd+secret".as_slice()]).unwrap();
        let encoded = "pa%20ss%2Fw%3Ard%2Bsecret";
        let mut buf = format!("?p={encoded}").into_bytes();
        assert!(s.mask(&mut buf));
        assert_eq!(buf, format!("?p={}", "*".repeat(encoded.len())).as_bytes());
        // Innocent text is untouched.
        assert_eq!(scrubbed(b"nothing to see here"), b"nothing to see here");
    }

    #[test]
    fn short_values_are_not_scrubbed() {
        assert!(Scrubber::new([b"short".as_slice()]).is_none());
        assert!(encodings(b"1234567").is_empty());
    }

    #[test]
    fn a_match_split_across_chunks_is_masked() {
        let s = Scrubber::new([SECRET.as_bytes()]).unwrap();
        let body = format!("head {SECRET} middle {SECRET}");
        for split in 0..body.len() {
            for step in [1, 3, 7, 64] {
                let mut stream = s.stream();
                let mut out = Vec::new();
                let (a, b) = body.as_bytes().split_at(split);
                out.extend(stream.feed(a));
                for chunk in b.chunks(step) {
                    out.extend(stream.feed(chunk));
                }
                out.extend(stream.finish());
                assert_eq!(out.len(), body.len());
                assert!(!out.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
                assert!(stream.masked());
                assert!(
                    out.starts_with(b"head *"),
                    "{}",
                    String::from_utf8_lossy(&out)
                );
            }
        }
    }

    #[test]
    fn debug_prints_no_needle() {
        let s = Scrubber::new([SECRET.as_bytes()]).unwrap();
        assert!(!format!("{s:?}").contains("sk-live"));
    }
}

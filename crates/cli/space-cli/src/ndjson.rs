//! Splitting a byte stream into NDJSON lines, with a bound on the line length (the server
//! is trusted more than a guest, but a client must not buffer without limit either).

use bytes::{Buf, Bytes, BytesMut};

/// A line was longer than allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NDJSON line longer than {0} bytes")]
pub struct LineTooLong(pub usize);

/// Accumulates chunks and yields complete lines (without the newline).
#[derive(Debug)]
pub struct Lines {
    buf: BytesMut,
    max: usize,
}

impl Lines {
    /// A splitter refusing lines longer than `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            max,
        }
    }

    /// Adds a chunk.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete, non-empty line, if any.
    pub fn next_line(&mut self) -> Result<Option<Bytes>, LineTooLong> {
        loop {
            match self.buf.iter().position(|&b| b == b'\n') {
                Some(i) if i > self.max => return Err(LineTooLong(self.max)),
                Some(i) => {
                    let line = self.buf.split_to(i).freeze();
                    self.buf.advance(1);
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    return Ok(Some(line));
                }
                None if self.buf.len() > self.max => return Err(LineTooLong(self.max)),
                None => return Ok(None),
            }
        }
    }

    /// What is left at the end of the stream (a last line without newline), if anything.
    pub fn finish(&mut self) -> Option<Bytes> {
        let rest = self.buf.split().freeze();
        (!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_across_chunks() {
        let mut l = Lines::new(100);
        l.push(b"{\"a\":1}\n{\"b\"");
        assert_eq!(l.next_line().unwrap().as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(l.next_line().unwrap(), None);
        l.push(b":2}\n\n");
        assert_eq!(l.next_line().unwrap().as_deref(), Some(&b"{\"b\":2}"[..]));
        assert_eq!(l.next_line().unwrap(), None);
        l.push(b"tail");
        assert_eq!(l.finish().as_deref(), Some(&b"tail"[..]));
    }

    #[test]
    fn bounds_lines() {
        let mut l = Lines::new(4);
        l.push(b"12345");
        assert!(l.next_line().is_err());
    }
}

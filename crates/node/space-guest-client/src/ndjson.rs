//! Bounded newline-delimited JSON: splits a byte stream into lines without ever holding
//! more than one line plus one received chunk, and parses output events from them.
//!
//! Pure (no I/O): the stream adapter in `stream.rs` feeds it chunks as they arrive.

use bytes::{Bytes, BytesMut};
use space_core::process::{OutputEvent, MAX_OUTPUT_CHUNK};

/// Why the byte stream is not acceptable NDJSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// A line is longer than the limit.
    #[error("line longer than {0} bytes")]
    TooLong(usize),
}

/// Splits pushed bytes into lines of at most `max` bytes (newline and a trailing `\r`
/// excluded).
#[derive(Debug)]
pub struct LineDecoder {
    buf: BytesMut,
    /// Bytes at the start of `buf` already known to hold no newline.
    scanned: usize,
    max: usize,
}

impl LineDecoder {
    /// A decoder for lines of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            scanned: 0,
            max,
        }
    }

    /// Appends received bytes. Call [`LineDecoder::next_line`] until it returns `None`
    /// before pushing more, so the buffer stays bounded.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes currently buffered.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete line, without its newline (and `\r`), if one is buffered.
    pub fn next_line(&mut self) -> Result<Option<Bytes>, LineError> {
        match self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(pos) => {
                let end = self.scanned + pos;
                let mut line = self.buf.split_to(end + 1);
                self.scanned = 0;
                line.truncate(end);
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                if line.len() > self.max {
                    return Err(LineError::TooLong(self.max));
                }
                Ok(Some(line.freeze()))
            }
            None => {
                self.scanned = self.buf.len();
                // The +1 leaves room for a '\r' that may precede the newline still to come.
                if self.buf.len() > self.max + 1 {
                    return Err(LineError::TooLong(self.max));
                }
                Ok(None)
            }
        }
    }

    /// At end of input: the last line if it had no newline, or `None`.
    pub fn finish(&mut self) -> Result<Option<Bytes>, LineError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        self.buf.extend_from_slice(b"\n");
        self.next_line()
    }
}

/// Why a line is not an acceptable output event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// Not JSON, or not an output event.
    #[error("bad output event: {0}")]
    Json(String),
    /// A data event whose data is not base64 or is larger than a chunk may be.
    #[error("bad output event: data is not base64 of at most {MAX_OUTPUT_CHUNK} bytes")]
    Data,
}

/// Parses one NDJSON line into an [`OutputEvent`], checking that data events decode.
/// `Ok(None)` for a blank line (tolerated between events).
pub fn parse_event(line: &[u8]) -> Result<Option<OutputEvent>, EventError> {
    if line.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    let event: OutputEvent =
        serde_json::from_slice(line).map_err(|e| EventError::Json(e.to_string()))?;
    if let OutputEvent::Data { .. } = &event {
        match event.bytes() {
            Some((_, bytes)) if bytes.len() <= MAX_OUTPUT_CHUNK => {}
            _ => return Err(EventError::Data),
        }
    }
    Ok(Some(event))
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_core::process::{ExitStatus, OutputStream};

    fn lines(dec: &mut LineDecoder) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(l) = dec.next_line().unwrap() {
            out.push(l.to_vec());
        }
        out
    }

    #[test]
    fn splits_lines_across_chunks() {
        let mut dec = LineDecoder::new(16);
        dec.push(b"ab");
        assert!(lines(&mut dec).is_empty());
        dec.push(b"c\nde\r\nf");
        assert_eq!(lines(&mut dec), vec![b"abc".to_vec(), b"de".to_vec()]);
        dec.push(b"g\n\n");
        assert_eq!(lines(&mut dec), vec![b"fg".to_vec(), b"".to_vec()]);
        assert_eq!(dec.finish().unwrap(), None);
        dec.push(b"tail");
        assert_eq!(dec.finish().unwrap().as_deref(), Some(&b"tail"[..]));
    }

    #[test]
    fn oversize_line_is_refused_without_waiting_for_newline() {
        let mut dec = LineDecoder::new(8);
        dec.push(b"12345678\n");
        assert_eq!(lines(&mut dec), vec![b"12345678".to_vec()]);
        dec.push(b"123456789");
        // 9 bytes may still be 8 + '\r'; one more byte without a newline is too many.
        assert_eq!(dec.next_line(), Ok(None));
        dec.push(b"0");
        assert_eq!(dec.next_line(), Err(LineError::TooLong(8)));
        let mut dec = LineDecoder::new(8);
        dec.push(b"123456789\n");
        assert_eq!(dec.next_line(), Err(LineError::TooLong(8)));
    }

    #[test]
    fn endless_line_stays_bounded() {
        let mut dec = LineDecoder::new(1024);
        let chunk = [b'x'; 100];
        let mut failed = false;
        for _ in 0..10_000 {
            dec.push(&chunk);
            if dec.next_line().is_err() {
                failed = true;
                break;
            }
            assert!(dec.buffered() <= 1025);
        }
        assert!(failed);
    }

    #[test]
    fn parses_events() {
        let ev = OutputEvent::data(1, OutputStream::Stdout, b"hello");
        let line = serde_json::to_vec(&ev).unwrap();
        assert_eq!(parse_event(&line), Ok(Some(ev)));
        let exit = OutputEvent::Exit {
            seq: 2,
            status: ExitStatus {
                exit_code: Some(0),
                signal: None,
                timed_out: false,
            },
        };
        assert_eq!(
            parse_event(&serde_json::to_vec(&exit).unwrap()),
            Ok(Some(exit))
        );
        assert_eq!(parse_event(b"  "), Ok(None));
    }

    #[test]
    fn refuses_bad_events() {
        assert!(matches!(
            parse_event(b"{not json"),
            Err(EventError::Json(_))
        ));
        assert!(matches!(
            parse_event(br#"{"type":"nope","seq":1}"#),
            Err(EventError::Json(_))
        ));
        assert!(matches!(
            parse_event(br#"{"type":"data","seq":1,"stream":"stdout","data":"!!"}"#),
            Err(EventError::Data)
        ));
        let big = OutputEvent::data(1, OutputStream::Stdout, &vec![0u8; MAX_OUTPUT_CHUNK + 1]);
        assert_eq!(
            parse_event(&serde_json::to_vec(&big).unwrap()),
            Err(EventError::Data)
        );
    }
}

//! The guest side of the channel handshake as a pure state machine.
//!
//! Bytes read from the channel are pushed in; [`Scanner::next_step`] says what to do: write
//! a reply line, start HTTP/2 with the bytes already buffered, or give up on a session that
//! sent garbage after READY. The I/O loop around it lives in `session`.

use bytes::{Bytes, BytesMut};
use space_guest_proto::handshake::{refused, Hello, Ready, H2_PREFACE_START, HELLO};
use space_guest_proto::limits::MAX_HANDSHAKE_LINE;
use space_guest_proto::PROTOCOL_VERSION;

/// What the I/O loop must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Read more bytes.
    NeedMore,
    /// Write this line to the peer, then continue.
    Reply(String),
    /// The HTTP/2 preface has begun; serve HTTP/2, feeding these bytes first.
    Start(Bytes),
    /// After READY the peer sent something that is neither a HELLO nor the preface.
    Garbage,
}

/// Handshake state for one attempt.
#[derive(Debug)]
pub struct Scanner {
    buf: BytesMut,
    /// Nonce of the HELLO we answered with READY.
    answered: Option<String>,
    boot_id: String,
    daemon_version: String,
}

impl Scanner {
    /// A scanner that answers with this boot id and daemon version.
    pub fn new(boot_id: &str, daemon_version: &str) -> Self {
        Scanner {
            buf: BytesMut::new(),
            answered: None,
            boot_id: boot_id.to_owned(),
            daemon_version: daemon_version.to_owned(),
        }
    }

    /// Forgets the answered HELLO (after garbage) but keeps buffered bytes for rescanning.
    pub fn reset(&mut self) {
        self.answered = None;
    }

    /// Bytes read from the channel.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    fn answer(&mut self, hello: Hello) -> Step {
        if hello.version != PROTOCOL_VERSION {
            self.answered = None;
            return Step::Reply(refused(PROTOCOL_VERSION));
        }
        let ready = Ready {
            version: PROTOCOL_VERSION,
            nonce: hello.nonce.clone(),
            boot_id: self.boot_id.clone(),
            daemon_version: self.daemon_version.clone(),
        };
        self.answered = Some(hello.nonce);
        Step::Reply(ready.encode())
    }

    /// The next thing to do with what is buffered.
    pub fn next_step(&mut self) -> Step {
        loop {
            if self.answered.is_some() {
                if self.buf.starts_with(H2_PREFACE_START) {
                    return Step::Start(self.buf.split().freeze());
                }
                if H2_PREFACE_START.starts_with(&self.buf) {
                    return Step::NeedMore;
                }
                let Some(nl) = self.buf.iter().position(|&b| b == b'\n') else {
                    if self.buf.len() >= MAX_HANDSHAKE_LINE {
                        return Step::Garbage;
                    }
                    return Step::NeedMore;
                };
                let line = self.buf.split_to(nl + 1);
                match Hello::parse(&line[..nl]) {
                    // The host's retries of the HELLO we answered.
                    Some(h)
                        if Some(&h.nonce) == self.answered.as_ref()
                            && h.version == PROTOCOL_VERSION =>
                    {
                        continue
                    }
                    // A new host connection started over.
                    Some(h) => return self.answer(h),
                    None => return Step::Garbage,
                }
            }
            let Some(nl) = self.buf.iter().position(|&b| b == b'\n') else {
                // Keep only a tail that may still hold the start of a HELLO line.
                if self.buf.len() >= MAX_HANDSHAKE_LINE {
                    let keep = MAX_HANDSHAKE_LINE - 1;
                    let _ = self.buf.split_to(self.buf.len() - keep);
                }
                return Step::NeedMore;
            };
            let line = self.buf.split_to(nl + 1);
            let line = &line[..nl];
            // Stale bytes may precede the HELLO on the same line: parse from its last start.
            if let Some(start) = find_last(line, HELLO.as_bytes()) {
                if let Some(hello) = Hello::parse(&line[start..]) {
                    return self.answer(hello);
                }
            }
        }
    }
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > hay.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|&i| &hay[i..i + needle.len()] == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanner() -> Scanner {
        Scanner::new("b00t", "0.1.0")
    }

    #[test]
    fn answers_hello_after_garbage() {
        let mut s = scanner();
        s.push(b"\x00\xffjunk\nmore junk SPACE-HELLO 1 zz\nxxSPACE-HELLO 1 ab");
        assert_eq!(s.next_step(), Step::NeedMore);
        s.push(b"cd\n");
        assert_eq!(
            s.next_step(),
            Step::Reply("SPACE-READY 1 abcd b00t 0.1.0\n".into())
        );
        // Retries of the same HELLO are dropped; the preface starts HTTP/2 with all bytes.
        s.push(b"SPACE-HELLO 1 abcd\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\nrest");
        let Step::Start(b) = s.next_step() else {
            panic!()
        };
        assert_eq!(&b[..], b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nrest");
    }

    #[test]
    fn partial_preface_waits() {
        let mut s = scanner();
        s.push(b"SPACE-HELLO 1 01\nPRI * HT");
        assert!(matches!(s.next_step(), Step::Reply(_)));
        assert_eq!(s.next_step(), Step::NeedMore);
        s.push(b"TP/2.0");
        assert!(matches!(s.next_step(), Step::Start(_)));
    }

    #[test]
    fn new_nonce_is_answered_again_and_garbage_ends() {
        let mut s = scanner();
        s.push(b"SPACE-HELLO 1 01\nSPACE-HELLO 1 02\n");
        assert_eq!(
            s.next_step(),
            Step::Reply("SPACE-READY 1 01 b00t 0.1.0\n".into())
        );
        assert_eq!(
            s.next_step(),
            Step::Reply("SPACE-READY 1 02 b00t 0.1.0\n".into())
        );
        s.push(b"GET / HTTP/1.1\r\n");
        assert_eq!(s.next_step(), Step::Garbage);
        s.reset();
        assert_eq!(s.next_step(), Step::NeedMore);
    }

    #[test]
    fn overlong_lines_are_bounded_and_wrong_version_refused() {
        let mut s = scanner();
        s.push(&vec![b'a'; 10_000]);
        assert_eq!(s.next_step(), Step::NeedMore);
        assert!(s.buf.len() < MAX_HANDSHAKE_LINE);
        s.push(b"SPACE-HELLO 9 ab\n");
        assert_eq!(
            s.next_step(),
            Step::Reply("SPACE-REFUSED unsupported-version 1\n".into())
        );
        s.push(&vec![b'x'; 1000]);
        assert_eq!(s.next_step(), Step::NeedMore);
    }
}

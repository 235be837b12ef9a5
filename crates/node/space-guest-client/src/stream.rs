//! Response bodies as streams: raw bytes (file reads), NDJSON output events and NDJSON
//! watch events.
//!
//! Each received chunk's window is handed back to the guest only when the chunk is taken
//! from h2, so a consumer that stops reading stops the guest (per-stream flow control)
//! and what we buffer stays bounded by the stream window plus one line.

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use h2::RecvStream;
use space_core::files::watch::WatchEvent;
use space_core::process::{OutputEvent, MAX_OUTPUT_LINE};
use space_guest_proto::limits::MAX_WATCH_LINE;

use crate::error::GuestError;
use crate::ndjson::{parse_event, LineDecoder};
use crate::transport::{fault, ClosedRx};

/// Takes the next chunk of a body, returning its window to the guest.
async fn next_chunk(recv: &mut RecvStream, closed: &ClosedRx) -> Option<Result<Bytes, GuestError>> {
    match recv.data().await? {
        Ok(chunk) => {
            let _ = recv.flow_control().release_capacity(chunk.len());
            Some(Ok(chunk))
        }
        Err(e) => Some(Err(fault(closed, e))),
    }
}

/// The body as a stream of byte chunks; the first error ends it.
pub(crate) fn bytes(
    recv: RecvStream,
    closed: ClosedRx,
) -> BoxStream<'static, Result<Bytes, GuestError>> {
    stream::unfold(Some((recv, closed)), |state| async move {
        let (mut recv, closed) = state?;
        match next_chunk(&mut recv, &closed).await? {
            Ok(chunk) => Some((Ok(chunk), Some((recv, closed)))),
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

/// A body read as NDJSON lines of at most `max` bytes.
struct Lines {
    recv: RecvStream,
    closed: ClosedRx,
    lines: LineDecoder,
    eof: bool,
}

impl Lines {
    fn new(recv: RecvStream, closed: ClosedRx, max: usize) -> Self {
        Lines {
            recv,
            closed,
            lines: LineDecoder::new(max),
            eof: false,
        }
    }

    /// The next line (possibly blank); `Ok(None)` at the end of the body. `what` names the
    /// stream in errors.
    async fn next(&mut self, what: &str) -> Result<Option<Bytes>, GuestError> {
        loop {
            let line = if self.eof {
                self.lines.finish()
            } else {
                self.lines.next_line()
            };
            match line {
                Err(e) => return Err(GuestError::protocol(format!("{what}: {e}"))),
                Ok(Some(line)) => return Ok(Some(line)),
                Ok(None) if self.eof => return Ok(None),
                Ok(None) => {}
            }
            match next_chunk(&mut self.recv, &self.closed).await {
                Some(Ok(chunk)) => self.lines.push(&chunk),
                Some(Err(e)) => return Err(e),
                None => self.eof = true,
            }
        }
    }
}

enum Step {
    Event(OutputEvent),
    Exit(OutputEvent),
    Fail(GuestError),
}

async fn output_step(lines: &mut Lines) -> Step {
    loop {
        let line = match lines.next("output stream").await {
            Ok(Some(line)) => line,
            Ok(None) => {
                return Step::Fail(GuestError::protocol(
                    "output stream ended without an exit event",
                ))
            }
            Err(e) => return Step::Fail(e),
        };
        match parse_event(&line) {
            Ok(None) => continue,
            Ok(Some(ev @ OutputEvent::Exit { .. })) => return Step::Exit(ev),
            Ok(Some(ev)) => return Step::Event(ev),
            Err(e) => return Step::Fail(GuestError::protocol(format!("output stream: {e}"))),
        }
    }
}

/// The body as output events, one NDJSON line each (at most `MAX_OUTPUT_LINE` bytes). The
/// stream ends after the `exit` event; an oversize or unparsable line, or an end without
/// `exit`, yields one [`GuestError::Protocol`] and ends it.
pub(crate) fn events(
    recv: RecvStream,
    closed: ClosedRx,
) -> BoxStream<'static, Result<OutputEvent, GuestError>> {
    let state = Lines::new(recv, closed, MAX_OUTPUT_LINE);
    stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        match output_step(&mut state).await {
            Step::Event(ev) => Some((Ok(ev), Some(state))),
            // Dropping the body here resets the stream if the guest keeps sending.
            Step::Exit(ev) => Some((Ok(ev), None)),
            Step::Fail(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

/// The body as watch events, one NDJSON line each (at most `MAX_WATCH_LINE` bytes), until
/// the guest ends it; an oversize or unparsable line yields one [`GuestError::Protocol`]
/// and ends it.
pub(crate) fn watch_events(
    recv: RecvStream,
    closed: ClosedRx,
) -> BoxStream<'static, Result<WatchEvent, GuestError>> {
    ndjson(recv, closed, MAX_WATCH_LINE, "watch stream")
}

/// The body as `T`s, one NDJSON line each (at most `max` bytes; blank lines are skipped),
/// until the peer ends it; an oversize or unparsable line yields one
/// [`GuestError::Protocol`] and ends it. `what` names the stream in errors.
pub(crate) fn ndjson<T: serde::de::DeserializeOwned + Send + 'static>(
    recv: RecvStream,
    closed: ClosedRx,
    max: usize,
    what: &'static str,
) -> BoxStream<'static, Result<T, GuestError>> {
    let state = Lines::new(recv, closed, max);
    stream::unfold(Some(state), move |state| async move {
        let mut state = state?;
        loop {
            let line = match state.next(what).await {
                Ok(Some(line)) => line,
                Ok(None) => return None,
                Err(e) => return Some((Err(e), None)),
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return match serde_json::from_slice::<T>(&line) {
                Ok(ev) => Some((Ok(ev), Some(state))),
                Err(e) => Some((
                    Err(GuestError::protocol(format!("{what}: bad line: {e}"))),
                    None,
                )),
            };
        }
    })
    .boxed()
}

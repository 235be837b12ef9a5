//! Response bodies as streams: raw bytes (file reads) and NDJSON output events.
//!
//! Each received chunk's window is handed back to the guest only when the chunk is taken
//! from h2, so a consumer that stops reading stops the guest (per-stream flow control)
//! and what we buffer stays bounded by the stream window plus one line.

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use h2::RecvStream;
use space_core::process::{OutputEvent, MAX_OUTPUT_LINE};

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

struct Events {
    recv: RecvStream,
    closed: ClosedRx,
    lines: LineDecoder,
    eof: bool,
}

enum Step {
    Event(OutputEvent),
    Exit(OutputEvent),
    Fail(GuestError),
}

impl Events {
    async fn step(&mut self) -> Step {
        loop {
            let line = if self.eof {
                self.lines.finish()
            } else {
                self.lines.next_line()
            };
            match line {
                Err(e) => return Step::Fail(GuestError::protocol(format!("output stream: {e}"))),
                Ok(Some(line)) => match parse_event(&line) {
                    Ok(None) => continue,
                    Ok(Some(ev @ OutputEvent::Exit { .. })) => return Step::Exit(ev),
                    Ok(Some(ev)) => return Step::Event(ev),
                    Err(e) => {
                        return Step::Fail(GuestError::protocol(format!("output stream: {e}")))
                    }
                },
                Ok(None) if self.eof => {
                    return Step::Fail(GuestError::protocol(
                        "output stream ended without an exit event",
                    ));
                }
                Ok(None) => {}
            }
            match next_chunk(&mut self.recv, &self.closed).await {
                Some(Ok(chunk)) => self.lines.push(&chunk),
                Some(Err(e)) => return Step::Fail(e),
                None => self.eof = true,
            }
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
    let state = Events {
        recv,
        closed,
        lines: LineDecoder::new(MAX_OUTPUT_LINE),
        eof: false,
    };
    stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        match state.step().await {
            Step::Event(ev) => Some((Ok(ev), Some(state))),
            // Dropping the body here resets the stream if the guest keeps sending.
            Step::Exit(ev) => Some((Ok(ev), None)),
            Step::Fail(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

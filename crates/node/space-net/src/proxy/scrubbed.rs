//! The body of an upstream response on its way to the guest, with the values of the
//! credentials injected into its request masked ([`space_secrets::scrub`]); a response to a
//! request that got none passes through untouched.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use space_secrets::scrub::{Scrubber, StreamScrubber};

/// An upstream body, scrubbed or not.
pub(super) struct Scrubbed {
    inner: Incoming,
    scrub: Option<StreamScrubber>,
    /// Trailers that wait for the bytes held back before them.
    trailers: Option<Frame<Bytes>>,
    done: bool,
}

impl Scrubbed {
    /// `inner` as it is.
    pub(super) fn plain(inner: Incoming) -> Self {
        Self::new(inner, None)
    }

    /// `inner`, masked by `scrubber` if there is one.
    pub(super) fn new(inner: Incoming, scrubber: Option<&Arc<Scrubber>>) -> Self {
        Scrubbed {
            inner,
            scrub: scrubber.map(Scrubber::stream),
            trailers: None,
            done: false,
        }
    }
}

/// Masks `scrubber`'s values in every header value; whether one was.
pub(super) fn scrub_headers(headers: &mut HeaderMap, scrubber: &Scrubber) -> bool {
    let mut masked = false;
    for value in headers.values_mut() {
        let mut bytes = value.as_bytes().to_vec();
        if scrubber.mask(&mut bytes) {
            // Masking only replaces bytes with `*`: still a valid header value.
            if let Ok(v) = http::HeaderValue::from_bytes(&bytes) {
                *value = v;
                masked = true;
            }
        }
    }
    masked
}

impl Body for Scrubbed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let Some(scrub) = &mut this.scrub else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        loop {
            if let Some(trailers) = this.trailers.take() {
                return Poll::Ready(Some(Ok(trailers)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let out = scrub.feed(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(trailers) => {
                        let held = scrub.finish();
                        if held.is_empty() {
                            return Poll::Ready(Some(Ok(trailers)));
                        }
                        this.trailers = Some(trailers);
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(held)))));
                    }
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    if scrub.masked() {
                        tracing::info!("egress: a credential's value in a response was masked");
                    }
                    let held = scrub.finish();
                    if !held.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(held)))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.scrub {
            None => self.inner.is_end_stream(),
            Some(_) => self.done && self.trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        // Masking keeps every length.
        self.inner.size_hint()
    }
}

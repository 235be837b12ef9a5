//! The virtio-serial port as an async byte stream, through one blocking reader thread and
//! one blocking writer thread.
//!
//! Why not `AsyncFd`: while no host is connected the port polls as `EPOLLHUP`, and tokio
//! treats a hang-up as final (its "closed" readiness is sticky), so after the first host
//! connects every read would spin on `EAGAIN`. Blocking I/O on the port has exactly the
//! semantics we need: `read` blocks until data arrives and returns 0 while no host is
//! connected; `write` blocks while the host is away or not consuming. The channels between
//! the threads and the session are bounded, so memory stays bounded.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

/// Largest single read from the port.
const READ_CHUNK: usize = 64 * 1024;
/// Chunks buffered in each direction.
const CHANNEL_CHUNKS: usize = 16;
/// Pause between reads while no host is connected (`read` returns 0 at once then). Short,
/// because it is how fast a resumed or restored VM notices its new host; a VM only goes
/// without a host between two sessions, so the polling costs little.
const NO_HOST_POLL: Duration = Duration::from_millis(5);

/// What the reader thread reports.
#[derive(Debug)]
enum Incoming {
    Data(Bytes),
    /// The host is not connected (reported once per disconnect).
    NoHost,
}

/// The port as one long-lived stream. A read returns 0 ("EOF") once each time the host
/// disconnects (or is found absent); later reads wait for the next host's bytes.
#[derive(Debug)]
pub struct PortStream {
    rx: mpsc::Receiver<io::Result<Incoming>>,
    tx: PollSender<Bytes>,
    pending: Bytes,
}

fn clear_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on our descriptor.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0
        || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl PortStream {
    /// Starts the two threads on `fd` (switched to blocking mode).
    pub fn new(fd: OwnedFd) -> io::Result<PortStream> {
        clear_nonblocking(&fd)?;
        let reader = std::fs::File::from(fd.try_clone()?);
        let writer = std::fs::File::from(fd);
        let (in_tx, in_rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (out_tx, out_rx) = mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
        std::thread::Builder::new()
            .name("port-reader".into())
            .spawn(move || read_loop(reader, in_tx))?;
        std::thread::Builder::new()
            .name("port-writer".into())
            .spawn(move || write_loop(writer, out_rx))?;
        Ok(PortStream {
            rx: in_rx,
            tx: PollSender::new(out_tx),
            pending: Bytes::new(),
        })
    }
}

fn read_loop(mut port: std::fs::File, tx: mpsc::Sender<io::Result<Incoming>>) {
    use std::io::Read;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut host_present = true; // so that an absent host is reported once at start
    loop {
        let msg = match port.read(&mut buf) {
            Ok(0) => {
                let report = host_present;
                host_present = false;
                std::thread::sleep(NO_HOST_POLL);
                if !report {
                    continue;
                }
                Ok(Incoming::NoHost)
            }
            Ok(n) => {
                host_present = true;
                Ok(Incoming::Data(Bytes::copy_from_slice(&buf[..n])))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Do not spin on a broken port; the session loop logs the error.
                std::thread::sleep(Duration::from_secs(1));
                Err(e)
            }
        };
        if tx.blocking_send(msg).is_err() {
            return; // the stream was dropped
        }
    }
}

fn write_loop(mut port: std::fs::File, mut rx: mpsc::Receiver<Bytes>) {
    use std::io::Write;
    while let Some(chunk) = rx.blocking_recv() {
        // Blocks while no host is connected. Bytes of an ended session may thus reach the
        // next host before its READY; the host skips everything before READY.
        if let Err(e) = port.write_all(&chunk) {
            tracing::warn!(error = %e, "write to virtio-serial port failed");
        }
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            match ready!(self.rx.poll_recv(cx)) {
                Some(Ok(Incoming::Data(d))) => self.pending = d,
                Some(Ok(Incoming::NoHost)) => return Poll::Ready(Ok(())),
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
        let n = self.pending.len().min(buf.remaining());
        buf.put_slice(&self.pending[..n]);
        self.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let broken = |_| io::Error::from(io::ErrorKind::BrokenPipe);
        ready!(self.tx.poll_reserve(cx)).map_err(broken)?;
        let n = buf.len().min(READ_CHUNK);
        self.tx
            .send_item(Bytes::copy_from_slice(&buf[..n]))
            .map_err(broken)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The writer thread drains the channel on its own; there is nothing to wait for.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The port outlives sessions: never close it.
        Poll::Ready(Ok(()))
    }
}

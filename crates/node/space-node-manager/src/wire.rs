//! Frames on the node manager's Unix socket: a 4-byte big-endian length, that many bytes of
//! JSON, and optionally file descriptors (`SCM_RIGHTS`) sent with the frame's first byte.
//!
//! Written by hand on `sendmsg`/`recvmsg` because descriptors must travel with the bytes
//! they belong to, which no framing codec does. Blocking: the server serves each connection
//! on a thread of its own, and the client's calls are short (a reflink, a namespace) or run
//! on a blocking thread (a VM launch). Bounded: a frame longer than the
//! reader's limit, or with more descriptors than [`MAX_FDS`], is an error before anything is
//! allocated for it; descriptors that arrive unasked are closed.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::os::unix::net::UnixStream;

use crate::protocol::MAX_FDS;

/// Why a frame could not be sent or read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed mid-frame")]
    Truncated,
    /// A frame longer than allowed.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More descriptors than a frame may carry (or the kernel truncated them).
    #[error("too many file descriptors with one frame")]
    TooManyFds,
    /// The frame is not the JSON expected.
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

/// A frame read: its JSON body and the descriptors that came with it.
pub struct Frame {
    /// The body.
    pub body: Vec<u8>,
    /// Descriptors, in the order sent.
    pub fds: Vec<OwnedFd>,
}

impl Frame {
    /// The body as a `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, WireError> {
        Ok(serde_json::from_slice(&self.body)?)
    }
}

/// Sends `msg` as one frame, with `fds` attached.
pub fn send<T: Serialize>(
    stream: &UnixStream,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), WireError> {
    if fds.len() > MAX_FDS {
        return Err(WireError::TooManyFds);
    }
    let body = serde_json::to_vec(msg)?;
    let len = u32::try_from(body.len()).map_err(|_| WireError::TooLarge {
        len: body.len(),
        max: u32::MAX as usize,
    })?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < frame.len() {
        let iov = [IoSlice::new(&frame[sent..])];
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage] = if sent == 0 && !raw.is_empty() {
            &rights
        } else {
            &[]
        };
        match socket::sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
    Ok(())
}

/// Reads one frame of at most `max` bytes; `None` if the peer closed the connection
/// between frames. The socket's read timeout applies to each read.
pub fn recv(stream: &UnixStream, max: usize) -> Result<Option<Frame>, WireError> {
    let mut fds = Vec::new();
    let mut header = [0u8; 4];
    if !fill(stream, &mut header, &mut fds, true)? {
        return Ok(None);
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len];
    if len > 0 && !fill(stream, &mut body, &mut fds, false)? {
        return Err(WireError::Truncated);
    }
    Ok(Some(Frame { body, fds }))
}

/// Fills `buf` from the socket, collecting descriptors; false if the peer closed before the
/// first byte and `eof_ok`.
fn fill(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    eof_ok: bool,
) -> Result<bool, WireError> {
    let mut got = 0;
    while got < buf.len() {
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let msg = match socket::recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        };
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    // SAFETY: the kernel just installed these descriptors in this process
                    // for us; nothing else owns them.
                    fds.extend(
                        raw.into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) || fds.len() > MAX_FDS {
            return Err(WireError::TooManyFds);
        }
        if msg.bytes == 0 {
            if got == 0 && eof_ok {
                return Ok(false);
            }
            return Err(WireError::Truncated);
        }
        got += msg.bytes;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn frames_carry_descriptors_and_limits_hold() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        send(&a, &serde_json::json!({"x": 1}), &[file.as_fd()]).unwrap();
        let f = recv(&b, 1024).unwrap().unwrap();
        assert_eq!(f.fds.len(), 1);
        assert_eq!(f.parse::<serde_json::Value>().unwrap()["x"], 1);

        send(&a, &"y".repeat(100), &[]).unwrap();
        assert!(matches!(
            recv(&b, 50),
            Err(WireError::TooLarge { len: 102, max: 50 })
        ));

        let (c, d) = UnixStream::pair().unwrap();
        drop(c);
        assert!(recv(&d, 10).unwrap().is_none());
    }

    #[test]
    fn a_frame_cut_short_is_an_error() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&10u32.to_be_bytes()).unwrap();
        a.write_all(b"abc").unwrap();
        drop(a);
        assert!(matches!(recv(&b, 100), Err(WireError::Truncated)));
    }

    #[test]
    fn too_many_descriptors_are_refused_before_sending() {
        let (a, _b) = UnixStream::pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        let fds = vec![f.as_fd(); MAX_FDS + 1];
        assert!(matches!(send(&a, &1, &fds), Err(WireError::TooManyFds)));
    }
}

//! inotify without a crate: the few system calls a directory watch needs, and a pure parser
//! of the event records the kernel writes.
//!
//! Permission to watch is checked when a watch is added, against the calling thread's
//! file-system identity, so the watcher adds its watches acting as the user (`fsuser`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Size of the fixed part of a record (`struct inotify_event` without its name).
const HEADER: usize = std::mem::size_of::<libc::inotify_event>();

/// One record as the kernel wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent {
    /// Watch descriptor (-1 for a queue overflow).
    pub wd: i32,
    /// `IN_*` bits.
    pub mask: u32,
    /// Pairs the two halves of a rename.
    pub cookie: u32,
    /// Name of the entry inside the watched directory (empty for events on the directory
    /// itself), without the kernel's NUL padding.
    pub name: Vec<u8>,
}

impl RawEvent {
    /// Whether any of `bits` is set.
    pub fn has(&self, bits: u32) -> bool {
        self.mask & bits != 0
    }
}

/// Parses the records in `buf` (what one `read` returned). A truncated record at the end
/// (which the kernel never writes) ends the list.
pub fn parse(buf: &[u8]) -> Vec<RawEvent> {
    let mut events = Vec::new();
    let mut rest = buf;
    while rest.len() >= HEADER {
        let field = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&rest[i * 4..i * 4 + 4]);
            u32::from_ne_bytes(b)
        };
        let (wd, mask, cookie, len) = (field(0) as i32, field(1), field(2), field(3) as usize);
        let Some(name) = rest.get(HEADER..HEADER + len) else {
            break;
        };
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        events.push(RawEvent {
            wd,
            mask,
            cookie,
            name: name[..end].to_vec(),
        });
        rest = &rest[HEADER + len..];
    }
    events
}

/// An inotify instance (non-blocking, close-on-exec).
#[derive(Debug)]
pub struct Inotify {
    fd: OwnedFd,
}

impl Inotify {
    /// A new instance.
    pub fn new() -> io::Result<Inotify> {
        // SAFETY: no pointers; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by inotify_init1 and is owned by nobody else.
        Ok(Inotify {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watches `path` for `mask`; returns the watch descriptor (the same one again for an
    /// inode already watched).
    pub fn add_watch(&self, path: &Path, mask: u32) -> io::Result<i32> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: c is a valid NUL-terminated string for the duration of the call.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(wd)
    }

    /// Stops watching `wd` (the kernel then queues `IN_IGNORED` for it). Errors (a watch
    /// the kernel already dropped) are ignored.
    pub fn rm_watch(&self, wd: i32) {
        // SAFETY: no pointers.
        unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
    }

    /// Reads queued records into `buf`; `Ok(0)` when none are queued.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: buf is valid for buf.len() bytes of writes.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(e),
            }
        }
    }
}

impl AsFd for Inotify {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(wd: i32, mask: u32, cookie: u32, name: &[u8], padded: usize) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&wd.to_ne_bytes());
        v.extend_from_slice(&mask.to_ne_bytes());
        v.extend_from_slice(&cookie.to_ne_bytes());
        v.extend_from_slice(&(padded as u32).to_ne_bytes());
        let mut n = name.to_vec();
        n.resize(padded, 0);
        v.extend_from_slice(&n);
        v
    }

    #[test]
    fn parses_records_and_strips_padding() {
        let mut buf = record(1, libc::IN_CREATE, 0, b"a.txt", 16);
        buf.extend(record(2, libc::IN_DELETE_SELF, 0, b"", 0));
        buf.extend(record(
            1,
            libc::IN_MOVED_FROM | libc::IN_ISDIR,
            7,
            b"dir",
            4,
        ));
        let evs = parse(&buf);
        assert_eq!(evs.len(), 3);
        assert_eq!(
            evs[0],
            RawEvent {
                wd: 1,
                mask: libc::IN_CREATE,
                cookie: 0,
                name: b"a.txt".to_vec()
            }
        );
        assert!(evs[1].name.is_empty() && evs[1].has(libc::IN_DELETE_SELF));
        assert_eq!((evs[2].cookie, evs[2].name.as_slice()), (7, &b"dir"[..]));
        assert!(evs[2].has(libc::IN_ISDIR));
    }

    #[test]
    fn truncated_records_end_the_list() {
        let mut buf = record(1, libc::IN_MODIFY, 0, b"x", 16);
        let whole = buf.len();
        buf.extend(record(1, libc::IN_MODIFY, 0, b"y", 16));
        assert_eq!(parse(&buf[..whole + 10]).len(), 1);
        assert_eq!(parse(&buf[..whole + HEADER + 3]).len(), 1);
        assert!(parse(&buf[..3]).is_empty());
    }

    #[test]
    fn watches_a_real_directory() {
        let d = tempfile::tempdir().unwrap();
        let ino = Inotify::new().unwrap();
        let wd = ino
            .add_watch(d.path(), libc::IN_CREATE | libc::IN_ONLYDIR)
            .unwrap();
        let mut buf = vec![0u8; 4096];
        assert_eq!(ino.read(&mut buf).unwrap(), 0, "nothing queued yet");
        std::fs::write(d.path().join("f"), "x").unwrap();
        let n = ino.read(&mut buf).unwrap();
        let evs = parse(&buf[..n]);
        assert_eq!(evs[0].wd, wd);
        assert_eq!(evs[0].name, b"f");
        let file = d.path().join("f");
        assert_eq!(
            ino.add_watch(&file, libc::IN_ONLYDIR)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOTDIR)
        );
    }
}

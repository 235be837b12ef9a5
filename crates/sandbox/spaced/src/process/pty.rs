//! Pseudo-terminals: open a master/slave pair with close-on-exec set atomically, and resize.
//!
//! We open `/dev/ptmx` ourselves and get the slave with `TIOCGPTPEER` instead of using
//! `openpty`, so neither descriptor can leak into a process spawned concurrently by another
//! thread, and no path under `/dev/pts` has to be resolved.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use space_core::process::PtySize;

/// `TIOCGPTPEER` (Linux >= 4.13): open the slave of a master.
const TIOCGPTPEER: libc::c_ulong = 0x5441;

fn winsize(size: PtySize) -> libc::winsize {
    libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Opens a pty of `size`; returns (master, slave). The slave is owned by `uid` (group `gid`
/// when given) with mode 0620, like a login terminal.
pub fn open(size: PtySize, uid: u32, gid: Option<u32>) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: constant NUL-terminated path.
    let m = unsafe {
        libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if m < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: m is a fresh descriptor.
    let master = unsafe { OwnedFd::from_raw_fd(m) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor.
    let s = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            TIOCGPTPEER as _,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: s is a fresh descriptor.
    let slave = unsafe { OwnedFd::from_raw_fd(s) };
    set_size(&master, size)?;
    // Best effort: the terminal still works if ownership cannot be changed.
    // SAFETY: plain fchown/fchmod on our descriptor.
    unsafe {
        libc::fchown(slave.as_raw_fd(), uid, gid.unwrap_or(u32::MAX));
        libc::fchmod(slave.as_raw_fd(), 0o620);
    }
    Ok((master, slave))
}

/// Sets the window size (the kernel sends SIGWINCH to the foreground process group).
pub fn set_size(master: &impl AsRawFd, size: PtySize) -> io::Result<()> {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads a winsize struct.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

//! The uid (and gid, the same number) of each jailed VMM, from a reserved range, never held
//! by two live VMMs at once on this machine.
//!
//! A uid is taken by an exclusive `flock` on `<lock_dir>/<uid>`; the locked descriptor goes
//! into the VMM itself, so the lock lasts exactly as long as the VMM (it survives a restart of
//! the node, and ends when the VMM dies, however it dies). Several nodes on one machine share
//! the directory and so never hand out the same uid.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A contiguous range of uids reserved for VMMs (the same numbers are used as gids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub count: u32,
}

impl UidRange {
    /// Default: 65536 ids from 1,500,000,000, above the ranges Debian hands out to users and
    /// their subordinate ids, and below systemd's dynamic and container ranges' ends.
    pub const DEFAULT: UidRange = UidRange {
        first: 1_500_000_000,
        count: 65_536,
    };

    /// True when `uid` lies in the range.
    pub fn contains(&self, uid: u32) -> bool {
        uid >= self.first && uid - self.first < self.count
    }
}

/// A uid held for one VMM until the descriptor inside it closes.
#[derive(Debug)]
pub(crate) struct UidLease {
    pub(crate) uid: u32,
    /// The locked lock file; passed into the VMM.
    pub(crate) lock: OwnedFd,
}

/// Where the next search starts: spreading leases over the range makes reuse of a recently
/// freed uid (whose files might still exist somewhere) the exception.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// Takes a free uid from `range`.
pub(crate) fn lease(range: UidRange, lock_dir: &Path) -> io::Result<UidLease> {
    if range.count == 0 || range.first == 0 || range.first.checked_add(range.count).is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unusable VMM uid range {range:?}"),
        ));
    }
    // Its parent (/run/space) also holds the node manager's socket, which the sandbox
    // manager must reach: searchable by all; the lock directory itself is root's alone.
    if let Some(parent) = lock_dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(lock_dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let start = NEXT.fetch_add(1, Ordering::Relaxed) % range.count;
    for i in 0..range.count {
        let uid = range.first + (start + i) % range.count;
        let file = open_lock(&lock_path(lock_dir, uid))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            NEXT.store((start + i + 1) % range.count, Ordering::Relaxed);
            return Ok(UidLease {
                uid,
                lock: file.into(),
            });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "all {} VMM uids from {} are in use",
            range.count, range.first
        ),
    ))
}

fn lock_path(dir: &Path, uid: u32) -> PathBuf {
    dir.join(uid.to_string())
}

fn open_lock(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let range = UidRange {
            first: 1000,
            count: 2,
        };
        let a = lease(range, dir.path()).unwrap();
        let b = lease(range, dir.path()).unwrap();
        assert_ne!(a.uid, b.uid);
        assert!(range.contains(a.uid) && range.contains(b.uid));
        let full = lease(range, dir.path()).unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::ResourceBusy);
        let freed = a.uid;
        drop(a);
        assert_eq!(lease(range, dir.path()).unwrap().uid, freed);
    }

    #[test]
    fn bad_ranges_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for range in [
            UidRange { first: 0, count: 5 },
            UidRange { first: 5, count: 0 },
            UidRange {
                first: u32::MAX,
                count: 2,
            },
        ] {
            assert!(lease(range, dir.path()).is_err(), "{range:?}");
        }
    }
}

//! Memory images as sealed memfds: every VM started from a template's memory image maps the
//! same pages copy-on-write, and none can write the image itself.
//!
//! QEMU 7.2 opens a `memory-backend-file` read-write even when it maps it privately (its
//! `readonly=on` would make guest RAM read-only), so handing a jailed VMM the image file would
//! let one compromised VMM poison the memory every later restore maps. Instead the image is
//! copied once (holes stay holes) into a memfd sealed against writes, growth and shrinking;
//! the VMM reopens it through `/proc/self/fd/N`, can map it privately (copy-on-write), and
//! gets `EPERM` for any write. All VMs of one image share its pages, as they shared the
//! file's page cache before.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::FileOwner;

/// Identity of an image file: a rewritten image (new inode or mtime) gets a new memfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ImageKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

/// The sealed memfds of the images in use, shared by every launch of one node.
#[derive(Debug, Default)]
pub(crate) struct MemoryImages {
    images: Mutex<HashMap<ImageKey, Arc<OwnedFd>>>,
}

/// Longest memory image we copy (guest RAM is bounded by `space_core`'s 64 GiB).
const MAX_IMAGE_BYTES: u64 = 64 << 30;

impl MemoryImages {
    /// The sealed memfd holding `path`'s contents, made on first use; the file is opened as
    /// `owner` (the owner of the directory it lies in: see [`FileOwner::act_as`]).
    pub(crate) fn get(&self, path: &Path, owner: FileOwner) -> io::Result<Arc<OwnedFd>> {
        let file = owner.act_as(|| File::open(path))??;
        let meta = file.metadata()?;
        if meta.len() > MAX_IMAGE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("memory image {} is {} bytes", path.display(), meta.len()),
            ));
        }
        let key = ImageKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        };
        let mut images = self.images.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fd) = images.get(&key) {
            return Ok(fd.clone());
        }
        let started = std::time::Instant::now();
        let fd = Arc::new(sealed_copy(&file, meta.len())?);
        tracing::info!(
            image = %path.display(),
            bytes = meta.len(),
            ms = started.elapsed().as_millis() as u64,
            "memory image loaded into a sealed memfd"
        );
        // Images of other generations are dropped here; VMs that map them keep their own
        // reference to the pages.
        images.retain(|k, _| k.dev != key.dev || k.ino != key.ino);
        images.insert(key, fd.clone());
        Ok(fd)
    }
}

/// Copies the data extents of `file` into a new memfd and seals it.
fn sealed_copy(file: &File, len: u64) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
    let raw = unsafe {
        libc::memfd_create(
            c"space-memory-image".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
    let out = File::from(memfd);
    out.set_len(len)?;
    let (src, dst) = (file.as_raw_fd(), out.as_raw_fd());
    let mut buf = vec![0u8; 1 << 20];
    let mut pos: i64 = 0;
    let end = len as i64;
    while pos < end {
        // SAFETY: lseek on descriptors we hold.
        let data = unsafe { libc::lseek(src, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(src, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        // copy_file_range cannot cross into tmpfs; page-sized zero runs inside an extent
        // stay holes too.
        let mut off = data as u64;
        while off < hole as u64 {
            let n = ((hole as u64 - off) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..n], off)?;
            if buf[..n].iter().any(|&b| b != 0) {
                out.write_all_at(&buf[..n], off)?;
            }
            off += n as u64;
        }
        pos = hole;
    }
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a memfd we own.
    if unsafe { libc::fcntl(dst, libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OwnedFd::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    #[test]
    fn copies_data_keeps_holes_and_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let mut f = File::create(&path).unwrap();
        f.set_len(8 << 20).unwrap();
        f.seek(SeekFrom::Start(4 << 20)).unwrap();
        f.write_all(b"guest page").unwrap();
        drop(f);
        let images = MemoryImages::default();
        let fd = images.get(&path, FileOwner::current()).unwrap();
        let again = images.get(&path, FileOwner::current()).unwrap();
        assert!(Arc::ptr_eq(&fd, &again), "one memfd per image");
        let mut copy = File::from(fd.try_clone().unwrap());
        assert_eq!(copy.metadata().unwrap().len(), 8 << 20);
        let mut buf = [0u8; 10];
        copy.seek(SeekFrom::Start(4 << 20)).unwrap();
        copy.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"guest page");
        // Even through a new read-write open, as a VMM does, the image cannot change.
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap();
        let err = (&reopened).write_all(b"poison").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        assert!(reopened.set_len(1).is_err());
    }
}

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
//!
//! A fork's memory image never becomes a file: it lives in a memfd from the start
//! ([`GuestMemory::InMemory`](crate::GuestMemory::InMemory)). The one VM that fills it maps it
//! shared; it is sealed on first use by a VM that maps it copy-on-write, which the kernel
//! refuses while the filling VM still maps it, so no VM ever maps an image another can write.
//! Unlike a file image it needs no copy, and it exists once, not twice.

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

/// The memfds of the images in use, shared by every launch of one node.
#[derive(Debug, Default)]
pub(crate) struct MemoryImages {
    /// Copies of image files, sealed.
    images: Mutex<HashMap<ImageKey, Arc<OwnedFd>>>,
    /// In-memory images by name.
    in_memory: Mutex<HashMap<String, InMemory>>,
}

/// One in-memory image.
#[derive(Debug)]
struct InMemory {
    fd: Arc<OwnedFd>,
    sealed: bool,
}

/// Longest memory image we copy or make (guest RAM is bounded by `space_core`'s 64 GiB).
const MAX_IMAGE_BYTES: u64 = 64 << 30;
/// In-memory images held at once (one per fork in flight); each holds up to a guest's RAM
/// until it is forgotten.
pub(crate) const MAX_IN_MEMORY_IMAGES: usize = 16;

/// Why an in-memory image cannot be used as asked.
#[derive(Debug, thiserror::Error)]
pub enum InMemoryImageError {
    #[error("in-memory image {0:?} exists already")]
    Exists(String),
    #[error("no in-memory image {0:?}")]
    Missing(String),
    /// The VM that fills it still maps it shared (it must be gone before others map it).
    #[error("in-memory image {0:?} is still mapped by the VM that fills it")]
    StillFilling(String),
    #[error("{MAX_IN_MEMORY_IMAGES} in-memory images are held already")]
    TooMany,
    #[error("in-memory image {image:?}: {source}")]
    Io {
        image: String,
        #[source]
        source: io::Error,
    },
}

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

impl MemoryImages {
    /// A new in-memory image `name` of `len` bytes (all zero), for the one VM that fills it.
    pub(crate) fn fill(&self, name: &str, len: u64) -> Result<OwnedFd, InMemoryImageError> {
        let io = |source| InMemoryImageError::Io {
            image: name.to_owned(),
            source,
        };
        if len > MAX_IMAGE_BYTES {
            return Err(io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes is more than a guest's RAM may be"),
            )));
        }
        let mut images = self.in_memory.lock().unwrap_or_else(|p| p.into_inner());
        if images.contains_key(name) {
            return Err(InMemoryImageError::Exists(name.to_owned()));
        }
        if images.len() >= MAX_IN_MEMORY_IMAGES {
            return Err(InMemoryImageError::TooMany);
        }
        let memfd = File::from(new_memfd(c"space-in-memory-image").map_err(io)?);
        memfd.set_len(len).map_err(io)?;
        let fd = Arc::new(OwnedFd::from(memfd));
        let handed = fd.try_clone().map_err(io)?;
        images.insert(name.to_owned(), InMemory { fd, sealed: false });
        Ok(handed)
    }

    /// In-memory image `name`, sealed against every write from now on (see the module doc).
    pub(crate) fn sealed(&self, name: &str) -> Result<Arc<OwnedFd>, InMemoryImageError> {
        let mut images = self.in_memory.lock().unwrap_or_else(|p| p.into_inner());
        let image = images
            .get_mut(name)
            .ok_or_else(|| InMemoryImageError::Missing(name.to_owned()))?;
        if !image.sealed {
            match seal(&image.fd) {
                Ok(()) => image.sealed = true,
                // F_SEAL_WRITE with a writable shared mapping in place.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(InMemoryImageError::StillFilling(name.to_owned()))
                }
                Err(source) => {
                    return Err(InMemoryImageError::Io {
                        image: name.to_owned(),
                        source,
                    })
                }
            }
        }
        Ok(image.fd.clone())
    }

    /// Drops in-memory image `name` (VMs that map it keep their pages); whether it existed.
    pub(crate) fn forget(&self, name: &str) -> bool {
        let mut images = self.in_memory.lock().unwrap_or_else(|p| p.into_inner());
        images.remove(name).is_some()
    }
}

/// A new memfd that can be sealed.
fn new_memfd(name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Seals a memfd against writes, growth, shrinking and further seals.
fn seal(fd: &OwnedFd) -> io::Result<()> {
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a memfd we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Copies the data extents of `file` into a new memfd and seals it.
fn sealed_copy(file: &File, len: u64) -> io::Result<OwnedFd> {
    let out = File::from(new_memfd(c"space-memory-image")?);
    out.set_len(len)?;
    let src = file.as_raw_fd();
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
    let out = OwnedFd::from(out);
    seal(&out)?;
    Ok(out)
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

    #[test]
    fn an_in_memory_image_is_sealed_only_once_its_filler_is_gone() {
        let images = MemoryImages::default();
        let len = 1 << 20;
        let filler = images.fill("fork-a", len).unwrap();
        assert!(matches!(
            images.fill("fork-a", len),
            Err(InMemoryImageError::Exists(_))
        ));
        // The filling VM maps it shared and writes guest RAM into it.
        // SAFETY: a fresh shared mapping of a memfd of `len` bytes, unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                filler.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        // SAFETY: within the mapping.
        unsafe { std::ptr::copy_nonoverlapping(b"guest page".as_ptr(), map.cast(), 10) };
        assert!(matches!(
            images.sealed("fork-a"),
            Err(InMemoryImageError::StillFilling(_))
        ));
        // SAFETY: the mapping made above.
        assert_eq!(unsafe { libc::munmap(map, len as usize) }, 0);
        drop(filler);
        let sealed = images.sealed("fork-a").unwrap();
        let again = images.sealed("fork-a").unwrap();
        assert!(Arc::ptr_eq(&sealed, &again));
        let mut buf = [0u8; 10];
        File::from(sealed.try_clone().unwrap())
            .read_exact_at(&mut buf, 0)
            .unwrap();
        assert_eq!(&buf, b"guest page");
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", sealed.as_raw_fd()))
            .unwrap();
        assert_eq!(
            (&reopened).write_all(b"poison").unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        assert!(images.forget("fork-a"));
        assert!(!images.forget("fork-a"));
        assert!(matches!(
            images.sealed("fork-a"),
            Err(InMemoryImageError::Missing(_))
        ));
        // What was handed out stays readable after the image is forgotten.
        File::from(sealed.try_clone().unwrap())
            .read_exact_at(&mut buf, 0)
            .unwrap();
    }

    #[test]
    fn in_memory_images_are_bounded() {
        let images = MemoryImages::default();
        for i in 0..MAX_IN_MEMORY_IMAGES {
            images.fill(&format!("fork-{i}"), 4096).unwrap();
        }
        assert!(matches!(
            images.fill("one-more", 4096),
            Err(InMemoryImageError::TooMany)
        ));
        assert!(images.fill("big", MAX_IMAGE_BYTES + 1).is_err());
        images.forget("fork-0");
        images.fill("one-more", 4096).unwrap();
    }
}

//! Filesystem primitives: btrfs detection, reflinks (FICLONE), sparse copies, atomic writes, flock.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use rand::Rng;

use crate::error::{IoContext, StorageError};

/// Whether `path` is on a btrfs filesystem (statfs `f_type == BTRFS_SUPER_MAGIC`).
pub fn is_btrfs(path: &Path) -> Result<bool, StorageError> {
    let st =
        nix::sys::statfs::statfs(path).map_err(|e| StorageError::io("statfs", path, e.into()))?;
    Ok(st.filesystem_type() == nix::sys::statfs::BTRFS_SUPER_MAGIC)
}

/// Makes `dst` (which must not exist) a reflink of `src` with the FICLONE ioctl: O(1), no data
/// copied, no space used until either file is written. Fails — never copies — when the
/// filesystem cannot share extents (EXDEV, EOPNOTSUPP, EINVAL); `dst` is then removed.
pub fn reflink(src: &Path, dst: &Path) -> Result<(), StorageError> {
    let src_file = File::open(src).ctx("open", src)?;
    reflink_from(&src_file, src, dst)
}

/// [`reflink`] from an open file (`src` names it in errors).
fn reflink_from(src_file: &File, src: &Path, dst: &Path) -> Result<(), StorageError> {
    let dst_file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(dst)
        .ctx("create", dst)?;
    // SAFETY: FICLONE takes the source descriptor as its argument; both descriptors are open
    // for the duration of the call.
    let rc = unsafe { libc::ioctl(dst_file.as_raw_fd(), libc::FICLONE, src_file.as_raw_fd()) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        drop(dst_file);
        let _ = std::fs::remove_file(dst);
        return Err(StorageError::Reflink {
            src: src.to_owned(),
            dst: dst.to_owned(),
            source: err,
        });
    }
    Ok(())
}

/// Copies the open file `src` (named `name` in errors) to `dst` (which must not exist), as a
/// reflink where the filesystem can and as a sparse copy otherwise. The copy is taken from
/// the descriptor, so what is copied is what was opened, whatever the path means by now.
pub fn copy_open_file(src: &File, name: &Path, dst: &Path) -> Result<(), StorageError> {
    match reflink_from(src, name, dst) {
        Ok(()) => Ok(()),
        Err(StorageError::Reflink { source, .. })
            if matches!(
                source.raw_os_error(),
                Some(libc::EXDEV | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOTTY)
            ) =>
        {
            let mut from = src.try_clone().ctx("duplicate", name)?;
            let result = copy_sparse_from(&mut from, name, dst);
            if result.is_err() {
                let _ = std::fs::remove_file(dst);
            }
            result
        }
        Err(e) => Err(e),
    }
}

/// Copies `src` to `dst` (which must not exist), as a reflink when both are on one btrfs and as
/// a sparse copy (holes stay holes) otherwise. For sharing caches between stores; never used
/// for sandbox disks, which must be reflinks.
pub fn reflink_or_copy(src: &Path, dst: &Path) -> Result<(), StorageError> {
    let file = File::open(src).ctx("open", src)?;
    copy_open_file(&file, src, dst)
}

/// Copies the data regions of `src` into a new file `dst`, leaving holes as holes.
pub fn copy_sparse(src: &Path, dst: &Path) -> Result<(), StorageError> {
    let result = copy_sparse_inner(src, dst);
    if result.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    result
}

fn copy_sparse_inner(src: &Path, dst: &Path) -> Result<(), StorageError> {
    let mut from = File::open(src).ctx("open", src)?;
    copy_sparse_from(&mut from, src, dst)
}

fn copy_sparse_from(from: &mut File, src: &Path, dst: &Path) -> Result<(), StorageError> {
    use nix::unistd::{lseek, Whence};
    let perm = from.metadata().ctx("stat", src)?.permissions();
    let mut to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .ctx("create", dst)?;
    let len = from.metadata().ctx("stat", src)?.len();
    to.set_len(len).ctx("set the size of", dst)?;
    let len = i64::try_from(len)
        .map_err(|_| StorageError::io("copy", src, io::Error::other("file too large")))?;
    let mut pos: i64 = 0;
    while pos < len {
        let start = match lseek(from.as_raw_fd(), pos, Whence::SeekData) {
            Ok(s) => s,
            Err(nix::errno::Errno::ENXIO) => break, // no data after pos
            Err(e) => return Err(StorageError::io("seek in", src, e.into())),
        };
        let end = lseek(from.as_raw_fd(), start, Whence::SeekHole)
            .map_err(|e| StorageError::io("seek in", src, e.into()))?;
        from.seek(SeekFrom::Start(start as u64))
            .ctx("seek in", src)?;
        to.seek(SeekFrom::Start(start as u64)).ctx("seek in", dst)?;
        let n =
            io::copy(&mut (&mut *from).take((end - start) as u64), &mut to).ctx("copy to", dst)?;
        if n == 0 {
            break;
        }
        pos = start + n as i64;
    }
    to.set_permissions(perm).ctx("chmod", dst)?;
    to.sync_all().ctx("sync", dst)?;
    Ok(())
}

/// The SHA-256 of the file at `path`, lower-case hex.
pub fn sha256_of(path: &Path) -> Result<String, StorageError> {
    use sha2::{Digest, Sha256};
    let mut f = File::open(path).ctx("open", path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).ctx("read", path)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Writes `data` to `path` atomically: a temporary file beside it, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), StorageError> {
    write_atomic_mode(path, data, 0o644)
}

/// [`write_atomic`] for a file only its owner may read (mode 0600 from its creation on).
pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<(), StorageError> {
    write_atomic_mode(path, data, 0o600)
}

fn write_atomic_mode(path: &Path, data: &[u8], mode: u32) -> Result<(), StorageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", random_suffix()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .ctx("create", &tmp)?;
        f.write_all(data).ctx("write", &tmp)?;
        f.sync_all().ctx("sync", &tmp)?;
        std::fs::rename(&tmp, path).ctx("rename into place", path)?;
        fsync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// fsyncs a directory so a rename inside it survives a crash.
pub fn fsync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .ctx("open", dir)?
        .sync_all()
        .ctx("sync", dir)
}

/// Creates a directory and its parents.
pub(crate) fn create_dir_all(path: &Path) -> Result<(), StorageError> {
    std::fs::create_dir_all(path).ctx("create directory", path)
}

/// Eight random lowercase letters/digits, for temporary names.
pub(crate) fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..8)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// An exclusive `flock` on a lock file, held until dropped. Works between threads (each takes
/// its own open file description) and between processes.
#[derive(Debug)]
pub struct FileLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl FileLock {
    /// Blocks until the exclusive lock on `path` (created if missing) is ours.
    pub fn exclusive(path: &Path) -> Result<FileLock, StorageError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .ctx("open lock file", path)?;
        loop {
            match Flock::lock(
                file.try_clone().ctx("open lock file", path)?,
                FlockArg::LockExclusive,
            ) {
                Ok(lock) => {
                    return Ok(FileLock {
                        _lock: lock,
                        path: path.to_owned(),
                    })
                }
                Err((_, nix::errno::Errno::EINTR)) => continue,
                Err((_, e)) => return Err(StorageError::io("lock", path, e.into())),
            }
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_copy_keeps_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let dst = dir.path().join("dst");
        let mut f = File::create(&src).unwrap();
        f.set_len(8 << 20).unwrap();
        f.seek(SeekFrom::Start(4 << 20)).unwrap();
        f.write_all(b"hello in the middle").unwrap();
        drop(f);
        copy_sparse(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        use std::os::unix::fs::MetadataExt;
        assert!(
            std::fs::metadata(&dst).unwrap().blocks() * 512 < 1 << 20,
            "holes were filled"
        );
    }

    #[test]
    fn atomic_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn reflink_across_filesystems_fails_cleanly() {
        // /dev/shm is tmpfs: no reflinks. The error must say so and leave no file behind.
        let src_dir = tempfile::tempdir().unwrap();
        let src = src_dir.path().join("a");
        std::fs::write(&src, b"data").unwrap();
        let dst_dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let dst = dst_dir.path().join("b");
        let err = reflink(&src, &dst).unwrap_err();
        assert!(matches!(err, StorageError::Reflink { .. }), "{err}");
        assert!(!dst.exists());
        reflink_or_copy(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"data");
    }
}

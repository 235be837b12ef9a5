//! Small file-system helpers shared by the store, the key files and the command backend's
//! metadata file: private directories, atomic replacement, bounded reads.
//!
//! Atomic replacement is the classic sequence: write a temporary file in the same directory
//! (mode 0600, created exclusively), `fsync` it, `rename` it over the target, `fsync` the
//! directory. A crash leaves either the old file or the new one, never a mix; at worst a stale
//! temporary file (named with [`TEMP_PREFIX`], which listings skip and openers clean up).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use rand::Rng;

/// Mode of every file this crate creates: owner read/write only.
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// Mode of every directory this crate creates: owner only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Name prefix of temporary files (dot files: listings skip them).
pub const TEMP_PREFIX: &str = ".tmp-";

/// Creates `dir` (and missing parents) with mode 0700; an existing directory is left as is.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)
}

/// A fresh temporary file name for `final_name`.
pub fn temp_name(final_name: &str) -> String {
    let n: u64 = rand::thread_rng().gen();
    format!("{TEMP_PREFIX}{final_name}-{n:016x}")
}

/// Creates a new private file (fails if it exists) and writes `bytes`, fsynced.
pub fn create_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_FILE_MODE)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Atomically replaces `dir/final_name` with `bytes` (see the module doc).
pub fn write_atomic(dir: &Path, final_name: &str, bytes: &[u8]) -> io::Result<()> {
    let temp = dir.join(temp_name(final_name));
    if let Err(e) = create_private(&temp, bytes) {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    if let Err(e) = fs::rename(&temp, dir.join(final_name)) {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    sync_dir(dir)
}

/// Flushes a directory's entries (after a rename, link or unlink in it).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reads a whole file of at most `max` bytes; a larger file is an `InvalidData` error.
pub fn read_bounded(path: &Path, max: usize) -> io::Result<Vec<u8>> {
    let file = File::open(path)?;
    read_file_bounded(file, max)
}

/// Reads an open file of at most `max` bytes; a larger file is an `InvalidData` error.
pub fn read_file_bounded(file: File, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("file is larger than {max} bytes"),
        ));
    }
    Ok(buf)
}

/// Removes stale temporary files left in `dir` by a crash. Best effort.
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_write_replaces_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(dir.path(), "f", b"one").unwrap();
        write_atomic(dir.path(), "f", b"two").unwrap();
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"two");
        let mode = fs::metadata(dir.path().join("f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, PRIVATE_FILE_MODE);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn bounded_reads_refuse_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, vec![b'x'; 11]).unwrap();
        assert_eq!(read_bounded(&p, 11).unwrap().len(), 11);
        assert_eq!(
            read_bounded(&p, 10).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn stale_temps_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(temp_name("x")), b"").unwrap();
        fs::write(dir.path().join("keep"), b"").unwrap();
        remove_stale_temps(dir.path());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["keep"]);
    }
}

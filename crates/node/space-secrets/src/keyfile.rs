//! 32-byte keys kept in files: the store's master key and the placeholder key.
//!
//! Format: exactly [`KEY_LEN`] raw random bytes, nothing else, mode 0600, owned by the user
//! the node runs as. A key file is created on first use (its directory too, mode 0700): random
//! bytes from the OS, written to a private temporary file, fsynced, then hard-linked into
//! place, which fails rather than overwrites if another process created the key meanwhile (that
//! process's key is then used). A key file that is not a regular file, is group- or
//! world-accessible, belongs to another user or has the wrong length is refused: we never
//! "fix" permissions, since a key that was readable may already be known.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rand::rngs::OsRng;
use rand::RngCore;
use zeroize::Zeroizing;

use crate::fsutil;

/// Length of a key, in bytes (256 bits).
pub const KEY_LEN: usize = 32;

/// Permission bits a key file may not have: any access for group or others.
pub const FORBIDDEN_KEY_MODE_BITS: u32 = 0o077;

/// Key bytes, wiped on drop.
pub type KeyBytes = Zeroizing<[u8; KEY_LEN]>;

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// Reading, creating or linking failed.
    #[error("key file {path}: {source}")]
    Io {
        /// The key file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Group or others may access the file.
    #[error("key file {path} has mode {mode:04o}: group or others may access it; refusing (a key that was readable may be known: make a new one, or restrict it with chmod 600 if you are sure it was not read)")]
    InsecurePermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Owned by another user.
    #[error("key file {path} belongs to uid {owner}, not to us (uid {us}); refusing")]
    WrongOwner {
        /// The key file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        us: u32,
    },
    /// Not a regular file.
    #[error("key file {path} is not a regular file")]
    NotAFile {
        /// The key file.
        path: PathBuf,
    },
    /// Wrong size.
    #[error("key file {path} is {len} bytes, expected exactly {KEY_LEN}")]
    WrongLength {
        /// The key file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
}

/// Loads the key at `path`, creating it (and its directory) if it does not exist.
pub fn load_or_create_key(path: &Path) -> Result<KeyBytes, KeyFileError> {
    match load_key(path) {
        Err(KeyFileError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            create_key(path)?;
            load_key(path)
        }
        other => other,
    }
}

/// Loads an existing key file, checking type, owner, mode and length.
pub fn load_key(path: &Path) -> Result<KeyBytes, KeyFileError> {
    let io_err = |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(KeyFileError::NotAFile {
            path: path.to_owned(),
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & FORBIDDEN_KEY_MODE_BITS != 0 {
        return Err(KeyFileError::InsecurePermissions {
            path: path.to_owned(),
            mode,
        });
    }
    let us = nix::unistd::geteuid().as_raw();
    if meta.uid() != us {
        return Err(KeyFileError::WrongOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            us,
        });
    }
    if meta.len() != KEY_LEN as u64 {
        return Err(KeyFileError::WrongLength {
            path: path.to_owned(),
            len: meta.len(),
        });
    }
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    file.read_exact(key.as_mut()).map_err(io_err)?;
    // The file must not have grown between fstat and read.
    let mut probe = [0u8; 1];
    if file.read(&mut probe).map_err(io_err)? != 0 {
        return Err(KeyFileError::WrongLength {
            path: path.to_owned(),
            len: KEY_LEN as u64 + 1,
        });
    }
    Ok(key)
}

/// Creates a fresh key file at `path` unless one appears meanwhile (see the module doc).
fn create_key(path: &Path) -> Result<(), KeyFileError> {
    let io_err = |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    fsutil::ensure_private_dir(dir).map_err(io_err)?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| io_err(io::Error::new(io::ErrorKind::InvalidInput, "no file name")))?;
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    OsRng.fill_bytes(key.as_mut());
    let temp = dir.join(fsutil::temp_name(&file_name));
    fsutil::create_private(&temp, key.as_ref()).map_err(io_err)?;
    let linked = fs::hard_link(&temp, path);
    let _ = fs::remove_file(&temp);
    match linked {
        Ok(()) => {
            fsutil::sync_dir(dir).map_err(io_err)?;
            tracing::info!(path = %path.display(), "created a new key file");
            Ok(())
        }
        // Someone else created it first: theirs is the key.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_once_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/master.key");
        let a = load_or_create_key(&path).unwrap();
        let b = load_or_create_key(&path).unwrap();
        assert_eq!(*a, *b);
        assert_ne!(*a, [0u8; KEY_LEN]);
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
        let dir_mode = fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        // Nothing but the key is left behind.
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn group_or_world_readable_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        load_or_create_key(&path).unwrap();
        for mode in [0o640, 0o604, 0o660, 0o606, 0o610] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            let err = load_or_create_key(&path).unwrap_err();
            assert!(
                matches!(err, KeyFileError::InsecurePermissions { mode: m, .. } if m == mode),
                "{mode:o}: {err}"
            );
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o400)).unwrap();
        assert!(load_or_create_key(&path).is_ok());
    }

    #[test]
    fn wrong_length_and_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short.key");
        fsutil::create_private(&path, &[1u8; 31]).unwrap();
        assert!(matches!(
            load_or_create_key(&path).unwrap_err(),
            KeyFileError::WrongLength { len: 31, .. }
        ));
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(
            load_or_create_key(&sub).unwrap_err(),
            KeyFileError::NotAFile { .. }
        ));
    }
}

//! Unpacking a tar archive into a directory (a template build's `COPY`): regular files,
//! directories, symbolic and hard links, with their permission bits; owned by the acting
//! user (root, or `COPY --chown`'s). Device nodes and FIFOs are refused, and so is any entry
//! whose path leaves the directory (the tar crate's `unpack_in` checks each one).

use std::io::Read;
use std::path::Path;

use space_core::files::UnpackedArchive as Unpacked;
use space_core::ErrorCode;

use crate::error::ApiError;

/// Unpacks the tar stream `input` under `dest` (made if missing, with its parents).
pub fn unpack(input: impl Read, dest: &Path) -> Result<Unpacked, ApiError> {
    std::fs::create_dir_all(dest).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidPath,
            format!("cannot make {}: {e}", dest.display()),
        )
    })?;
    let mut archive = tar::Archive::new(input);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(false);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    let mut done = Unpacked {
        entries: 0,
        bytes: 0,
    };
    let entries = archive
        .entries()
        .map_err(|e| ApiError::invalid(format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| ApiError::invalid(format!("bad tar entry: {e}")))?;
        let kind = entry.header().entry_type();
        let path = entry
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        use tar::EntryType as T;
        match kind {
            T::Regular | T::Continuous | T::Directory | T::Symlink | T::Link => {}
            // Metadata entries the reader applies to the next entry.
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink => continue,
            other => {
                return Err(ApiError::invalid(format!(
                    "{path:?}: entries of type {other:?} cannot be copied (only files, directories and links)"
                )))
            }
        }
        let size = entry.size();
        let unpacked = entry.unpack_in(dest).map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidPath,
                format!("cannot write {path:?}: {e}"),
            )
        })?;
        if !unpacked {
            return Err(ApiError::new(
                ErrorCode::InvalidPath,
                format!("{path:?} lies outside the destination"),
            ));
        }
        done.entries += 1;
        done.bytes += size;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, data).unwrap();
    }

    #[test]
    fn files_dirs_and_links_are_unpacked_with_their_modes() {
        let dir = tempfile::tempdir().unwrap();
        let tar = archive(|b| {
            file(b, "app/run.sh", b"#!/bin/sh\n", 0o755);
            file(b, "app/data.txt", b"hello", 0o600);
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, "app/link", "data.txt").unwrap();
        });
        let done = unpack(&tar[..], &dir.path().join("dest")).unwrap();
        assert_eq!(done.entries, 3);
        let app = dir.path().join("dest/app");
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| std::fs::metadata(app.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("run.sh"), 0o755);
        assert_eq!(mode("data.txt"), 0o600);
        assert_eq!(std::fs::read_to_string(app.join("link")).unwrap(), "hello");
    }

    #[test]
    fn escapes_and_devices_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        // Written by hand: the tar crate's builder refuses `..` itself.
        h.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
        h.set_cksum();
        let mut tar = h.as_bytes().to_vec();
        tar.extend_from_slice(&[b'x'; 512]);
        tar.extend_from_slice(&[0; 1024]);
        let dest = dir.path().join("dest");
        assert!(unpack(&tar[..], &dest).is_err());
        assert!(!dir.path().join("escape").exists());

        let fifo = archive(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Fifo);
            h.set_size(0);
            b.append_data(&mut h, "pipe", &[][..]).unwrap();
        });
        let e = unpack(&fifo[..], &dest).unwrap_err();
        assert!(e.to_string().contains("Fifo"), "{e}");
        assert!(unpack(&b"not a tar archive at all"[..], &dest).is_err());
    }
}

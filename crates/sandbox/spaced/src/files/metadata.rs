//! A file's metadata (small key/value strings set when it is written), kept with the file
//! as extended attributes under `space_core::files::FILE_METADATA_XATTR_PREFIX`, so it
//! moves, copies (with `cp -a`) and snapshots with it. Read back bounded: whatever the
//! guest's own programs put there, a stat reports at most `MAX_FILE_METADATA_BYTES`.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use space_core::files::{FILE_METADATA_XATTR_PREFIX, MAX_FILE_METADATA_BYTES};
use space_core::ErrorCode;
use xattr::FileExt as _;

use crate::error::ApiError;

/// Sets `metadata` on the open `file` (the temporary file of an atomic write, so the file
/// appears with its metadata or not at all).
pub fn set(
    file: &File,
    target: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    for (key, value) in metadata {
        let name = format!("{FILE_METADATA_XATTR_PREFIX}{key}");
        file.set_xattr(&name, value.as_bytes()).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOTSUP) {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "the file system of {} keeps no file metadata",
                        target.display()
                    ),
                )
            } else {
                ApiError::io("set metadata of", target, &e)
            }
        })?;
    }
    Ok(())
}

/// The metadata of `path` (not following a final symlink); empty if it has none or the
/// file system keeps none. Attributes that are not valid UTF-8 are skipped.
pub fn read(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(names) = xattr::list(path) else {
        return out;
    };
    let mut total = 0usize;
    for name in names {
        let Some(key) = name
            .to_str()
            .and_then(|n| n.strip_prefix(FILE_METADATA_XATTR_PREFIX))
        else {
            continue;
        };
        let Ok(Some(value)) = xattr::get(path, &name) else {
            continue;
        };
        let Ok(value) = String::from_utf8(value) else {
            continue;
        };
        total = total.saturating_add(key.len() + value.len());
        if total > MAX_FILE_METADATA_BYTES {
            break;
        }
        out.insert(key.to_owned(), value);
    }
    out
}

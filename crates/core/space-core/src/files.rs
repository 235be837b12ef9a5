//! Files inside a sandbox: path rules and the metadata the file API returns.
//!
//! File operations never touch the host: the node forwards them to the guest daemon,
//! which runs them as the requesting user. Paths are still checked at both ends, so a
//! traversal attempt is refused with a clear `invalid_path` error rather than resolved.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod watch;

/// Longest path accepted.
pub const MAX_PATH: usize = 4096;
/// Deepest recursive listing.
pub const MAX_LIST_DEPTH: u32 = 16;
/// Most entries one listing returns (then `truncated` is set).
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty path.
    #[error("path is empty")]
    Empty,
    /// Longer than [`MAX_PATH`].
    #[error("path is longer than {MAX_PATH} bytes")]
    TooLong,
    /// Contains a NUL byte.
    #[error("path contains a NUL byte")]
    Nul,
    /// Contains a `..` component.
    #[error("path may not contain '..' components")]
    Traversal,
}

/// The extended-attribute namespace a file's metadata is kept under in the guest
/// (`user.space.meta.<key>`).
pub const FILE_METADATA_XATTR_PREFIX: &str = "user.space.meta.";
/// Longest metadata key.
pub const MAX_FILE_METADATA_KEY: usize = 128;
/// Most bytes of a file's metadata, keys and values together.
pub const MAX_FILE_METADATA_BYTES: usize = 4096;

/// Why file metadata was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileMetadataError {
    /// A key is empty, too long, or has characters other than `[a-z0-9._-]`.
    #[error("metadata keys are 1 to {MAX_FILE_METADATA_KEY} of [a-z0-9._-]")]
    Key,
    /// A value has control characters.
    #[error("metadata values may not contain control characters")]
    Value,
    /// Keys and values together are too large.
    #[error("metadata is at most {MAX_FILE_METADATA_BYTES} bytes, keys and values together")]
    TooLarge,
}

/// Checks a file's metadata: small key/value strings kept with the file.
pub fn validate_file_metadata(
    metadata: &BTreeMap<String, String>,
) -> Result<(), FileMetadataError> {
    let mut total = 0usize;
    for (k, v) in metadata {
        let key_ok = !k.is_empty()
            && k.len() <= MAX_FILE_METADATA_KEY
            && k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !key_ok {
            return Err(FileMetadataError::Key);
        }
        if v.chars().any(char::is_control) {
            return Err(FileMetadataError::Value);
        }
        total = total.saturating_add(k.len() + v.len());
    }
    if total > MAX_FILE_METADATA_BYTES {
        return Err(FileMetadataError::TooLarge);
    }
    Ok(())
}

/// What marks the temporary file of an atomic write (`.{name}.space-tmp-{16 hex}`, next to
/// the target, renamed over it once complete).
pub const ATOMIC_WRITE_MARKER: &str = ".space-tmp-";

/// The temporary name an atomic write of `name` uses, with random `nonce`.
pub fn atomic_write_temp_name(name: &str, nonce: u64) -> String {
    format!(".{name}{ATOMIC_WRITE_MARKER}{nonce:016x}")
}

/// If `name` (a base name) is the temporary file of an atomic write, the name it is for.
pub fn atomic_write_target(name: &str) -> Option<&str> {
    let rest = name.strip_prefix('.')?;
    let (target, nonce) = rest.rsplit_once(ATOMIC_WRITE_MARKER)?;
    (!target.is_empty() && nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some(target)
}

/// Checks a guest path: absolute, or relative to the user's home; no `..`, no NUL.
pub fn validate_path(path: &str) -> Result<(), PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    if path.split('/').any(|c| c == "..") {
        return Err(PathError::Traversal);
    }
    Ok(())
}

/// Kind of a file system entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (device, socket, fifo).
    Other,
}

/// What a symlink resolves to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResolvedLink {
    /// The absolute path with every link resolved (`realpath`).
    pub path: String,
    /// Kind of the entry there (never `symlink`).
    pub kind: FileKind,
    /// Its permission bits.
    pub mode: u32,
}

/// What unpacking an archive into a sandbox wrote (`PUT /v1/files/archive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnpackedArchive {
    /// Entries written.
    pub entries: u64,
    /// Bytes of file contents written.
    pub bytes: u64,
}

/// Metadata of one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileStat {
    /// Absolute path in the guest.
    pub path: String,
    /// Last component.
    pub name: String,
    /// Kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (e.g. 0o644 = 420).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Name of the owner (from the guest's `/etc/passwd`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Name of the group (from the guest's `/etc/group`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Modification time, ms since the Unix epoch.
    pub modified_ms: i64,
    /// Target, for symlinks: the link's own text (`readlink`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// For a symlink that resolves (every link followed): what it resolves to. `None` for
    /// a broken link and for anything that is not a link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<ResolvedLink>,
    /// Its metadata (set when it was written), for regular files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// A directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileList {
    /// Entries, depth-first, sorted by path.
    pub entries: Vec<FileStat>,
    /// More entries existed than [`MAX_LIST_ENTRIES`].
    pub truncated: bool,
}

/// Create a directory and its parents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// Directory to create (with parents, like `mkdir -p`).
    pub path: String,
    /// Permission bits; default 0o755.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// User to act as; default the sandbox's default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Rename (move) within the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// Existing path.
    pub from: String,
    /// New path; replaced if it is a file.
    pub to: String,
    /// User to act as; default the sandbox's default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_metadata_is_small_and_plain() {
        let ok: BTreeMap<String, String> = [("origin".into(), "test run".into())].into();
        assert_eq!(validate_file_metadata(&ok), Ok(()));
        let upper: BTreeMap<String, String> = [("Origin".into(), "x".into())].into();
        assert_eq!(validate_file_metadata(&upper), Err(FileMetadataError::Key));
        let ctl: BTreeMap<String, String> = [("k".into(), "a\nb".into())].into();
        assert_eq!(validate_file_metadata(&ctl), Err(FileMetadataError::Value));
        let big: BTreeMap<String, String> =
            [("k".into(), "x".repeat(MAX_FILE_METADATA_BYTES))].into();
        assert_eq!(
            validate_file_metadata(&big),
            Err(FileMetadataError::TooLarge)
        );
    }

    #[test]
    fn atomic_write_temp_names_round_trip() {
        let tmp = atomic_write_temp_name("a.txt", 0xdead);
        assert_eq!(tmp, ".a.txt.space-tmp-000000000000dead");
        assert_eq!(atomic_write_target(&tmp), Some("a.txt"));
        assert_eq!(atomic_write_target("a.txt"), None);
        assert_eq!(atomic_write_target(".a.txt.space-tmp-xyz"), None);
        assert_eq!(atomic_write_target("..space-tmp-000000000000dead"), None);
    }

    #[test]
    fn traversal_and_nul_are_refused() {
        assert_eq!(validate_path("../etc/passwd"), Err(PathError::Traversal));
        assert_eq!(
            validate_path("/home/user/../../etc"),
            Err(PathError::Traversal)
        );
        assert_eq!(validate_path("a\0b"), Err(PathError::Nul));
        assert_eq!(validate_path(""), Err(PathError::Empty));
        assert!(validate_path("/home/user/a..b/c").is_ok());
        assert!(validate_path("notes.txt").is_ok());
    }
}

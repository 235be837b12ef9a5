//! The file operations themselves: blocking, called with the thread already acting as the
//! user (see `fsuser`). Errors carry the operation and path and map to API error codes.

use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_core::files::{FileKind, FileList, FileStat, ResolvedLink, MAX_LIST_ENTRIES};
use space_core::ErrorCode;
use space_guest_proto::limits::MAX_JSON_BODY;

use crate::error::ApiError;
use crate::users::{account_names, AccountNames};

/// Mode of directories created as parents of a written file.
const PARENT_DIR_MODE: u32 = 0o755;
/// Most symlinks a write follows at its path (the kernel's own bound, `MAXSYMLINKS`).
const MAX_LINK_HOPS: usize = 40;

/// Metadata as the API reports it (for `path` as given, not following a final symlink),
/// with the owner's and group's names from `names`.
pub fn file_stat(path: &Path, md: &Metadata, names: &AccountNames) -> FileStat {
    let ft = md.file_type();
    let kind = kind_of(md);
    let symlink_target = ft
        .is_symlink()
        .then(|| fs::read_link(path).ok())
        .flatten()
        .map(|t| t.to_string_lossy().into_owned());
    let resolved = ft.is_symlink().then(|| resolve(path)).flatten();
    FileStat {
        path: path.to_string_lossy().into_owned(),
        name: file_stat_name(path),
        kind,
        size: md.size(),
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        owner: names.user(md.uid()).map(str::to_owned),
        group: names.group(md.gid()).map(str::to_owned),
        modified_ms: md
            .mtime()
            .saturating_mul(1000)
            .saturating_add(md.mtime_nsec() / 1_000_000),
        metadata: if kind == FileKind::File {
            super::metadata::read(path)
        } else {
            std::collections::BTreeMap::new()
        },
        symlink_target,
        resolved,
    }
}

fn kind_of(md: &Metadata) -> FileKind {
    let ft = md.file_type();
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// What the symlink `path` resolves to, every link followed; `None` if it is broken (or
/// loops).
fn resolve(path: &Path) -> Option<ResolvedLink> {
    let real = fs::canonicalize(path).ok()?;
    let md = fs::metadata(&real).ok()?;
    Some(ResolvedLink {
        path: real.to_string_lossy().into_owned(),
        kind: kind_of(&md),
        mode: md.mode() & 0o7777,
    })
}

/// Where a write to `path` lands, as an in-place write would: a symlink at the path is
/// followed (a chain of them, to a target that may not exist yet, which the write then
/// creates), and what is there now (`None`: nothing).
pub fn write_target(path: &Path) -> Result<(PathBuf, Option<Metadata>), ApiError> {
    let mut at = path.to_owned();
    for _ in 0..MAX_LINK_HOPS {
        match fs::symlink_metadata(&at) {
            Ok(md) if md.file_type().is_symlink() => {
                let to = fs::read_link(&at).map_err(|e| ApiError::io("readlink", &at, &e))?;
                at = match at.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            Ok(md) => return Ok((at, Some(md))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((at, None)),
            Err(e) => return Err(ApiError::io("stat", &at, &e)),
        }
    }
    Err(ApiError::io(
        "write",
        path,
        &io::Error::from_raw_os_error(libc::ELOOP),
    ))
}

/// `stat` of a file written through a link, named by the path the caller gave.
pub fn named_as(mut stat: FileStat, path: &Path) -> FileStat {
    stat.path = path.to_string_lossy().into_owned();
    stat.name = file_stat_name(path);
    stat
}

/// `mkdir -p` of `dir` with [`PARENT_DIR_MODE`]: the parents a write or a move creates.
fn create_parents(dir: &Path) -> Result<(), ApiError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PARENT_DIR_MODE)
        .create(dir)
        .map_err(|e| ApiError::io("create directory", dir, &e))
}

fn file_stat_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "/".to_owned(), |n| n.to_string_lossy().into_owned())
}

/// `lstat`.
pub fn stat(path: &Path) -> Result<FileStat, ApiError> {
    let md = fs::symlink_metadata(path).map_err(|e| ApiError::io("stat", path, &e))?;
    Ok(file_stat(path, &md, &account_names()))
}

/// Opens a regular file for reading; returns it and its size.
pub fn open_read(path: &Path) -> Result<(File, u64), ApiError> {
    // O_NONBLOCK so that opening a FIFO cannot hang a worker; it has no effect on reads
    // of regular files, the only kind we serve.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| ApiError::io("open", path, &e))?;
    let md = file
        .metadata()
        .map_err(|e| ApiError::io("stat", path, &e))?;
    if md.is_dir() {
        return Err(ApiError::io(
            "read",
            path,
            &io::Error::from_raw_os_error(libc::EISDIR),
        ));
    }
    if !md.is_file() {
        return Err(ApiError::new(
            ErrorCode::InvalidPath,
            format!("read {}: not a regular file", path.display()),
        ));
    }
    Ok((file, md.size()))
}

/// Reads up to `buf.len()` bytes (a chunk of a streamed read).
pub fn read_chunk(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match file.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// `mkdir -p`; `mode` applies to the directories it creates.
pub fn mkdir_p(path: &Path, mode: u32) -> Result<FileStat, ApiError> {
    let existed = fs::symlink_metadata(path).ok();
    if let Some(md) = &existed {
        if !md.is_dir() {
            return Err(ApiError::io(
                "mkdir",
                path,
                &io::Error::from_raw_os_error(libc::EEXIST),
            ));
        }
        return Ok(file_stat(path, md, &account_names()));
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|e| ApiError::io("mkdir", path, &e))?;
    // The umask may have cut bits off the requested mode.
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| ApiError::io("chmod", path, &e))?;
    stat(path)
}

/// Removes a file, symlink or (empty, or with `recursive` any) directory. Never `/`.
pub fn remove(path: &Path, recursive: bool) -> Result<(), ApiError> {
    if path == Path::new("/") {
        return Err(ApiError::new(
            ErrorCode::InvalidPath,
            "refusing to remove /",
        ));
    }
    let md = fs::symlink_metadata(path).map_err(|e| ApiError::io("remove", path, &e))?;
    let res = if md.is_dir() {
        if recursive {
            // Does not follow symlinks: links inside are removed, not their targets.
            fs::remove_dir_all(path)
        } else {
            fs::remove_dir(path)
        }
    } else {
        fs::remove_file(path)
    };
    res.map_err(|e| ApiError::io("remove", path, &e))
}

/// Renames `from` to `to` (replacing a file at `to`). Across file systems, regular files are
/// copied and the source removed; directories are refused.
pub fn rename(from: &Path, to: &Path) -> Result<(), ApiError> {
    if from == Path::new("/") || to == Path::new("/") {
        return Err(ApiError::new(
            ErrorCode::InvalidPath,
            "cannot rename / or onto /",
        ));
    }
    // As a write does (and E2B's envd), a move creates the destination's parents; only
    // for a source that is there, so a failed move leaves nothing behind.
    if fs::symlink_metadata(from).is_ok() {
        if let Some(parent) = to.parent() {
            create_parents(parent)?;
        }
    }
    match fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let md = fs::symlink_metadata(from).map_err(|e| ApiError::io("rename", from, &e))?;
            if !md.is_file() {
                return Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!(
                        "rename {}: cannot move a directory or special file across file systems",
                        from.display()
                    ),
                ));
            }
            let mut src = File::open(from).map_err(|e| ApiError::io("open", from, &e))?;
            let mut w = AtomicWriter::create(to, md.mode() & 0o7777)?;
            io::copy(&mut src, &mut w.file).map_err(|e| ApiError::io("copy to", to, &e))?;
            w.commit()?;
            fs::remove_file(from).map_err(|e| ApiError::io("remove", from, &e))
        }
        Err(e) => Err(ApiError::io("rename", from, &e)),
    }
}

/// Checks that `path` is a directory itself (a symlink to one is not); errors name `op`.
pub fn require_dir(op: &str, path: &Path) -> Result<(), ApiError> {
    let md = fs::symlink_metadata(path).map_err(|e| ApiError::io(op, path, &e))?;
    if md.is_dir() {
        Ok(())
    } else {
        Err(ApiError::io(
            op,
            path,
            &io::Error::from_raw_os_error(libc::ENOTDIR),
        ))
    }
}

/// Lists `root` down to `depth` levels, depth-first with each directory's entries sorted by
/// name (so the whole list is sorted by path, component-wise). Never follows symlinks. Stops
/// at `MAX_LIST_ENTRIES` entries or when the JSON would exceed `MAX_JSON_BODY`.
pub fn list(root: &Path, depth: u32) -> Result<FileList, ApiError> {
    require_dir("list", root)?;
    let mut lister = Lister {
        names: account_names(),
        entries: Vec::new(),
        json_bytes: 64,
        truncated: false,
        full: false,
    };
    lister.walk(root, 1, depth.max(1), true)?;
    Ok(FileList {
        entries: lister.entries,
        truncated: lister.truncated,
    })
}

struct Lister {
    names: Arc<AccountNames>,
    entries: Vec<FileStat>,
    json_bytes: usize,
    truncated: bool,
    /// A bound was hit: add nothing more.
    full: bool,
}

impl Lister {
    /// Errors below the top directory (unreadable subdirectories) skip that subtree.
    fn walk(&mut self, dir: &Path, level: u32, max: u32, top: bool) -> Result<(), ApiError> {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if top => return Err(ApiError::io("list", dir, &e)),
            Err(_) => return Ok(()),
        };
        // Bound the names held in memory for one huge directory.
        let mut names: Vec<OsString> = Vec::new();
        let mut dir_truncated = false;
        for entry in rd.flatten() {
            if names.len() >= MAX_LIST_ENTRIES {
                dir_truncated = true;
                break;
            }
            names.push(entry.file_name());
        }
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        self.truncated |= dir_truncated;
        for name in names {
            if self.full {
                return Ok(());
            }
            let path = dir.join(&name);
            let Ok(md) = fs::symlink_metadata(&path) else {
                continue;
            };
            let entry = file_stat(&path, &md, &self.names);
            let size = serde_json::to_vec(&entry).map_or(512, |v| v.len() + 1);
            if self.entries.len() >= MAX_LIST_ENTRIES || self.json_bytes + size > MAX_JSON_BODY {
                self.truncated = true;
                self.full = true;
                return Ok(());
            }
            self.json_bytes += size;
            self.entries.push(entry);
            if md.is_dir() && level < max {
                self.walk(&path, level + 1, max, false)?;
            }
        }
        Ok(())
    }
}

/// Writes a file atomically: a temporary file in the target's directory, fsync, rename.
/// Dropped without `commit`, the temporary file is removed.
pub struct AtomicWriter {
    target: PathBuf,
    tmp: PathBuf,
    /// The temporary file.
    pub file: File,
    committed: bool,
}

impl AtomicWriter {
    /// Creates missing parents and the temporary file with `mode`.
    pub fn create(target: &Path, mode: u32) -> Result<AtomicWriter, ApiError> {
        let parent = target
            .parent()
            .ok_or_else(|| ApiError::new(ErrorCode::InvalidPath, "cannot write to /"))?;
        let name = target
            .file_name()
            .ok_or_else(|| ApiError::new(ErrorCode::InvalidPath, "path has no file name"))?;
        if let Ok(md) = fs::symlink_metadata(target) {
            if md.is_dir() {
                return Err(ApiError::io(
                    "write",
                    target,
                    &io::Error::from_raw_os_error(libc::EISDIR),
                ));
            }
        }
        create_parents(parent)?;
        let tmp = parent.join(space_core::files::atomic_write_temp_name(
            &name.to_string_lossy(),
            rand::random::<u64>(),
        ));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| ApiError::io("create", target, &e))?;
        let w = AtomicWriter {
            target: target.to_owned(),
            tmp,
            file,
            committed: false,
        };
        // Exact mode regardless of the umask.
        w.file
            .set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| ApiError::io("chmod", target, &e))?;
        Ok(w)
    }

    /// Gives the new file the owner of `existing` (the file it replaces), then `mode` again
    /// (a chown clears setuid and setgid). Only root may give a file away: for anyone else
    /// the file stays theirs, as after any replacement, and that is not an error.
    pub fn keep_owner(&self, existing: &Metadata, mode: u32) -> Result<(), ApiError> {
        match std::os::unix::fs::fchown(&self.file, Some(existing.uid()), Some(existing.gid())) {
            Ok(()) => self
                .file
                .set_permissions(fs::Permissions::from_mode(mode))
                .map_err(|e| ApiError::io("chmod", &self.target, &e)),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
            Err(e) => Err(ApiError::io("chown", &self.target, &e)),
        }
    }

    /// Gives the file `metadata` (before it is committed, so it appears with it).
    pub fn set_metadata(
        &self,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        super::metadata::set(&self.file, &self.target, metadata)
    }

    /// Appends a chunk.
    pub fn write(&mut self, data: &[u8]) -> Result<(), ApiError> {
        self.file
            .write_all(data)
            .map_err(|e| ApiError::io("write", &self.target, &e))
    }

    /// fsync, rename over the target, fsync the directory; returns the new file's metadata.
    pub fn commit(mut self) -> Result<FileStat, ApiError> {
        self.file
            .sync_all()
            .map_err(|e| ApiError::io("fsync", &self.target, &e))?;
        fs::rename(&self.tmp, &self.target)
            .map_err(|e| ApiError::io("rename into place", &self.target, &e))?;
        self.committed = true;
        if let Some(parent) = self.target.parent() {
            // Best effort: makes the rename itself durable.
            if let Ok(d) = File::open(parent) {
                let _ = d.sync_all();
            }
        }
        stat(&self.target)
    }
}

impl Drop for AtomicWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_is_sorted_depth_first_and_bounded_by_depth() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fs::create_dir_all(p.join("a/b/c")).unwrap();
        fs::write(p.join("a.txt"), "x").unwrap();
        fs::write(p.join("a/b/f"), "y").unwrap();
        std::os::unix::fs::symlink("/", p.join("link")).unwrap();
        let names = |l: FileList| {
            l.entries
                .into_iter()
                .map(|e| e.path.strip_prefix(p.to_str().unwrap()).unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(list(p, 1).unwrap()), vec!["/a", "/a.txt", "/link"]);
        assert_eq!(
            names(list(p, 3).unwrap()),
            vec!["/a", "/a/b", "/a/b/c", "/a/b/f", "/a.txt", "/link"]
        );
        let l = list(p, 1).unwrap();
        assert_eq!(l.entries[2].kind, FileKind::Symlink);
        assert_eq!(l.entries[2].symlink_target.as_deref(), Some("/"));
    }

    #[test]
    fn symlinks_resolve_and_writes_land_where_the_links_lead() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fs::create_dir(p.join("real")).unwrap();
        fs::write(p.join("real/f"), "x").unwrap();
        fs::set_permissions(p.join("real/f"), fs::Permissions::from_mode(0o751)).unwrap();
        std::os::unix::fs::symlink("real/f", p.join("to-f")).unwrap();
        std::os::unix::fs::symlink(p.join("to-f"), p.join("to-to-f")).unwrap();
        std::os::unix::fs::symlink("nowhere/x", p.join("dangling")).unwrap();
        std::os::unix::fs::symlink("loop", p.join("loop")).unwrap();

        let st = stat(&p.join("to-to-f")).unwrap();
        assert_eq!(st.kind, FileKind::Symlink);
        let to = st.resolved.unwrap();
        let real = fs::canonicalize(p.join("real/f")).unwrap();
        assert_eq!(
            (to.path.as_str(), to.kind, to.mode),
            (real.to_str().unwrap(), FileKind::File, 0o751)
        );
        assert_eq!(stat(&p.join("dangling")).unwrap().resolved, None);
        assert_eq!(stat(&p.join("real/f")).unwrap().resolved, None);

        let (at, there) = write_target(&p.join("to-to-f")).unwrap();
        assert_eq!(fs::canonicalize(&at).unwrap(), real);
        assert_eq!(there.unwrap().mode() & 0o7777, 0o751);
        let (at, there) = write_target(&p.join("dangling")).unwrap();
        assert_eq!(at, p.join("nowhere/x"));
        assert!(there.is_none());
        assert!(write_target(&p.join("loop")).is_err());
    }

    #[test]
    fn a_move_creates_the_parents_of_its_destination_only_for_a_real_source() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fs::write(p.join("a"), "a").unwrap();
        rename(&p.join("a"), &p.join("new/dir/a")).unwrap();
        assert_eq!(fs::read_to_string(p.join("new/dir/a")).unwrap(), "a");
        assert!(rename(&p.join("missing"), &p.join("other/x")).is_err());
        assert!(
            !p.join("other").exists(),
            "a failed move leaves nothing behind"
        );
    }

    #[test]
    fn atomic_writer_replaces_and_cleans_up() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("x/y/file");
        let mut w = AtomicWriter::create(&target, 0o600).unwrap();
        w.write(b"hello").unwrap();
        let st = w.commit().unwrap();
        assert_eq!((st.size, st.mode), (5, 0o600));
        let w = AtomicWriter::create(&target, 0o644).unwrap();
        drop(w);
        assert_eq!(fs::read_dir(d.path().join("x/y")).unwrap().count(), 1);
        assert_eq!(fs::read(&target).unwrap(), b"hello");
        assert_eq!(
            remove(Path::new("/"), true).unwrap_err().code(),
            ErrorCode::InvalidPath
        );
    }
}

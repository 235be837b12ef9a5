//! Applying image layers to a directory tree, the way a container runtime would, without
//! trusting them.
//!
//! Every operation is relative to a directory descriptor and resolved by the kernel with
//! `openat2(RESOLVE_BENEATH)`: a path through a symlink is followed only while it stays inside
//! the tree, so an entry can never touch anything outside it (an absolute symlink or a `..`
//! used as a path is refused, as is a `..` in a name). What is applied:
//! - regular files, directories, symlinks, hard links (to files already in the tree), FIFOs;
//!   owners (uid and gid 0-65535, the unpacker's range), modes with setuid/setgid/sticky
//!   bits, modification times, and the xattrs a guest needs (`user.*` and
//!   `security.capability`, i.e. file capabilities; others are skipped and reported);
//! - whiteouts (`.wh.NAME` removes NAME from lower layers) and opaque directories
//!   (`.wh..wh..opq` hides everything lower layers put in a directory); neither hides what
//!   the same layer wrote;
//! - a later entry replaces an earlier one of the same name (a directory stays a directory
//!   and keeps its contents when a layer re-declares it).
//!
//! Refused, with an error naming the layer and the entry: device nodes, sparse and unknown
//! entry types, names with `..`, more bytes or entries than the limits, owners outside the
//! range, a layer whose uncompressed bytes do not hash to the config's `diff_id`, a corrupt or
//! truncated stream.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps, XattrFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why applying a layer failed. Serializable: the unpacker process sends it to its parent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum UnpackError {
    /// An entry's name or the path it goes through leaves the tree.
    #[error("layer {layer}: entry {path:?} escapes the root ({detail})")]
    Escape {
        /// The layer (1 is the lowest).
        layer: usize,
        /// The entry's name.
        path: String,
        /// How.
        detail: String,
    },
    /// A device node: no image needs one (the guest's `/dev` is a devtmpfs).
    #[error("layer {layer}: entry {path:?} is a device node; images may not carry device nodes")]
    DeviceNode {
        /// The layer.
        layer: usize,
        /// The entry.
        path: String,
    },
    /// An entry we refuse or cannot apply.
    #[error("layer {layer}: entry {path:?}: {detail}")]
    BadEntry {
        /// The layer.
        layer: usize,
        /// The entry.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// Past [`UnpackLimits`].
    #[error("{what} is too large: {detail}")]
    TooLarge {
        /// What.
        what: String,
        /// Size and limit.
        detail: String,
    },
    /// Not a tar stream (or a corrupt or truncated one).
    #[error("layer {layer} is not a valid tar stream: {detail}")]
    BadLayer {
        /// The layer.
        layer: usize,
        /// What the decoder said.
        detail: String,
    },
    /// The layer's content is not what the image config says.
    #[error("layer {layer}: its content hashes to {got}, the image config says {expected}")]
    DiffIdMismatch {
        /// The layer.
        layer: usize,
        /// The config's `diff_id`.
        expected: String,
        /// What the uncompressed stream hashes to.
        got: String,
    },
    /// A file system call failed.
    #[error("cannot {action} {path}: {detail}")]
    Io {
        /// What we were doing.
        action: String,
        /// To which entry or file.
        path: String,
        /// The OS error.
        detail: String,
    },
}

/// Bounds on the unpacked tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnpackLimits {
    /// Bytes of file contents over all layers.
    pub max_bytes: u64,
    /// Entries over all layers.
    pub max_entries: u64,
}

/// Longest path accepted (Linux's `PATH_MAX`).
const MAX_PATH: usize = 4096;
/// Most xattrs on one entry, and the largest value.
const MAX_XATTRS: usize = 64;
const MAX_XATTR_VALUE: usize = 64 * 1024;
/// Owners must be inside the unpacker's uid range.
const MAX_ID: u64 = 65_535;

/// The whiteout prefix and the opaque-directory marker.
const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Applies layers, in order, to the tree whose root directory it holds.
pub struct Unpacker {
    root: OwnedFd,
    limits: UnpackLimits,
    bytes: u64,
    entries: u64,
    /// xattr names skipped (not applicable in a guest or not settable by the unpacker).
    pub skipped_xattrs: BTreeSet<String>,
}

/// A path inside the tree as its components (no `.`, no `..`, none empty).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TreePath(Vec<String>);

impl TreePath {
    fn parent(&self) -> &[String] {
        &self.0[..self.0.len().saturating_sub(1)]
    }
    fn name(&self) -> Option<&str> {
        self.0.last().map(String::as_str)
    }
    fn joined(parts: &[String]) -> String {
        if parts.is_empty() {
            ".".to_owned()
        } else {
            parts.join("/")
        }
    }
}

/// Splits an entry name into components: leading `/` and `./` dropped, `.` skipped, `..`
/// refused, each component at most 255 bytes of valid UTF-8 without NUL.
fn tree_path(layer: usize, raw: &[u8]) -> Result<TreePath, UnpackError> {
    let shown = || String::from_utf8_lossy(&raw[..raw.len().min(300)]).into_owned();
    if raw.len() > MAX_PATH {
        return Err(UnpackError::BadEntry {
            layer,
            path: shown(),
            detail: format!("name longer than {MAX_PATH} bytes"),
        });
    }
    let text = std::str::from_utf8(raw).map_err(|_| UnpackError::BadEntry {
        layer,
        path: shown(),
        detail: "name is not UTF-8".into(),
    })?;
    let mut parts = Vec::new();
    for c in text.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(UnpackError::Escape {
                    layer,
                    path: shown(),
                    detail: "a '..' in its name".into(),
                })
            }
            c if c.len() > 255 || c.contains('\0') => {
                return Err(UnpackError::BadEntry {
                    layer,
                    path: shown(),
                    detail: "a name component longer than 255 bytes".into(),
                })
            }
            c => parts.push(c.to_owned()),
        }
    }
    Ok(TreePath(parts))
}

fn io_err(action: &str, path: &str, e: impl std::fmt::Display) -> UnpackError {
    UnpackError::Io {
        action: action.to_owned(),
        path: path.to_owned(),
        detail: e.to_string(),
    }
}

/// A reader that hashes what passes through it and refuses more than `left` bytes.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    left: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "the uncompressed layer is larger than the image limit",
            ));
        }
        self.left -= n as u64;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// The decompressed stream of a layer blob: gzip and zstd recognised by their magic bytes
/// (media types lie more often than magic numbers), anything else read as a plain tar.
fn decompressed<'a>(blob: impl Read + 'a) -> std::io::Result<Box<dyn Read + 'a>> {
    let mut r = BufReader::with_capacity(256 * 1024, blob);
    let head = r.fill_buf()?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::bufread::MultiGzDecoder::new(r))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(r)?)
    } else {
        Box::new(r)
    })
}

impl Unpacker {
    /// An unpacker for the tree at `root` (an existing, empty directory).
    pub fn open(root: &std::path::Path, limits: UnpackLimits) -> Result<Unpacker, UnpackError> {
        let fd = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| io_err("open", &root.display().to_string(), e))?;
        Ok(Unpacker {
            root: fd,
            limits,
            bytes: 0,
            entries: 0,
            skipped_xattrs: BTreeSet::new(),
        })
    }

    /// Bytes of file content applied so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Applies layer number `layer` (1-based, for messages) from its blob, checking that its
    /// uncompressed stream hashes to `diff_id`.
    pub fn apply_layer(
        &mut self,
        layer: usize,
        blob: impl Read,
        diff_id: &str,
    ) -> Result<(), UnpackError> {
        let bad = |e: std::io::Error| UnpackError::BadLayer {
            layer,
            detail: e.to_string(),
        };
        let stream = Hashing {
            inner: decompressed(blob).map_err(bad)?,
            hasher: Sha256::new(),
            // Room for tar headers and padding besides the contents.
            left: self.limits.max_bytes + (self.limits.max_entries + 1024) * 1024,
        };
        let mut archive = tar::Archive::new(stream);
        let mut written: HashSet<TreePath> = HashSet::new();
        for entry in archive.entries().map_err(bad)? {
            let mut entry = entry.map_err(|e| self.stream_error(layer, e))?;
            self.entries += 1;
            if self.entries > self.limits.max_entries {
                return Err(UnpackError::TooLarge {
                    what: "the image".into(),
                    detail: format!("more than {} files", self.limits.max_entries),
                });
            }
            self.apply_entry(layer, &mut entry, &mut written)?;
        }
        // The digest covers the whole stream, the end-of-archive blocks and any padding too.
        let mut stream = archive.into_inner();
        std::io::copy(&mut stream, &mut std::io::sink())
            .map_err(|e| self.stream_error(layer, e))?;
        let got = format!("sha256:{}", hex::encode(stream.hasher.finalize()));
        if got != diff_id {
            return Err(UnpackError::DiffIdMismatch {
                layer,
                expected: diff_id.to_owned(),
                got,
            });
        }
        Ok(())
    }

    fn stream_error(&self, layer: usize, e: std::io::Error) -> UnpackError {
        if e.kind() == std::io::ErrorKind::FileTooLarge {
            UnpackError::TooLarge {
                what: format!("layer {layer}"),
                detail: e.to_string(),
            }
        } else {
            UnpackError::BadLayer {
                layer,
                detail: e.to_string(),
            }
        }
    }

    /// Opens directory `parts` of the tree, resolved beneath the root; missing directories
    /// are made (0755, root's), as container runtimes do for layers that omit them.
    fn open_dir(
        &self,
        layer: usize,
        entry: &str,
        parts: &[String],
    ) -> Result<OwnedFd, UnpackError> {
        let how = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
        let escape = |detail: &str| UnpackError::Escape {
            layer,
            path: entry.to_owned(),
            detail: detail.to_owned(),
        };
        let mut dir = rustix::fs::openat(&self.root, ".", how, Mode::empty())
            .map_err(|e| io_err("open", ".", e))?;
        for i in 0..parts.len() {
            let prefix = TreePath::joined(&parts[..=i]);
            match rustix::fs::openat2(&self.root, &prefix, how, Mode::empty(), resolve) {
                Ok(fd) => dir = fd,
                Err(Errno::NOENT) => {
                    // `dir` is the directory of `parts[..i]`: make the next one in it.
                    match rustix::fs::mkdirat(&dir, parts[i].as_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io_err("make directory", &prefix, e)),
                    }
                    dir = rustix::fs::openat2(&self.root, &prefix, how, Mode::empty(), resolve)
                        .map_err(|e| match e {
                            Errno::XDEV | Errno::LOOP => {
                                escape("through a link that leaves the tree")
                            }
                            e => io_err("open", &prefix, e),
                        })?;
                }
                Err(Errno::XDEV) | Err(Errno::LOOP) => {
                    return Err(escape(&format!(
                        "{prefix} is a link that leads out of the tree"
                    )))
                }
                Err(Errno::NOTDIR) => {
                    return Err(UnpackError::BadEntry {
                        layer,
                        path: entry.to_owned(),
                        detail: format!("{prefix} is not a directory"),
                    })
                }
                Err(e) => return Err(io_err("open", &prefix, e)),
            }
        }
        Ok(dir)
    }

    fn apply_entry<R: Read>(
        &mut self,
        layer: usize,
        entry: &mut tar::Entry<'_, R>,
        written: &mut HashSet<TreePath>,
    ) -> Result<(), UnpackError> {
        let raw = entry.path_bytes().into_owned();
        let path = tree_path(layer, &raw)?;
        let shown = TreePath::joined(&path.0);
        let Some(name) = path.name().map(str::to_owned) else {
            // The root directory itself: its owner and mode are ours to set.
            return Ok(());
        };
        let kind = entry.header().entry_type();
        if name.starts_with(WHITEOUT) {
            return self.whiteout(&path, &name, written);
        }
        let bad = |detail: String| UnpackError::BadEntry {
            layer,
            path: shown.clone(),
            detail,
        };
        let header = entry.header();
        let uid = header.uid().map_err(|e| bad(format!("bad uid: {e}")))?;
        let gid = header.gid().map_err(|e| bad(format!("bad gid: {e}")))?;
        if uid > MAX_ID || gid > MAX_ID {
            return Err(bad(format!(
                "owner {uid}:{gid} is outside 0-{MAX_ID}, the ids a template may use"
            )));
        }
        let mode = header.mode().map_err(|e| bad(format!("bad mode: {e}")))? & 0o7777;
        let mtime = header.mtime().unwrap_or(0);
        let owner = (
            Some(rustix::fs::Uid::from_raw(uid as u32)),
            Some(rustix::fs::Gid::from_raw(gid as u32)),
        );
        let xattrs = self.xattrs(layer, &shown, entry)?;
        let dir = self.open_dir(layer, &shown, path.parent())?;
        let name = name.as_str();
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: mtime as i64,
                tv_nsec: 0,
            },
            last_modification: Timespec {
                tv_sec: mtime as i64,
                tv_nsec: 0,
            },
        };
        use tar::EntryType as T;
        match kind {
            T::Regular | T::Continuous => {
                let size = entry.size();
                if self.bytes.saturating_add(size) > self.limits.max_bytes {
                    return Err(UnpackError::TooLarge {
                        what: format!("layer {layer}, {shown}"),
                        detail: format!(
                            "{size} bytes would take the image past {} bytes",
                            self.limits.max_bytes
                        ),
                    });
                }
                self.bytes += size;
                self.clear(&dir, name, &shown)?;
                let fd = rustix::fs::openat(
                    &dir,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| io_err("create", &shown, e))?;
                let mut file = std::fs::File::from(fd);
                let copied = std::io::copy(&mut entry.take(size), &mut file)
                    .map_err(|e| self.stream_error(layer, e))?;
                if copied != size {
                    return Err(UnpackError::BadLayer {
                        layer,
                        detail: format!("{shown}: truncated ({copied} of {size} bytes)"),
                    });
                }
                self.finish(&file, owner, mode, &xattrs, &times, &shown)?;
            }
            T::Directory => {
                let existing = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).ok();
                let is_dir = existing
                    .as_ref()
                    .is_some_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory);
                if !is_dir {
                    self.clear(&dir, name, &shown)?;
                    rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700))
                        .map_err(|e| io_err("make directory", &shown, e))?;
                }
                let fd = rustix::fs::openat(
                    &dir,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io_err("open", &shown, e))?;
                self.finish(&fd, owner, mode, &xattrs, &times, &shown)?;
            }
            T::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if target.is_empty() || target.len() >= MAX_PATH || target.contains(&0) {
                    return Err(bad("symlink target empty, too long or with a NUL".into()));
                }
                self.clear(&dir, name, &shown)?;
                rustix::fs::symlinkat(target.as_slice(), &dir, name)
                    .map_err(|e| io_err("make symlink", &shown, e))?;
                rustix::fs::chownat(&dir, name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_err("chown", &shown, e))?;
                rustix::fs::utimensat(&dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_err("set times of", &shown, e))?;
            }
            T::Link => {
                let target_raw = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let target = tree_path(layer, &target_raw)?;
                let Some(target_name) = target.name() else {
                    return Err(bad("a hard link to the root".into()));
                };
                if target == path {
                    return Ok(());
                }
                let target_shown = TreePath::joined(&target.0);
                let tdir = self.open_dir(layer, &shown, target.parent())?;
                match rustix::fs::statat(&tdir, target_name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(s) if FileType::from_raw_mode(s.st_mode) == FileType::Directory => {
                        return Err(bad(format!("a hard link to directory {target_shown}")))
                    }
                    Ok(_) => {}
                    Err(_) => {
                        return Err(bad(format!(
                            "a hard link to {target_shown}, which is not in the image"
                        )))
                    }
                }
                self.clear(&dir, name, &shown)?;
                rustix::fs::linkat(&tdir, target_name, &dir, name, AtFlags::empty())
                    .map_err(|e| io_err("make hard link", &shown, e))?;
            }
            T::Fifo => {
                self.clear(&dir, name, &shown)?;
                rustix::fs::mknodat(&dir, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
                    .map_err(|e| io_err("make fifo", &shown, e))?;
                rustix::fs::chownat(&dir, name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_err("chown", &shown, e))?;
                rustix::fs::chmodat(&dir, name, Mode::from_raw_mode(mode), AtFlags::empty())
                    .map_err(|e| io_err("chmod", &shown, e))?;
            }
            T::Char | T::Block => return Err(UnpackError::DeviceNode { layer, path: shown }),
            T::XGlobalHeader => return Ok(()),
            T::GNUSparse => return Err(bad("sparse files are not supported".into())),
            other => {
                return Err(bad(format!(
                    "unsupported entry type {:?}",
                    other.as_byte() as char
                )))
            }
        }
        written.insert(path);
        Ok(())
    }

    /// Owner, then mode (a chown clears setuid bits), then xattrs (a chown clears file
    /// capabilities too), then times.
    fn finish(
        &self,
        fd: &impl AsFd,
        owner: (Option<rustix::fs::Uid>, Option<rustix::fs::Gid>),
        mode: u32,
        xattrs: &[(String, Vec<u8>)],
        times: &Timestamps,
        shown: &str,
    ) -> Result<(), UnpackError> {
        rustix::fs::fchown(fd, owner.0, owner.1).map_err(|e| io_err("chown", shown, e))?;
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(|e| io_err("chmod", shown, e))?;
        for (k, v) in xattrs {
            rustix::fs::fsetxattr(fd, k.as_str(), v, XattrFlags::empty())
                .map_err(|e| io_err(&format!("set xattr {k} on"), shown, e))?;
        }
        rustix::fs::futimens(fd, times).map_err(|e| io_err("set times of", shown, e))
    }

    /// The entry's xattrs we apply (from PAX `SCHILY.xattr.*` records); the others' names
    /// are remembered in `skipped_xattrs`.
    fn xattrs<R: Read>(
        &mut self,
        layer: usize,
        shown: &str,
        entry: &mut tar::Entry<'_, R>,
    ) -> Result<Vec<(String, Vec<u8>)>, UnpackError> {
        let mut out = Vec::new();
        let Ok(Some(exts)) = entry.pax_extensions() else {
            return Ok(out);
        };
        for ext in exts {
            let ext = ext.map_err(|e| UnpackError::BadEntry {
                layer,
                path: shown.to_owned(),
                detail: format!("bad PAX header: {e}"),
            })?;
            let Ok(key) = ext.key() else { continue };
            let Some(name) = key.strip_prefix("SCHILY.xattr.") else {
                continue;
            };
            if out.len() >= MAX_XATTRS || ext.value_bytes().len() > MAX_XATTR_VALUE {
                return Err(UnpackError::BadEntry {
                    layer,
                    path: shown.to_owned(),
                    detail: format!(
                        "more than {MAX_XATTRS} xattrs or one larger than {MAX_XATTR_VALUE} bytes"
                    ),
                });
            }
            if name.starts_with("user.") || name == "security.capability" {
                out.push((name.to_owned(), ext.value_bytes().to_vec()));
            } else if self.skipped_xattrs.len() < 64 {
                self.skipped_xattrs.insert(name.chars().take(100).collect());
            }
        }
        Ok(out)
    }

    /// Applies a whiteout: `.wh.NAME` removes NAME, `.wh..wh..opq` empties the directory of
    /// what lower layers put there.
    fn whiteout(
        &self,
        path: &TreePath,
        name: &str,
        written: &HashSet<TreePath>,
    ) -> Result<(), UnpackError> {
        let shown = TreePath::joined(&path.0);
        let parent = path.parent();
        let dir = match self.open_dir_existing(parent) {
            Some(d) => d,
            None => return Ok(()),
        };
        if name == OPAQUE {
            let children = list(&dir).map_err(|e| io_err("list", &shown, e))?;
            for child in children {
                let mut p = parent.to_vec();
                p.push(child.clone());
                if !written.contains(&TreePath(p)) {
                    remove_at(&dir, &child, 0).map_err(|e| io_err("remove", &shown, e))?;
                }
            }
            return Ok(());
        }
        let Some(target) = name.strip_prefix(WHITEOUT) else {
            return Ok(());
        };
        if target.is_empty() || target.starts_with(WHITEOUT) || target == "." || target == ".." {
            // `.wh..wh.plnk` and the like: AUFS bookkeeping, nothing to remove.
            return Ok(());
        }
        let mut p = parent.to_vec();
        p.push(target.to_owned());
        if written.contains(&TreePath(p)) {
            return Ok(());
        }
        match remove_at(&dir, target, 0) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(io_err("remove", &shown, e)),
        }
    }

    /// Directory `parts` if it exists (and resolves beneath the root).
    fn open_dir_existing(&self, parts: &[String]) -> Option<OwnedFd> {
        rustix::fs::openat2(
            &self.root,
            TreePath::joined(parts),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
        )
        .ok()
    }

    /// Makes way for a new entry `name` in `dir`: whatever is there goes, a directory with
    /// its contents (a directory re-declared as a directory is kept by the caller).
    fn clear(&self, dir: &OwnedFd, name: &str, shown: &str) -> Result<(), UnpackError> {
        match remove_at(dir, name, 0) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(io_err("replace", shown, e)),
        }
    }
}

/// Access to the finished tree for the plumbing: every path resolved beneath the root.
impl Unpacker {
    fn split(path: &str) -> Vec<String> {
        path.split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    }

    fn open_beneath(&self, path: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
        rustix::fs::openat2(
            &self.root,
            path,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
        )
    }

    /// Makes top-level directory `name` (root's, `mode`) unless it is one; a mount point
    /// (`replace`) that is a link or a file is replaced by a directory.
    pub(crate) fn ensure_real_dir(&self, name: &str, mode: u32) -> Result<(), UnpackError> {
        let mount_point = matches!(name, "dev" | "run" | "proc" | "sys");
        match rustix::fs::statat(&self.root, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) if FileType::from_raw_mode(s.st_mode) == FileType::Directory => return Ok(()),
            Ok(_) if !mount_point => return Ok(()),
            Ok(_) => remove_at(&self.root, name, 0).map_err(|e| io_err("replace", name, e))?,
            Err(_) => {}
        }
        rustix::fs::mkdirat(&self.root, name, Mode::from_raw_mode(0o700))
            .map_err(|e| io_err("make directory", name, e))?;
        let fd = rustix::fs::openat(
            &self.root,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("open", name, e))?;
        rustix::fs::fchown(
            &fd,
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::ROOT),
        )
        .map_err(|e| io_err("chown", name, e))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| io_err("chmod", name, e))
    }

    /// Whether `path` (links followed inside the tree) is an executable regular file.
    pub(crate) fn is_executable_file(&self, path: &str) -> bool {
        self.open_beneath(path, OFlags::PATH)
            .and_then(rustix::fs::fstat)
            .is_ok_and(|s| {
                FileType::from_raw_mode(s.st_mode) == FileType::RegularFile
                    && s.st_mode & 0o111 != 0
            })
    }

    /// The text of `path` (at most `limit` bytes), or "" if there is none.
    pub(crate) fn read_text(&self, path: &str, limit: u64) -> Result<String, UnpackError> {
        let fd = match self.open_beneath(path, OFlags::RDONLY) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(String::new()),
            Err(e) => return Err(io_err("open", path, e)),
        };
        let mut buf = Vec::new();
        std::fs::File::from(fd)
            .take(limit + 1)
            .read_to_end(&mut buf)
            .map_err(|e| io_err("read", path, e))?;
        if buf.len() as u64 > limit {
            return Err(UnpackError::TooLarge {
                what: path.to_owned(),
                detail: format!("more than {limit} bytes"),
            });
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Writes `text` to `path` (replacing a link there), root's, `mode`.
    pub(crate) fn write_text(&self, path: &str, text: &str, mode: u32) -> Result<(), UnpackError> {
        use std::io::Write as _;
        let parts = Self::split(path);
        let Some((name, parent)) = parts.split_last() else {
            return Err(io_err("write", path, "not a file path"));
        };
        let dir = self.open_dir(0, path, parent)?;
        if rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) != FileType::RegularFile)
        {
            remove_at(&dir, name, 0).map_err(|e| io_err("replace", path, e))?;
        }
        let fd = rustix::fs::openat(
            &dir,
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| io_err("create", path, e))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(text.as_bytes())
            .map_err(|e| io_err("write", path, e))?;
        rustix::fs::fchown(&f, Some(rustix::fs::Uid::ROOT), Some(rustix::fs::Gid::ROOT))
            .map_err(|e| io_err("chown", path, e))?;
        rustix::fs::fchmod(&f, Mode::from_raw_mode(mode)).map_err(|e| io_err("chmod", path, e))
    }

    /// Makes directory `path` and its parents (root's, 0755) where missing.
    pub(crate) fn ensure_dir(&self, path: &str) -> Result<(), UnpackError> {
        self.open_dir(0, path, &Self::split(path)).map(drop)
    }

    /// Makes home directory `path` (0755, `uid`:`gid`) unless it exists.
    pub(crate) fn ensure_home(&self, path: &str, uid: u32, gid: u32) -> Result<(), UnpackError> {
        let parts = Self::split(path);
        let Some((name, parent)) = parts.split_last() else {
            return Ok(());
        };
        let dir = self.open_dir(0, path, parent)?;
        match rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)) {
            Ok(()) => {}
            Err(Errno::EXIST) => return Ok(()),
            Err(e) => return Err(io_err("make directory", path, e)),
        }
        rustix::fs::chownat(
            &dir,
            name.as_str(),
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io_err("chown", path, e))?;
        rustix::fs::chmodat(
            &dir,
            name.as_str(),
            Mode::from_raw_mode(0o755),
            AtFlags::empty(),
        )
        .map_err(|e| io_err("chmod", path, e))
    }
}

/// The names in a directory (without `.` and `..`).
fn list(dir: &OwnedFd) -> rustix::io::Result<Vec<String>> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let d = rustix::fs::Dir::read_from(&fd)?;
    let mut names = Vec::new();
    for e in d {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(String::from_utf8_lossy(n).into_owned());
        }
    }
    Ok(names)
}

/// Removes `name` from `dir`, recursively if it is a directory (never following a link).
fn remove_at(dir: &OwnedFd, name: &str, depth: usize) -> rustix::io::Result<()> {
    // Paths are at most 4096 bytes, so no tree is deeper than 2048.
    if depth > 2048 {
        return Err(Errno::LOOP);
    }
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for child in list(&sub)? {
        remove_at(&sub, &child, depth + 1)?;
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

#[cfg(test)]
mod tests;

//! Which files changed between two disk snapshots.
//!
//! The images are ext4 filesystems written by a hostile guest, so they are never mounted in
//! the host kernel (a crafted filesystem is a kernel attack surface). They are read in
//! userspace by `ext4-view`, a read-only reader written for untrusted input (no unsafe code,
//! fuzzed, errors instead of panics); the journal is replayed in memory, the image is never
//! written. On top of that, every walk is bounded: depth, entries, name bytes, and bytes read
//! from each image; a panic in the reader becomes an error.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ext4_view::{Ext4, Ext4Error, Ext4Read, FileType, Metadata};
use space_core::{FileChange, FileChangeKind};

use crate::error::{IoContext, StorageError};

/// Deepest directory level walked; deeper subtrees are not compared (the diff is marked
/// truncated).
pub const MAX_DIFF_DEPTH: usize = 64;
/// Most directory entries read from one image; the walk stops there (truncated).
pub const MAX_DIFF_ENTRIES: usize = 1_000_000;
/// Most bytes of entry names read from one image (bounds memory); the walk stops there.
pub const MAX_DIFF_NAME_BYTES: u64 = 64 << 20;
/// Most bytes the reader may read from one image; past that the diff fails. (A walk of a
/// 50,000-file tree reads about 90 MB.)
pub const MAX_DIFF_READ_BYTES: u64 = 4 << 30;
/// Longest a diff may walk; past that it returns what it has, truncated. Bounds the CPU a
/// crafted image can burn in lookups served from the reader's cache (not counted as reads).
pub const MAX_DIFF_DURATION: Duration = Duration::from_secs(30);

/// The ext4 reader's source: the image file, read with `pread`, within a byte budget.
struct BoundedReader {
    file: File,
    left: u64,
}

impl Ext4Read for BoundedReader {
    fn read(
        &mut self,
        start_byte: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        let len = dst.len() as u64;
        if len > self.left {
            return Err(format!(
                "read more than {MAX_DIFF_READ_BYTES} bytes from the image; giving up"
            )
            .into());
        }
        self.left -= len;
        self.file.read_exact_at(dst, start_byte)?;
        Ok(())
    }
}

/// What is compared for one path.
struct Node {
    name: Vec<u8>,
    meta: Metadata,
}

/// One image being walked, with what it has used of its bounds.
struct Tree {
    fs: Ext4,
    image: PathBuf,
    entries: usize,
    name_bytes: u64,
    deadline: Instant,
}

/// Why the walk stopped early.
enum Stop {
    /// A bound or the output limit was reached: return what we have, truncated.
    Truncated,
    /// The image could not be read.
    Failed(StorageError),
}

impl From<StorageError> for Stop {
    fn from(e: StorageError) -> Self {
        Stop::Failed(e)
    }
}

impl Tree {
    fn open(image: &Path, deadline: Instant) -> Result<Tree, StorageError> {
        let file = File::open(image).ctx("open", image)?;
        let fs = Ext4::load(Box::new(BoundedReader {
            file,
            left: MAX_DIFF_READ_BYTES,
        }))
        .map_err(|e| ext4_error(image, &e))?;
        Ok(Tree {
            fs,
            image: image.to_owned(),
            entries: 0,
            name_bytes: 0,
            deadline,
        })
    }

    /// The entries of directory `dir` (without `.` and `..`), sorted by name bytes.
    fn list(&mut self, dir: &[u8]) -> Result<Vec<Node>, Stop> {
        let entries = match self.fs.read_dir(dir) {
            Ok(e) => e,
            // Beyond the reader's path bound (4096 bytes, like PATH_MAX): not compared.
            Err(Ext4Error::PathTooLong) => return Err(Stop::Truncated),
            Err(e) => return Err(Stop::Failed(ext4_error(&self.image, &e))),
        };
        let mut nodes = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ext4_error(&self.image, &e))?;
            let name = entry.file_name();
            let name: &[u8] = name.as_ref();
            if name == b"." || name == b".." {
                continue;
            }
            self.entries += 1;
            self.name_bytes += name.len() as u64;
            if self.out_of_bounds() {
                return Err(Stop::Truncated);
            }
            let meta = entry.metadata().map_err(|e| ext4_error(&self.image, &e))?;
            nodes.push(Node {
                name: name.to_vec(),
                meta,
            });
        }
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    /// A bound that ends the whole walk has been reached.
    fn out_of_bounds(&self) -> bool {
        self.entries > MAX_DIFF_ENTRIES
            || self.name_bytes > MAX_DIFF_NAME_BYTES
            || Instant::now() > self.deadline
    }

    fn root(&self) -> Result<Metadata, StorageError> {
        self.fs
            .symlink_metadata(b"/")
            .map_err(|e| ext4_error(&self.image, &e))
    }

    fn link_target(&self, path: &[u8]) -> Result<Vec<u8>, StorageError> {
        self.fs
            .read_link(path)
            .map(|p| p.as_ref().to_vec())
            .map_err(|e| ext4_error(&self.image, &e))
    }
}

/// Whether a directory present in both images had entries added, removed or replaced.
fn entries_changed(x: &Metadata, y: &Metadata) -> bool {
    x.modified() != y.modified() || x.len() != y.len()
}

fn ext4_error(image: &Path, e: &Ext4Error) -> StorageError {
    StorageError::Ext4 {
        image: image.to_owned(),
        message: e.to_string(),
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !dir.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

#[derive(Clone, Copy)]
enum Side {
    Before,
    After,
}

struct Walk {
    before: Tree,
    after: Tree,
    changes: Vec<FileChange>,
    limit: usize,
    /// A subtree was skipped (depth, path length) without stopping the walk.
    skipped: bool,
}

impl Walk {
    fn emit(
        &mut self,
        path: &[u8],
        kind: FileChangeKind,
        before: Option<&Metadata>,
        after: Option<&Metadata>,
    ) -> Result<(), Stop> {
        if self.changes.len() >= self.limit {
            return Err(Stop::Truncated);
        }
        self.changes.push(FileChange {
            path: String::from_utf8_lossy(path).into_owned(),
            kind,
            size_before: before.map(Metadata::len),
            size_after: after.map(Metadata::len),
        });
        Ok(())
    }

    fn tree(&mut self, side: Side) -> &mut Tree {
        match side {
            Side::Before => &mut self.before,
            Side::After => &mut self.after,
        }
    }

    /// Lists `dir` in `side` if it is within the depth bound; `None` (and marks the diff
    /// truncated) when the subtree is skipped.
    fn list(&mut self, side: Side, dir: &[u8], depth: usize) -> Result<Option<Vec<Node>>, Stop> {
        if depth > MAX_DIFF_DEPTH {
            self.skipped = true;
            return Ok(None);
        }
        match self.tree(side).list(dir) {
            Ok(nodes) => Ok(Some(nodes)),
            Err(Stop::Truncated) => {
                // Path too long, or a bound: a bound stops the walk at the next list.
                if self.tree(side).out_of_bounds() {
                    return Err(Stop::Truncated);
                }
                self.skipped = true;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Compares directory `dir`, present as a directory in both images; its entries are at
    /// `depth`. `dir_changed`: its entries changed (its mtime or size differs).
    fn both(&mut self, dir: &[u8], depth: usize, dir_changed: bool) -> Result<(), Stop> {
        let (Some(before), Some(after)) = (
            self.list(Side::Before, dir, depth)?,
            self.list(Side::After, dir, depth)?,
        ) else {
            return Ok(());
        };
        let mut b = before.into_iter().peekable();
        let mut a = after.into_iter().peekable();
        loop {
            let order = match (b.peek(), a.peek()) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(x), Some(y)) => x.name.cmp(&y.name),
            };
            match order {
                std::cmp::Ordering::Less => {
                    let Some(x) = b.next() else { break };
                    self.one_side(Side::Before, &join(dir, &x.name), &x.meta, depth)?;
                }
                std::cmp::Ordering::Greater => {
                    let Some(y) = a.next() else { break };
                    self.one_side(Side::After, &join(dir, &y.name), &y.meta, depth)?;
                }
                std::cmp::Ordering::Equal => {
                    let (Some(x), Some(y)) = (b.next(), a.next()) else {
                        break;
                    };
                    self.pair(&join(dir, &x.name), &x.meta, &y.meta, depth, dir_changed)?;
                }
            }
        }
        Ok(())
    }

    /// A path present in both images, in a directory whose entries changed or not.
    fn pair(
        &mut self,
        path: &[u8],
        x: &Metadata,
        y: &Metadata,
        depth: usize,
        dir_changed: bool,
    ) -> Result<(), Stop> {
        if x.file_type() != y.file_type() {
            self.emit(path, FileChangeKind::TypeChanged, Some(x), Some(y))?;
            if x.is_dir() {
                self.subtree(Side::Before, path, depth + 1)?;
            }
            if y.is_dir() {
                self.subtree(Side::After, path, depth + 1)?;
            }
            return Ok(());
        }
        if self.differs(path, x, y, dir_changed)? {
            self.emit(path, FileChangeKind::Modified, Some(x), Some(y))?;
        }
        if x.is_dir() {
            self.both(path, depth + 1, entries_changed(x, y))?;
        }
        Ok(())
    }

    /// Whether two entries of the same type differ. Directories compare mode and owner only:
    /// their size and mtime change whenever an entry is added or removed, which the entries
    /// themselves already report.
    ///
    /// Symlinks with the same size (target length) and mtime also compare their target, but
    /// only in a directory whose entries changed: a symlink cannot be retargeted in place, only
    /// replaced, which changes its directory. Reading every target would cost a path lookup
    /// each, a linear scan of the parent in directories made by `mkfs.ext4 -d` (no htree):
    /// quadratic in big template directories such as `/usr/share/man/man3`.
    fn differs(
        &mut self,
        path: &[u8],
        x: &Metadata,
        y: &Metadata,
        dir_changed: bool,
    ) -> Result<bool, Stop> {
        let owner_mode = (x.mode(), x.uid(), x.gid()) != (y.mode(), y.uid(), y.gid());
        if x.is_dir() {
            return Ok(owner_mode);
        }
        if owner_mode || x.len() != y.len() || x.modified() != y.modified() {
            return Ok(true);
        }
        if x.file_type() == FileType::Symlink && dir_changed {
            return Ok(self.before.link_target(path)? != self.after.link_target(path)?);
        }
        Ok(false)
    }

    /// A path present in only one image: reported, and everything below it too.
    fn one_side(
        &mut self,
        side: Side,
        path: &[u8],
        meta: &Metadata,
        depth: usize,
    ) -> Result<(), Stop> {
        match side {
            Side::Before => self.emit(path, FileChangeKind::Removed, Some(meta), None)?,
            Side::After => self.emit(path, FileChangeKind::Added, None, Some(meta))?,
        }
        if meta.is_dir() {
            self.subtree(side, path, depth + 1)?;
        }
        Ok(())
    }

    /// Everything below directory `dir` of `side`, all added or all removed.
    fn subtree(&mut self, side: Side, dir: &[u8], depth: usize) -> Result<(), Stop> {
        let Some(nodes) = self.list(side, dir, depth)? else {
            return Ok(());
        };
        for n in nodes {
            self.one_side(side, &join(dir, &n.name), &n.meta, depth)?;
        }
        Ok(())
    }
}

/// The files that differ between two ext4 disk images, `a` (older) and `b` (newer): each
/// path is compared by type, size, mode, owner, mtime and symlink target, and reported as
/// added, removed, modified or type-changed; everything below an added or removed directory
/// is reported too. Changes come in path order, component by component (a directory, then
/// what is in it). At most `limit` are returned; the flag says the list was cut there or at
/// the walk's bounds ([`MAX_DIFF_DEPTH`], [`MAX_DIFF_ENTRIES`], [`MAX_DIFF_NAME_BYTES`],
/// [`MAX_DIFF_DURATION`]); past [`MAX_DIFF_READ_BYTES`] read from one image it fails.
///
/// The images are read in userspace, never mounted. A corrupt or unsupported image is an
/// error ([`StorageError::Ext4`]), never a panic. Contents are not read: a write that keeps
/// size, mode, owner and mtime (the guest controls mtime) is not seen. Blocking and
/// CPU-bound: run it off the async runtime.
pub fn diff_disk_images(
    a: &Path,
    b: &Path,
    limit: usize,
) -> Result<(Vec<FileChange>, bool), StorageError> {
    let run = || -> Result<(Vec<FileChange>, bool), StorageError> {
        let deadline = Instant::now() + MAX_DIFF_DURATION;
        let mut walk = Walk {
            before: Tree::open(a, deadline)?,
            after: Tree::open(b, deadline)?,
            changes: Vec::new(),
            limit,
            skipped: false,
        };
        let root_changed = entries_changed(&walk.before.root()?, &walk.after.root()?);
        match walk.both(b"/", 1, root_changed) {
            Ok(()) => Ok((walk.changes, walk.skipped)),
            Err(Stop::Truncated) => Ok((walk.changes, true)),
            Err(Stop::Failed(e)) => Err(e),
        }
    };
    // ext4-view is written not to panic on bad input; should it anyway, the guest's image
    // must not take the node down.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
        Err(StorageError::Ext4 {
            image: a.to_owned(),
            message: format!(
                "the ext4 reader failed unexpectedly on this image or on {}",
                b.display()
            ),
        })
    })
}

//! What a file's extent map (the FIEMAP ioctl) tells without reading the file: how much
//! disk space it holds on its own, and which of its bytes are known to equal another file's
//! (a reflink shares its extents with its source until either is written).
//!
//! We use the `fiemap` crate rather than our own ioctl: it is small, sound (the request
//! struct is `repr(C)` with its extent array inline, `fm_extent_count` matches the array, and
//! the descriptor outlives the iterator), loops with a fixed 8-extent buffer until an extent
//! flagged `LAST` or an empty answer, and retries on EINTR. What it does not do — account
//! shared extents, guard against a filesystem that makes no progress — is done here.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use fiemap::{Fiemap, FiemapExtentFlags, FiemapFlags};

use crate::error::{IoContext, StorageError};

/// A file's allocated extents, split by whether another file (a reflink, a snapshot) also
/// references them. Holes are in neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtentUsage {
    /// Bytes in extents only this file references: what deleting it would free.
    pub exclusive: u64,
    /// Bytes in extents shared with other files.
    pub shared: u64,
}

/// The extents of `path`, split into exclusive and shared bytes. Dirty data is flushed first
/// (FIEMAP_FLAG_SYNC), so data not yet written back is counted as what it will be.
pub fn extent_usage(path: &Path) -> Result<ExtentUsage, StorageError> {
    let file = File::open(path).ctx("open", path)?;
    let mut usage = ExtentUsage::default();
    each_extent(&file, path, |extent| {
        if extent.fe_flags.contains(FiemapExtentFlags::SHARED) {
            usage.shared = usage.shared.saturating_add(extent.fe_length);
        } else {
            usage.exclusive = usage.exclusive.saturating_add(extent.fe_length);
        }
        Ok(())
    })?;
    Ok(usage)
}

/// Hands each extent of `file` (at `path`) to `f`, in logical order, dirty data flushed
/// first (FIEMAP_FLAG_SYNC).
fn each_extent(
    file: &File,
    path: &Path,
    mut f: impl FnMut(&fiemap::FiemapExtent) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    let mut end_of_last = 0u64;
    for extent in Fiemap::with_flags(file, FiemapFlags::SYNC) {
        let extent = extent.ctx("map the extents (FIEMAP) of", path)?;
        let end = extent.fe_logical.saturating_add(extent.fe_length);
        // Extents come in increasing logical order and the iterator asks for the next batch
        // from the end of the last one: an extent that does not move forward would make it
        // loop forever.
        if extent.fe_length == 0 || end <= end_of_last || extent.fe_logical < end_of_last {
            return Err(StorageError::io(
                "map the extents (FIEMAP) of",
                path,
                std::io::Error::other("the filesystem returned extents out of order"),
            ));
        }
        end_of_last = end;
        f(&extent)?;
    }
    Ok(())
}

/// Most extents read from one file to compare it with another: a disk fragmented past this
/// is compared by reading it (what the map would save is small by then).
const MAX_COMPARED_EXTENTS: usize = 1 << 20;

/// One extent of a file's map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mapped {
    /// Where it starts in the file.
    pub logical: u64,
    /// Where it starts on the device.
    pub physical: u64,
    /// Its length.
    pub length: u64,
    /// How its bytes read: straight from `physical` on (`Direct`), as zeros (allocated but
    /// unwritten), or in a way the map does not tell (compressed, inline, pending).
    pub reads: Reads,
}

/// How an extent's bytes are read (see [`Mapped::reads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    Direct,
    Zeros,
    Opaque,
}

fn mapped_extents(file: &File, path: &Path) -> Result<Vec<Mapped>, StorageError> {
    let opaque = FiemapExtentFlags::UNKNOWN
        | FiemapExtentFlags::DELALLOC
        | FiemapExtentFlags::ENCODED
        | FiemapExtentFlags::DATA_ENCRYPTED
        | FiemapExtentFlags::NOT_ALIGNED
        | FiemapExtentFlags::DATA_INLINE
        | FiemapExtentFlags::DATA_TAIL
        | FiemapExtentFlags::MERGED;
    let mut extents = Vec::new();
    each_extent(file, path, |e| {
        if extents.len() == MAX_COMPARED_EXTENTS {
            return Err(StorageError::io(
                "map the extents (FIEMAP) of",
                path,
                std::io::Error::other("too many extents to compare"),
            ));
        }
        let reads = if e.fe_flags.intersects(opaque) {
            Reads::Opaque
        } else if e.fe_flags.contains(FiemapExtentFlags::UNWRITTEN) {
            Reads::Zeros
        } else {
            Reads::Direct
        };
        extents.push(Mapped {
            logical: e.fe_logical,
            physical: e.fe_physical,
            length: e.fe_length,
            reads,
        });
        Ok(())
    })?;
    Ok(extents)
}

/// Byte ranges of `disk` that read the same as `base` at the same offsets, known from the two
/// files' extent maps alone (sorted, disjoint): where both map to the same place on the
/// device (a reflink's extents not written since), and where both read as zeros (holes,
/// unwritten extents, past `base`'s end). Everything else may differ and has to be read.
/// The files must not be written meanwhile.
pub fn identical_ranges(base: &Path, disk: &Path) -> Result<Vec<Range<u64>>, StorageError> {
    let base_file = File::open(base).ctx("open", base)?;
    let disk_file = File::open(disk).ctx("open", disk)?;
    let base_len = base_file.metadata().ctx("stat", base)?.len();
    let disk_len = disk_file.metadata().ctx("stat", disk)?.len();
    Ok(identical(
        &mapped_extents(&base_file, base)?,
        base_len,
        &mapped_extents(&disk_file, disk)?,
        disk_len,
    ))
}

/// [`identical_ranges`] from the two maps (each sorted, as FIEMAP returns them).
pub(crate) fn identical(
    base: &[Mapped],
    base_len: u64,
    disk: &[Mapped],
    disk_len: u64,
) -> Vec<Range<u64>> {
    let mut same = Vec::new();
    // The same device bytes at the same file offsets. A file's last extent may run past its
    // end (whole filesystem blocks): only what both files hold counts.
    let (mut i, mut j) = (0, 0);
    while i < disk.len() && j < base.len() {
        let (d, b) = (&disk[i], &base[j]);
        let start = d.logical.max(b.logical);
        let (d_end, b_end) = (
            d.logical.saturating_add(d.length),
            b.logical.saturating_add(b.length),
        );
        let end = d_end.min(b_end).min(base_len).min(disk_len);
        let aligned = d.physical.wrapping_sub(d.logical) == b.physical.wrapping_sub(b.logical);
        if start < end && d.reads == Reads::Direct && b.reads == Reads::Direct && aligned {
            same.push(start..end);
        }
        if d_end <= b_end {
            i += 1;
        } else {
            j += 1;
        }
    }
    // Zeros on both sides.
    same.extend(intersect(
        &zeros(disk, disk_len, disk_len),
        &zeros(base, base_len, disk_len),
    ));
    same.sort_by_key(|r| r.start);
    coalesce(same)
}

/// Where a file of `len` bytes reads as zeros within `[0, limit)`: holes, unwritten extents,
/// and everything past its end.
fn zeros(extents: &[Mapped], len: u64, limit: u64) -> Vec<Range<u64>> {
    let held = len.min(limit);
    let mut out = Vec::new();
    let mut at = 0u64;
    for e in extents.iter().filter(|e| e.reads != Reads::Zeros) {
        let start = e.logical.min(held);
        if at < start {
            out.push(at..start);
        }
        at = at.max(e.logical.saturating_add(e.length));
    }
    if at < held {
        out.push(at..held);
    }
    // Past its end a file reads as zeros, whatever its last block holds.
    if len < limit {
        out.push(len..limit);
    }
    coalesce(out)
}

/// The ranges in both sorted, disjoint lists.
fn intersect(a: &[Range<u64>], b: &[Range<u64>]) -> Vec<Range<u64>> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end.min(b[j].end);
        if start < end {
            out.push(start..end);
        }
        if a[i].end <= b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Sorted ranges with overlapping and touching ones merged.
fn coalesce(sorted: Vec<Range<u64>>) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Disk space only `path` holds: the sum of its extents not shared with any other file.
pub fn exclusive_bytes(path: &Path) -> Result<u64, StorageError> {
    Ok(extent_usage(path)?.exclusive)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(logical: u64, physical: u64, length: u64, reads: Reads) -> Mapped {
        Mapped {
            logical,
            physical,
            length,
            reads,
        }
    }

    #[test]
    fn shared_device_bytes_and_common_zeros_are_identical_and_nothing_else() {
        use Reads::*;
        // The template: data 0..100 and 200..300, a hole between, 300 bytes long.
        let base = [ext(0, 1000, 100, Direct), ext(200, 5000, 100, Direct)];
        // The disk, grown to 500: its first 50 bytes shared, 50..100 rewritten elsewhere,
        // a hole where the base has one, 200..300 shared but shifted on the device (not the
        // same bytes), 300..400 a hole past the base's end, 400..500 written.
        let disk = [
            ext(0, 1000, 50, Direct),
            ext(50, 9000, 50, Direct),
            ext(200, 5001, 100, Direct),
            ext(400, 7000, 100, Direct),
        ];
        assert_eq!(
            identical(&base, 300, &disk, 500),
            vec![0..50, 100..200, 300..400]
        );
        // Compressed or pending extents are never taken for the same bytes.
        let opaque = [ext(0, 1000, 100, Opaque), ext(200, 5000, 100, Direct)];
        assert_eq!(identical(&opaque, 300, &base, 300), vec![100..300]);
        // Unwritten extents read as zeros, like holes.
        let unwritten = [ext(0, 1000, 100, Direct), ext(100, 3000, 100, Zeros)];
        assert_eq!(identical(&base, 300, &unwritten, 300), vec![0..200]);
        // A last extent running past a file's end counts only up to it; past the base's end
        // its last block's tail is not taken for zeros unless the disk has a hole there.
        let tail = [ext(0, 1000, 4096, Direct)];
        assert_eq!(identical(&tail, 100, &tail, 200), vec![0..100]);
        // Identical files, and two empty ones.
        assert_eq!(identical(&base, 300, &base, 300), vec![0..300]);
        assert_eq!(identical(&[], 0, &[], 0), Vec::<Range<u64>>::new());
    }
}

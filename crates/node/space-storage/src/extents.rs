//! How much disk space a file holds on its own, from its extent map (the FIEMAP ioctl).
//!
//! We use the `fiemap` crate rather than our own ioctl: it is small, sound (the request
//! struct is `repr(C)` with its extent array inline, `fm_extent_count` matches the array, and
//! the descriptor outlives the iterator), loops with a fixed 8-extent buffer until an extent
//! flagged `LAST` or an empty answer, and retries on EINTR. What it does not do — account
//! shared extents, guard against a filesystem that makes no progress — is done here.

use std::fs::File;
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
    let mut end_of_last = 0u64;
    for extent in Fiemap::with_flags(&file, FiemapFlags::SYNC) {
        let extent = extent.ctx("map the extents (FIEMAP) of", path)?;
        let end = extent.fe_logical.saturating_add(extent.fe_length);
        // Extents come in increasing logical order and the iterator asks for the next batch
        // from the end of the last one: an extent that does not move forward would make it
        // loop forever.
        if extent.fe_length == 0 || end <= end_of_last {
            return Err(StorageError::io(
                "map the extents (FIEMAP) of",
                path,
                std::io::Error::other("the filesystem returned extents out of order"),
            ));
        }
        end_of_last = end;
        if extent.fe_flags.contains(FiemapExtentFlags::SHARED) {
            usage.shared = usage.shared.saturating_add(extent.fe_length);
        } else {
            usage.exclusive = usage.exclusive.saturating_add(extent.fe_length);
        }
    }
    Ok(usage)
}

/// Disk space only `path` holds: the sum of its extents not shared with any other file.
pub fn exclusive_bytes(path: &Path) -> Result<u64, StorageError> {
    Ok(extent_usage(path)?.exclusive)
}

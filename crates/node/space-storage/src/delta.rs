//! A sandbox disk as the blocks it changed from its template: what a suspended sandbox's
//! snapshot stores in object storage instead of the whole disk, and how a node that
//! restores it rebuilds the disk on a reflink of the same template.
//!
//! The format (the caller compresses it as a whole; every integer little-endian):
//!
//! ```text
//! "SPACE-DISK-DELTA-1\n"          magic
//! u64 disk size, u32 block size    the disk's length; DELTA_BLOCK
//! { u64 index, block bytes }*      each changed block, indices strictly increasing; the
//!                                  last block may be short (the disk's end)
//! u64 u64::MAX, u64 count          end, and how many blocks came before it
//! ```
//!
//! A block is changed when it differs from the template's block at the same offset (past
//! the template's end, from zeros: a grown disk's new space is zeros until written). Blocks
//! the two files' extent maps show to be the same (the disk is a reflink of the template:
//! extents it never wrote are the template's own; holes on both sides) are not read at all,
//! so making a delta reads what the sandbox wrote, not its whole disk.
//! Applying trusts nothing it reads: the size is bounded by the caller's maximum, indices
//! must increase and stay inside the disk, the count must match, and nothing may follow.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Size of a compared and stored block.
pub const DELTA_BLOCK: usize = 64 * 1024;
const MAGIC: &[u8] = b"SPACE-DISK-DELTA-1\n";
const END: u64 = u64::MAX;

/// What a delta held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaStats {
    /// The disk's length.
    pub disk_size: u64,
    /// Blocks that differ from the template.
    pub changed_blocks: u64,
}

/// Why a delta could not be made or applied.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The delta is not one this version wrote, or is damaged.
    #[error("disk delta: {0}")]
    Malformed(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DeltaError + '_ {
    move |source| DeltaError::Io {
        path: path.to_owned(),
        source,
    }
}

fn malformed(what: impl Into<String>) -> DeltaError {
    DeltaError::Malformed(what.into())
}

/// Reads as much of `buf` as the file holds at `offset` (the rest stays zero).
fn read_block(file: &File, path: &Path, offset: u64, buf: &mut [u8]) -> Result<(), DeltaError> {
    buf.fill(0);
    let mut done = 0;
    while done < buf.len() {
        let n = file
            .read_at(&mut buf[done..], offset + done as u64)
            .map_err(io(path))?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(())
}

/// Writes the delta of `disk` against `base` (the template image it was reflinked from)
/// to `out`.
pub fn write_delta(
    base: &Path,
    disk: &Path,
    out: &mut impl Write,
) -> Result<DeltaStats, DeltaError> {
    let base_file = File::open(base).map_err(io(base))?;
    let disk_file = File::open(disk).map_err(io(disk))?;
    let disk_size = disk_file.metadata().map_err(io(disk))?.len();
    let out_err = |e: std::io::Error| DeltaError::Io {
        path: PathBuf::from("<delta output>"),
        source: e,
    };
    out.write_all(MAGIC).map_err(out_err)?;
    out.write_all(&disk_size.to_le_bytes()).map_err(out_err)?;
    out.write_all(&(DELTA_BLOCK as u32).to_le_bytes())
        .map_err(out_err)?;
    // Without a map (a filesystem without FIEMAP), every block is read and compared.
    let same = crate::extents::identical_ranges(base, disk).unwrap_or_else(|e| {
        tracing::debug!(error = %e, "no extent maps to compare; reading the whole disk");
        Vec::new()
    });
    let mut known = same.iter().peekable();
    let (mut a, mut b) = (vec![0u8; DELTA_BLOCK], vec![0u8; DELTA_BLOCK]);
    let mut changed = 0u64;
    let blocks = disk_size.div_ceil(DELTA_BLOCK as u64);
    for index in 0..blocks {
        let offset = index * DELTA_BLOCK as u64;
        let len = (disk_size - offset).min(DELTA_BLOCK as u64) as usize;
        while known.next_if(|r| r.end <= offset).is_some() {}
        if known
            .peek()
            .is_some_and(|r| r.start <= offset && offset + len as u64 <= r.end)
        {
            continue;
        }
        read_block(&disk_file, disk, offset, &mut b[..len])?;
        read_block(&base_file, base, offset, &mut a[..len])?;
        if a[..len] != b[..len] {
            out.write_all(&index.to_le_bytes()).map_err(out_err)?;
            out.write_all(&b[..len]).map_err(out_err)?;
            changed += 1;
        }
    }
    out.write_all(&END.to_le_bytes()).map_err(out_err)?;
    out.write_all(&changed.to_le_bytes()).map_err(out_err)?;
    Ok(DeltaStats {
        disk_size,
        changed_blocks: changed,
    })
}

fn read_exact(input: &mut impl Read, buf: &mut [u8], what: &str) -> Result<(), DeltaError> {
    input
        .read_exact(buf)
        .map_err(|e| malformed(format!("{what}: {e}")))
}

fn read_u64(input: &mut impl Read, what: &str) -> Result<u64, DeltaError> {
    let mut b = [0u8; 8];
    read_exact(input, &mut b, what)?;
    Ok(u64::from_le_bytes(b))
}

/// Applies the delta read from `input` to `disk`, which holds the template image already
/// (a reflink of it): the disk takes the delta's length and every changed block. A delta
/// claiming a disk larger than `max_size` is refused before anything is written.
pub fn apply_delta(
    input: &mut impl Read,
    disk: &Path,
    max_size: u64,
) -> Result<DeltaStats, DeltaError> {
    let mut magic = [0u8; MAGIC.len()];
    read_exact(input, &mut magic, "header")?;
    if magic != MAGIC {
        return Err(malformed("not a disk delta of this version"));
    }
    let disk_size = read_u64(input, "disk size")?;
    let mut bs = [0u8; 4];
    read_exact(input, &mut bs, "block size")?;
    if u32::from_le_bytes(bs) as usize != DELTA_BLOCK {
        return Err(malformed("unexpected block size"));
    }
    if disk_size > max_size {
        return Err(malformed(format!(
            "a disk of {disk_size} bytes, more than the {max_size} allowed"
        )));
    }
    let file = OpenOptions::new()
        .write(true)
        .open(disk)
        .map_err(io(disk))?;
    file.set_len(disk_size).map_err(io(disk))?;
    let blocks = disk_size.div_ceil(DELTA_BLOCK as u64);
    let mut buf = vec![0u8; DELTA_BLOCK];
    let mut next_min = 0u64;
    let mut changed = 0u64;
    loop {
        let index = read_u64(input, "block index")?;
        if index == END {
            break;
        }
        if index < next_min || index >= blocks {
            return Err(malformed(format!(
                "block {index} out of order or outside the disk"
            )));
        }
        let offset = index * DELTA_BLOCK as u64;
        let len = (disk_size - offset).min(DELTA_BLOCK as u64) as usize;
        read_exact(input, &mut buf[..len], "block")?;
        file.write_all_at(&buf[..len], offset).map_err(io(disk))?;
        next_min = index + 1;
        changed += 1;
    }
    if read_u64(input, "block count")? != changed {
        return Err(malformed("block count does not match"));
    }
    let mut extra = [0u8; 1];
    match input.read(&mut extra) {
        Ok(0) => {}
        Ok(_) => return Err(malformed("data after the end")),
        Err(e) => return Err(malformed(format!("after the end: {e}"))),
    }
    file.sync_all().map_err(io(disk))?;
    Ok(DeltaStats {
        disk_size,
        changed_blocks: changed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(dir: &Path) -> (PathBuf, PathBuf) {
        let base = dir.join("base");
        let data: Vec<u8> = (0..DELTA_BLOCK * 5 + 100)
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(&base, &data).unwrap();
        let disk = dir.join("disk");
        std::fs::copy(&base, &disk).unwrap();
        (base, disk)
    }

    #[test]
    fn a_delta_rebuilds_the_disk_from_its_base() {
        let dir = tempfile::tempdir().unwrap();
        let (base, disk) = setup(dir.path());
        // Change block 1, zero block 3, grow the disk by two blocks and write the last.
        let f = OpenOptions::new().write(true).open(&disk).unwrap();
        f.write_all_at(b"changed", DELTA_BLOCK as u64 + 10).unwrap();
        f.write_all_at(&vec![0u8; DELTA_BLOCK], 3 * DELTA_BLOCK as u64)
            .unwrap();
        let grown = (DELTA_BLOCK * 7 + 50) as u64;
        f.set_len(grown).unwrap();
        f.write_all_at(b"tail", grown - 4).unwrap();
        let mut delta = Vec::new();
        let stats = write_delta(&base, &disk, &mut delta).unwrap();
        assert_eq!(stats.disk_size, grown);
        // Blocks 1, 3 and the new last; the old short last block reads the same as the
        // template padded with zeros.
        assert_eq!(stats.changed_blocks, 3);
        let restored = dir.path().join("restored");
        std::fs::copy(&base, &restored).unwrap();
        let applied = apply_delta(&mut &delta[..], &restored, 1 << 30).unwrap();
        assert_eq!(applied, stats);
        assert_eq!(
            std::fs::read(&restored).unwrap(),
            std::fs::read(&disk).unwrap()
        );
        // An unchanged disk is a delta of no block.
        let mut empty = Vec::new();
        assert_eq!(
            write_delta(&base, &base, &mut empty)
                .unwrap()
                .changed_blocks,
            0
        );
    }

    #[test]
    fn hostile_deltas_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (base, disk) = setup(dir.path());
        let f = OpenOptions::new().write(true).open(&disk).unwrap();
        f.write_all_at(b"x", 0).unwrap();
        f.write_all_at(b"y", 2 * DELTA_BLOCK as u64).unwrap();
        let mut good = Vec::new();
        write_delta(&base, &disk, &mut good).unwrap();
        let header = MAGIC.len() + 12;
        let target = dir.path().join("t");
        let try_apply = |bytes: &[u8], max: u64| {
            std::fs::copy(&base, &target).unwrap();
            apply_delta(&mut &bytes[..], &target, max)
        };
        assert!(try_apply(&good, 1 << 30).is_ok());
        // Too large a disk for the limit.
        assert!(try_apply(&good, 1000).is_err());
        // Truncated anywhere.
        for cut in [5, header + 3, good.len() - 9, good.len() - 1] {
            assert!(try_apply(&good[..cut], 1 << 30).is_err(), "cut at {cut}");
        }
        // Something after the end.
        let mut longer = good.clone();
        longer.push(0);
        assert!(try_apply(&longer, 1 << 30).is_err());
        // Indices out of order (the second record says block 0 again).
        let mut swapped = good.clone();
        let second = header + 8 + DELTA_BLOCK;
        swapped[second..second + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(try_apply(&swapped, 1 << 30).is_err());
        // An index outside the disk.
        let mut outside = good.clone();
        outside[header..header + 8].copy_from_slice(&1_000_000u64.to_le_bytes());
        assert!(try_apply(&outside, 1 << 30).is_err());
        // A wrong count.
        let mut count = good.clone();
        let n = count.len();
        count[n - 8..].copy_from_slice(&9u64.to_le_bytes());
        assert!(try_apply(&count, 1 << 30).is_err());
        // Not a delta.
        assert!(try_apply(b"GARBAGE", 1 << 30).is_err());
    }
}

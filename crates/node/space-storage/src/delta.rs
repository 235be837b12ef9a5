//! A sandbox disk as the blocks it changed from its template: what a suspended sandbox's
//! snapshot stores in object storage instead of the whole disk, and how a node that
//! restores it rebuilds the disk on a reflink of the same template.
//!
//! The format (the caller compresses it as a whole; every integer little-endian):
//!
//! ```text
//! "SPACE-DISK-DELTA-2\n"          magic
//! u16 length, base id              the base image's identity (the template's digest)
//! u64 base size                    its length
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
//! Applying trusts nothing it reads: the base must be the one the caller applies it onto
//! (its id and length: a delta on another image is a corrupt disk that nothing would
//! notice), the size is bounded by the caller's maximum, indices must increase and stay
//! inside the disk, the count must match, and nothing may follow. Deltas of the first
//! version, which named no base, are still read.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Size of a compared and stored block.
pub const DELTA_BLOCK: usize = 64 * 1024;
const MAGIC: &[u8] = b"SPACE-DISK-DELTA-2\n";
/// The first version: no base identity.
const MAGIC_V1: &[u8] = b"SPACE-DISK-DELTA-1\n";
/// Longest base id.
pub const MAX_BASE_ID: usize = 256;
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
    /// The delta was taken against another base image than the one it is applied onto.
    #[error("disk delta taken against {found}, not {expected}")]
    WrongBase {
        /// The base it is applied onto (id, length).
        expected: String,
        /// The base it names.
        found: String,
    },
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

/// Writes the delta of `disk` against `base` (the template image it was reflinked from,
/// known as `base_id`: at most [`MAX_BASE_ID`] bytes) to `out`.
pub fn write_delta(
    base: &Path,
    base_id: &str,
    disk: &Path,
    out: &mut impl Write,
) -> Result<DeltaStats, DeltaError> {
    let id_len = u16::try_from(base_id.len())
        .ok()
        .filter(|&n| usize::from(n) <= MAX_BASE_ID)
        .ok_or_else(|| malformed(format!("a base id of {} bytes", base_id.len())))?;
    let base_file = File::open(base).map_err(io(base))?;
    let base_size = base_file.metadata().map_err(io(base))?.len();
    let disk_file = File::open(disk).map_err(io(disk))?;
    let disk_size = disk_file.metadata().map_err(io(disk))?.len();
    let out_err = |e: std::io::Error| DeltaError::Io {
        path: PathBuf::from("<delta output>"),
        source: e,
    };
    out.write_all(MAGIC).map_err(out_err)?;
    out.write_all(&id_len.to_le_bytes()).map_err(out_err)?;
    out.write_all(base_id.as_bytes()).map_err(out_err)?;
    out.write_all(&base_size.to_le_bytes()).map_err(out_err)?;
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

/// Applies the delta read from `input` to `disk`, which holds the template image known as
/// `base_id` already (a reflink of it): the disk takes the delta's length and every changed
/// block. A delta taken against another base, or claiming a disk larger than `max_size`,
/// is refused before anything is written.
pub fn apply_delta(
    input: &mut impl Read,
    base_id: &str,
    disk: &Path,
    max_size: u64,
) -> Result<DeltaStats, DeltaError> {
    let mut magic = [0u8; MAGIC.len()];
    read_exact(input, &mut magic, "header")?;
    let file = OpenOptions::new()
        .write(true)
        .open(disk)
        .map_err(io(disk))?;
    if magic == MAGIC {
        let mut len = [0u8; 2];
        read_exact(input, &mut len, "base id")?;
        let len = usize::from(u16::from_le_bytes(len));
        if len > MAX_BASE_ID {
            return Err(malformed("base id too long"));
        }
        let mut id = vec![0u8; len];
        read_exact(input, &mut id, "base id")?;
        let found_size = read_u64(input, "base size")?;
        let base_size = file.metadata().map_err(io(disk))?.len();
        if id != base_id.as_bytes() || found_size != base_size {
            return Err(DeltaError::WrongBase {
                expected: format!("{base_id} ({base_size} bytes)"),
                found: format!("{} ({found_size} bytes)", String::from_utf8_lossy(&id)),
            });
        }
    } else if magic != MAGIC_V1 {
        return Err(malformed("not a disk delta of a known version"));
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

    const BASE: &str = "sha256:base-template";

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
        let stats = write_delta(&base, BASE, &disk, &mut delta).unwrap();
        assert_eq!(stats.disk_size, grown);
        // Blocks 1, 3 and the new last; the old short last block reads the same as the
        // template padded with zeros.
        assert_eq!(stats.changed_blocks, 3);
        let restored = dir.path().join("restored");
        std::fs::copy(&base, &restored).unwrap();
        let applied = apply_delta(&mut &delta[..], BASE, &restored, 1 << 30).unwrap();
        assert_eq!(applied, stats);
        assert_eq!(
            std::fs::read(&restored).unwrap(),
            std::fs::read(&disk).unwrap()
        );
        // An unchanged disk is a delta of no block.
        let mut empty = Vec::new();
        assert_eq!(
            write_delta(&base, BASE, &base, &mut empty)
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
        write_delta(&base, BASE, &disk, &mut good).unwrap();
        let header = MAGIC.len() + 2 + BASE.len() + 8 + 12;
        let target = dir.path().join("t");
        let try_apply = |bytes: &[u8], max: u64| {
            std::fs::copy(&base, &target).unwrap();
            apply_delta(&mut &bytes[..], BASE, &target, max)
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
        // Onto another base: another id, or the same id at another length.
        std::fs::copy(&base, &target).unwrap();
        assert!(matches!(
            apply_delta(&mut &good[..], "sha256:another", &target, 1 << 30),
            Err(DeltaError::WrongBase { .. })
        ));
        std::fs::copy(&base, &target).unwrap();
        OpenOptions::new()
            .write(true)
            .open(&target)
            .unwrap()
            .set_len(DELTA_BLOCK as u64)
            .unwrap();
        assert!(matches!(
            apply_delta(&mut &good[..], BASE, &target, 1 << 30),
            Err(DeltaError::WrongBase { .. })
        ));
    }

    #[test]
    fn a_first_version_delta_still_applies() {
        let dir = tempfile::tempdir().unwrap();
        let (base, disk) = setup(dir.path());
        let f = OpenOptions::new().write(true).open(&disk).unwrap();
        f.write_all_at(b"changed", 10).unwrap();
        let mut v2 = Vec::new();
        write_delta(&base, BASE, &disk, &mut v2).unwrap();
        // The same delta as version 1 wrote it: no base id, no base size.
        let mut v1 = MAGIC_V1.to_vec();
        v1.extend_from_slice(&v2[MAGIC.len() + 2 + BASE.len() + 8..]);
        let target = dir.path().join("t");
        std::fs::copy(&base, &target).unwrap();
        apply_delta(&mut &v1[..], "any base", &target, 1 << 30).unwrap();
        assert_eq!(
            std::fs::read(&target).unwrap(),
            std::fs::read(&disk).unwrap()
        );
    }
}

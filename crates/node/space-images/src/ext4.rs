//! Turning a root filesystem tree into an ext4 image (`mkfs.ext4 -d`), and sizing it.

use std::path::Path;
use std::process::Command;

use crate::error::{ImageError, IoContext};
use crate::run;

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;

/// What a tree needs in an ext4 filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeUsage {
    /// Bytes of data blocks (files rounded up to 4 KiB, directories, long symlinks).
    pub bytes: u64,
    /// Number of inodes (files, directories, links, device nodes).
    pub inodes: u64,
}

/// Image size for a tree: used bytes + 30% + 64 MiB, rounded up to whole MiB. The sandbox
/// disk is grown at boot, so this only has to fit the files plus ext4's own overhead.
pub fn image_size_mib(used_bytes: u64) -> u64 {
    (used_bytes + used_bytes * 3 / 10 + 64 * MIB).div_ceil(MIB)
}

/// The least a fixed-size image may have for a tree: used bytes + 30% + 16 MiB (journal
/// and metadata of a small ext4).
pub fn min_size_mib(used_bytes: u64) -> u64 {
    (used_bytes + used_bytes * 3 / 10).div_ceil(MIB) + 16
}

/// Inodes to create: what the tree needs plus 30% and 1024 spare, and at least ext4's usual
/// one per 16 KiB (the density stays when the disk is grown).
pub fn inode_count(inodes_used: u64, size_mib: u64) -> u64 {
    (inodes_used + inodes_used * 3 / 10 + 1024).max(size_mib * MIB / 16384)
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// Measures a tree (without following symlinks).
pub fn tree_usage(root: &Path) -> Result<TreeUsage, ImageError> {
    let mut usage = TreeUsage::default();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        usage.inodes += 1;
        usage.bytes += BLOCK;
        for e in std::fs::read_dir(&dir).ctx("list", &dir)? {
            let e = e.ctx("list", &dir)?;
            let meta = e.path().symlink_metadata().ctx("stat", &e.path())?;
            let ft = meta.file_type();
            if ft.is_dir() {
                stack.push(e.path());
                continue;
            }
            usage.inodes += 1;
            if ft.is_file() {
                usage.bytes += round_up(meta.len());
            } else if ft.is_symlink() && meta.len() >= 60 {
                // Shorter targets are stored in the inode itself.
                usage.bytes += BLOCK;
            }
        }
    }
    Ok(usage)
}

/// Creates `image` (`size_mib` MiB) holding the tree at `root`, with ownership and modes as
/// in the tree, root directory owned by root, label `space-root`.
pub fn make_image(
    root: &Path,
    image: &Path,
    size_mib: u64,
    inodes: u64,
    progress: &dyn Fn(&str),
) -> Result<(), ImageError> {
    progress(&format!("mkfs.ext4: {size_mib} MiB image, {inodes} inodes"));
    run::run(
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-L",
                "space-root",
                "-b",
                "4096",
                "-I",
                "256",
                "-m",
                "0",
            ])
            .arg("-N")
            .arg(inodes.to_string())
            .arg("-d")
            .arg(root)
            .args(["-E", "root_owner=0:0"])
            .arg(image)
            .arg(format!("{size_mib}M")),
        progress,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_formula() {
        assert_eq!(image_size_mib(0), 64);
        assert_eq!(image_size_mib(100 * MIB), 130 + 64);
        assert_eq!(image_size_mib(1), 65);
        assert_eq!(inode_count(10_000, 100), 14_024);
        assert_eq!(inode_count(10, 1024), 65_536);
    }

    #[test]
    fn measures_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f"), vec![0u8; 5000]).unwrap();
        std::os::unix::fs::symlink("f", dir.path().join("d/l")).unwrap();
        let u = tree_usage(dir.path()).unwrap();
        assert_eq!(
            u,
            TreeUsage {
                bytes: 2 * 4096 + 8192,
                inodes: 4
            }
        );
    }
}

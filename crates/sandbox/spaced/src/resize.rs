//! Growing the root file system to fill its block device, online, without `resize2fs`.
//!
//! The node hands the guest a disk larger than the template's file system. We find the
//! device under the mount point in `/proc/self/mountinfo`, take its size (`BLKGETSIZE64`,
//! or sysfs when the node is absent), and ask ext4 to grow with `EXT4_IOC_RESIZE_FS`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

nix::ioctl_read!(blk_get_size64, 0x12, 114, u64);
nix::ioctl_write_ptr!(ext4_resize_fs, b'f', 16, u64);

use crate::mountinfo::{find_mount, MountEntry, MOUNTINFO};

/// What a resize did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resized {
    /// The block device.
    pub device: String,
    /// Device size in bytes.
    pub device_bytes: u64,
    /// File system block size.
    pub block_size: u64,
    /// Block count requested (the file system's new size).
    pub blocks: u64,
}

/// Why the file system was not grown.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// Nothing is mounted there.
    #[error("{0} is not a mount point")]
    NotMounted(String),
    /// Only ext4 can be grown.
    #[error("{mount_point} is {fstype}, not ext4; not resized")]
    NotExt4 {
        /// Mount point.
        mount_point: String,
        /// Its type.
        fstype: String,
    },
    /// An I/O step failed.
    #[error("{step}: {source}")]
    Io {
        /// What we were doing.
        step: String,
        /// The error.
        source: io::Error,
    },
}

fn io_step(step: impl Into<String>) -> impl FnOnce(io::Error) -> ResizeError {
    let step = step.into();
    move |source| ResizeError::Io { step, source }
}

fn device_bytes(m: &MountEntry) -> Result<u64, ResizeError> {
    if m.source.starts_with("/dev/") {
        if let Ok(dev) = File::open(&m.source) {
            let mut size = 0u64;
            // SAFETY: BLKGETSIZE64 writes one u64.
            if unsafe { blk_get_size64(dev.as_raw_fd(), &mut size) }.is_ok() {
                return Ok(size);
            }
        }
    }
    // `/dev/root` and friends may have no node: sysfs knows the size in 512-byte sectors.
    let p = PathBuf::from(format!("/sys/dev/block/{}:{}/size", m.dev.0, m.dev.1));
    let text = std::fs::read_to_string(&p).map_err(io_step(format!("read {}", p.display())))?;
    let sectors: u64 = text.trim().parse().map_err(|_| ResizeError::Io {
        step: format!("parse {}", p.display()),
        source: io::ErrorKind::InvalidData.into(),
    })?;
    Ok(sectors.saturating_mul(512))
}

/// Grows the ext4 file system mounted at `mount_point` to fill its device.
pub fn grow(mount_point: &Path) -> Result<Resized, ResizeError> {
    let mp = mount_point.to_string_lossy().into_owned();
    let info = std::fs::read_to_string(MOUNTINFO).map_err(io_step(format!("read {MOUNTINFO}")))?;
    let m = find_mount(&info, &mp).ok_or_else(|| ResizeError::NotMounted(mp.clone()))?;
    if m.fstype != "ext4" {
        return Err(ResizeError::NotExt4 {
            mount_point: mp,
            fstype: m.fstype,
        });
    }
    let bytes = device_bytes(&m)?;
    let st = nix::sys::statvfs::statvfs(mount_point).map_err(|e| ResizeError::Io {
        step: "statvfs".into(),
        source: e.into(),
    })?;
    let block_size = st.block_size().max(1024);
    let blocks = bytes / block_size;
    let dir = File::open(mount_point).map_err(io_step(format!("open {mp}")))?;
    // SAFETY: EXT4_IOC_RESIZE_FS reads one u64 (the new block count).
    unsafe { ext4_resize_fs(dir.as_raw_fd(), &blocks) }.map_err(|e| ResizeError::Io {
        step: format!("EXT4_IOC_RESIZE_FS to {blocks} blocks"),
        source: e.into(),
    })?;
    Ok(Resized {
        device: m.source,
        device_bytes: bytes,
        block_size,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grows a real ext4 on a loop device. Needs root, loop devices and mkfs.ext4; skipped
    /// (with a message) where they are missing.
    #[test]
    fn grows_ext4_on_loop_device() {
        use std::process::Command;
        let ok = |c: &mut Command| c.status().map(|s| s.success()).unwrap_or(false);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/loop-control").exists() {
            eprintln!("skipping: needs root and loop devices");
            return;
        }
        // Online resize needs CAP_SYS_RESOURCE (bit 24), which some sandboxed hosts drop.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let cap_eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap();
        if cap_eff & (1 << 24) == 0 {
            eprintln!(
                "skipping: no CAP_SYS_RESOURCE here (EXT4_IOC_RESIZE_FS would fail with EPERM)"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        assert!(ok(Command::new("truncate").arg("-s").arg("64M").arg(&img)));
        assert!(ok(Command::new("mkfs.ext4").arg("-q").arg("-F").arg(&img)));
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&img)
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!(
                "skipping: losetup failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        struct Cleanup(String, PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.1).status();
                let _ = std::process::Command::new("losetup")
                    .arg("-d")
                    .arg(&self.0)
                    .status();
            }
        }
        let _cleanup = Cleanup(loopdev.clone(), mnt.clone());
        assert!(ok(Command::new("mount").arg(&loopdev).arg(&mnt)));
        let before = nix::sys::statvfs::statvfs(&mnt).unwrap().blocks();
        assert!(ok(Command::new("truncate").arg("-s").arg("256M").arg(&img)));
        assert!(ok(Command::new("losetup").arg("-c").arg(&loopdev)));
        let r = grow(&mnt).unwrap();
        assert_eq!(r.device_bytes, 256 << 20);
        let after = nix::sys::statvfs::statvfs(&mnt).unwrap().blocks();
        assert!(after > before * 3, "grew from {before} to {after} blocks");
        // Growing again to the same size is a no-op.
        grow(&mnt).unwrap();
    }
}

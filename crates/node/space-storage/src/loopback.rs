//! The loop-mounted btrfs image used when the data directory is not on btrfs: creating the
//! sparse image, formatting it, attaching and mounting it, and taking it down again.
//!
//! Mounting uses util-linux `mount -o loop`, which finds a free loop device race-free and sets
//! the loop device's autoclear flag, so unmounting also detaches it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cmd;
use crate::error::{IoContext, StorageError};
use crate::mountinfo;

/// Offset of the primary btrfs superblock's magic (superblock at 64 KiB, magic at +0x40).
const BTRFS_MAGIC_OFFSET: u64 = 0x10040;
const BTRFS_MAGIC: &[u8; 8] = b"_BHRfS_M";
/// Smallest image mkfs.btrfs accepts with default profiles (it refuses below ~114 MiB).
pub const MIN_IMAGE_SIZE: u64 = 128 << 20;

/// Creates `image` as a sparse file of `size` bytes if it does not exist. Returns whether it did.
pub(crate) fn ensure_image(image: &Path, size: u64) -> Result<bool, StorageError> {
    match OpenOptions::new().write(true).create_new(true).open(image) {
        Ok(f) => {
            // set_len on a new file only records the size: the image takes no space until written.
            f.set_len(size.max(MIN_IMAGE_SIZE))
                .ctx("set the size of", image)?;
            f.sync_all().ctx("sync", image)?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let len = std::fs::metadata(image).ctx("stat", image)?.len();
            if len < size {
                tracing::info!(image = %image.display(), size = len, requested = size, "existing store image is smaller than requested; keeping it (grow it by hand with truncate + btrfs filesystem resize)");
            }
            Ok(false)
        }
        Err(e) => Err(StorageError::io("create", image, e)),
    }
}

/// Whether `image` already holds a btrfs filesystem (its primary superblock magic is present).
pub(crate) fn has_btrfs(image: &Path) -> Result<bool, StorageError> {
    let mut f = File::open(image).ctx("open", image)?;
    let mut magic = [0u8; 8];
    f.seek(SeekFrom::Start(BTRFS_MAGIC_OFFSET))
        .ctx("seek in", image)?;
    match f.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == BTRFS_MAGIC),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(StorageError::io("read", image, e)),
    }
}

/// Formats `image` as btrfs. Without `-f`, mkfs.btrfs refuses to overwrite any filesystem it
/// recognises, so an image that holds something else is never destroyed.
pub(crate) fn format(image: &Path) -> Result<(), StorageError> {
    cmd::run(
        Command::new("mkfs.btrfs")
            .arg("-q")
            .arg("-L")
            .arg("space-store")
            .arg(image),
    )?;
    Ok(())
}

/// Loop devices (e.g. `/dev/loop3`) whose backing file is `image` (a canonical path).
pub(crate) fn loop_devices_for(image: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut devs: Vec<String> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                return None;
            }
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            (Path::new(backing.trim_end_matches('\n')) == image).then(|| format!("/dev/{name}"))
        })
        .collect();
    devs.sort();
    devs
}

/// Detaches a loop device.
pub(crate) fn detach(loop_device: &str) -> Result<(), StorageError> {
    cmd::run(Command::new("losetup").arg("-d").arg(loop_device))?;
    Ok(())
}

/// Loop-mounts `image` (btrfs) at `mount_point`. Returns the loop device.
pub(crate) fn mount(image: &Path, mount_point: &Path) -> Result<String, StorageError> {
    cmd::run(
        Command::new("mount")
            .args(["-t", "btrfs", "-o", "loop,noatime"])
            .arg(image)
            .arg(mount_point),
    )?;
    let mounts = mountinfo::read()?;
    match mountinfo::mount_at(&mounts, mount_point) {
        Some(m) if m.fstype == "btrfs" => Ok(m.source.clone()),
        _ => Err(StorageError::io(
            "find the new mount at",
            mount_point,
            std::io::Error::other(
                "mount succeeded but the mount does not appear in /proc/self/mountinfo",
            ),
        )),
    }
}

/// Unmounts the store at `mount_point` and makes sure no loop device is left on `image`.
pub(crate) fn unmount(image: &Path, mount_point: &Path) -> Result<(), StorageError> {
    let mounts = mountinfo::read()?;
    if let Some(m) = mountinfo::mount_at(&mounts, mount_point) {
        if !loop_devices_for(image).contains(&m.source) {
            return Err(StorageError::ForeignMount {
                mount_point: mount_point.to_owned(),
                fstype: m.fstype.clone(),
                source_dev: m.source.clone(),
                image: image.to_owned(),
            });
        }
        match nix::mount::umount2(mount_point, nix::mount::MntFlags::empty()) {
            Ok(()) => {}
            Err(nix::errno::Errno::EBUSY) => {
                return Err(StorageError::Busy {
                    mount_point: mount_point.to_owned(),
                })
            }
            Err(e) => return Err(StorageError::io("unmount", mount_point, e.into())),
        }
        tracing::info!(mount_point = %mount_point.display(), loop_device = %m.source, "unmounted store");
    }
    // Autoclear detaches the loop device when its last user goes, which can lag the unmount a little.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let devs = loop_devices_for(image);
        if devs.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            for dev in devs {
                // Still mounted elsewhere? Then it is not ours to detach.
                if let Some(m) = mountinfo::read()?.into_iter().find(|m| m.source == dev) {
                    return Err(StorageError::ImageInUse {
                        image: image.to_owned(),
                        loop_device: dev,
                        mounted_at: m.mount_point,
                    });
                }
                detach(&dev)?;
                tracing::info!(loop_device = %dev, "detached loop device");
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Detaches loop devices on `image` that are not mounted anywhere (left by a crash between
/// attach and mount). Two loop devices on one btrfs image would show btrfs the same
/// filesystem twice, so the mount must not create a second one. Fails if one is mounted.
pub(crate) fn detach_stale(image: &Path) -> Result<(), StorageError> {
    let devs = loop_devices_for(image);
    if devs.is_empty() {
        return Ok(());
    }
    let mounts = mountinfo::read()?;
    for dev in devs {
        if let Some(m) = mounts.iter().find(|m| m.source == dev) {
            return Err(StorageError::ImageInUse {
                image: image.to_owned(),
                loop_device: dev,
                mounted_at: m.mount_point.clone(),
            });
        }
        tracing::warn!(loop_device = %dev, image = %image.display(), "detaching stale loop device");
        detach(&dev)?;
    }
    Ok(())
}

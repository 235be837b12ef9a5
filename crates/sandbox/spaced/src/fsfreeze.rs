//! Freezing the guest's disk file systems so the host can copy the disks consistently
//! (`POST /v1/fs/freeze` / `POST /v1/fs/thaw`).
//!
//! FIFREEZE flushes a file system and blocks every writer until FITHAW; we freeze every
//! writable file system on a virtio disk, in mount order, and thaw in reverse order. A
//! freeze arms a timer that thaws by itself, so a host that dies mid-snapshot never leaves
//! the guest frozen. While frozen the daemon itself must not write to those file systems:
//! its log goes to the console, and the ioctls run on blocking threads.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::mountinfo::{self, MountEntry};

nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);

/// Why a freeze or thaw failed.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    /// FIFREEZE said EBUSY: someone else (e.g. `fsfreeze -f` in the guest) froze it.
    #[error(
        "the file system at {mount_point} is already frozen by someone else in the guest \
         (e.g. fsfreeze); this call froze nothing and left nothing frozen"
    )]
    AlreadyFrozen {
        /// Its mount point.
        mount_point: String,
    },
    /// Any other failure.
    #[error("{step}: {source}")]
    Io {
        /// What we were doing.
        step: String,
        /// The error.
        source: io::Error,
    },
    /// The blocking worker died.
    #[error("freeze worker failed: {0}")]
    Worker(#[from] tokio::task::JoinError),
}

/// One file system this daemon froze.
#[derive(Debug)]
struct Frozen {
    mount_point: String,
    dir: File,
}

#[derive(Debug, Default)]
struct Held {
    /// What is frozen, in freeze order.
    frozen: Vec<Frozen>,
    /// The auto-thaw.
    timer: Option<JoinHandle<()>>,
}

/// The freeze this daemon holds, if any.
#[derive(Debug, Default)]
pub struct FsFreezer {
    held: Mutex<Held>,
}

/// Whether `m` lives on a virtio block device: `/dev/vd*`, or a device whose sysfs path
/// goes through a virtio bus (the root may show as `/dev/root`).
fn is_virtio_disk(m: &MountEntry) -> bool {
    if m.source.starts_with("/dev/vd") {
        return true;
    }
    let link = format!("/sys/dev/block/{}:{}", m.dev.0, m.dev.1);
    std::fs::canonicalize(link)
        .map(|p| p.to_string_lossy().contains("/virtio"))
        .unwrap_or(false)
}

/// The mounts to freeze, in mount order: writable, on a virtio disk, and one per device
/// (a second FIFREEZE of the same super block through a bind mount would say EBUSY).
pub fn freeze_targets(
    mounts: Vec<MountEntry>,
    is_virtio: impl Fn(&MountEntry) -> bool,
) -> Vec<MountEntry> {
    let mut out: Vec<MountEntry> = Vec::new();
    for m in mounts {
        if m.writable && is_virtio(&m) && !out.iter().any(|o| o.dev == m.dev) {
            out.push(m);
        }
    }
    out
}

/// Thaws `frozen` in reverse order. EINVAL (not frozen: someone thawed it already) is
/// fine; other errors are collected.
fn thaw_all(frozen: Vec<Frozen>) -> Result<usize, FreezeError> {
    let mut first_error = None;
    let count = frozen.len();
    for f in frozen.into_iter().rev() {
        let mut arg: libc::c_int = 0;
        // SAFETY: FITHAW on an open directory; the argument is ignored.
        match unsafe { fithaw(f.dir.as_raw_fd(), &mut arg) } {
            Ok(_) | Err(nix::errno::Errno::EINVAL) => {}
            Err(e) => {
                tracing::warn!(mount_point = %f.mount_point, error = %e, "FITHAW failed");
                first_error.get_or_insert(FreezeError::Io {
                    step: format!("FITHAW {}", f.mount_point),
                    source: e.into(),
                });
            }
        }
    }
    first_error.map_or(Ok(count), Err)
}

/// Freezes every target; on failure thaws what it froze. Blocking.
fn freeze_all() -> Result<Vec<Frozen>, FreezeError> {
    let info = std::fs::read_to_string(mountinfo::MOUNTINFO).map_err(|source| FreezeError::Io {
        step: format!("read {}", mountinfo::MOUNTINFO),
        source,
    })?;
    // Open everything first: nothing may touch a file system once one is frozen.
    let mut dirs = Vec::new();
    for m in freeze_targets(mountinfo::parse(&info), is_virtio_disk) {
        let dir = File::open(&m.mount_point).map_err(|source| FreezeError::Io {
            step: format!("open {}", m.mount_point),
            source,
        })?;
        dirs.push(Frozen {
            mount_point: m.mount_point,
            dir,
        });
    }
    let mut frozen = Vec::with_capacity(dirs.len());
    for f in dirs {
        let mut arg: libc::c_int = 0;
        // SAFETY: FIFREEZE on an open directory; the argument is ignored.
        let res = unsafe { fifreeze(f.dir.as_raw_fd(), &mut arg) };
        let err = match res {
            Ok(_) => {
                frozen.push(f);
                continue;
            }
            Err(nix::errno::Errno::EBUSY) => FreezeError::AlreadyFrozen {
                mount_point: f.mount_point,
            },
            Err(e) => FreezeError::Io {
                step: format!("FIFREEZE {}", f.mount_point),
                source: e.into(),
            },
        };
        if let Err(e) = thaw_all(frozen) {
            tracing::warn!(error = %e, "cannot thaw after a failed freeze");
        }
        return Err(err);
    }
    Ok(frozen)
}

impl FsFreezer {
    /// Freezes the disk file systems (or, when this daemon already holds a freeze, keeps
    /// it) and arms the auto-thaw `timeout` from now. Returns the mount points frozen.
    pub async fn freeze(self: &Arc<Self>, timeout: Duration) -> Result<Vec<String>, FreezeError> {
        let mut held = self.held.lock().await;
        if held.frozen.is_empty() {
            held.frozen = tokio::task::spawn_blocking(freeze_all).await??;
        }
        if let Some(t) = held.timer.take() {
            t.abort();
        }
        let me = self.clone();
        held.timer = Some(tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            me.auto_thaw(timeout).await;
        }));
        Ok(held.frozen.iter().map(|f| f.mount_point.clone()).collect())
    }

    /// Thaws what [`FsFreezer::freeze`] froze; nothing frozen is fine. Returns how many
    /// file systems were thawed.
    pub async fn thaw(&self) -> Result<usize, FreezeError> {
        let mut held = self.held.lock().await;
        if let Some(t) = held.timer.take() {
            t.abort();
        }
        let frozen = std::mem::take(&mut held.frozen);
        if frozen.is_empty() {
            return Ok(0);
        }
        tokio::task::spawn_blocking(move || thaw_all(frozen)).await?
    }

    async fn auto_thaw(&self, after: Duration) {
        let mut held = self.held.lock().await;
        // Only this task's own handle can be here: freeze and thaw abort the timer under
        // the lock before replacing it, and this task is not aborted once it holds it.
        held.timer = None;
        let frozen = std::mem::take(&mut held.frozen);
        if frozen.is_empty() {
            return;
        }
        tracing::warn!(
            ?after,
            "no thaw from the host: thawing the file systems by ourselves"
        );
        match tokio::task::spawn_blocking(move || thaw_all(frozen)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "auto-thaw failed"),
            Err(e) => tracing::warn!(error = %e, "auto-thaw worker failed"),
        }
    }
}

/// Thaws every writable virtio-disk file system, whoever froze it, ignoring errors: for
/// power-off, where a frozen root would hang the final sync. Blocking.
pub fn thaw_everything() {
    let Ok(info) = std::fs::read_to_string(mountinfo::MOUNTINFO) else {
        return;
    };
    for m in freeze_targets(mountinfo::parse(&info), is_virtio_disk) {
        if let Ok(dir) = File::open(&m.mount_point) {
            let mut arg: libc::c_int = 0;
            // SAFETY: FITHAW on an open directory; the argument is ignored.
            let _ = unsafe { fithaw(dir.as_raw_fd(), &mut arg) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
20 1 254:0 / / rw,noatime - ext4 /dev/vda rw\n\
21 20 0:5 / /dev rw,nosuid - devtmpfs devtmpfs rw,mode=755\n\
22 20 0:20 / /run rw - tmpfs tmpfs rw\n\
23 20 254:16 / /data rw,relatime - ext4 /dev/vdb rw\n\
24 20 254:0 /home /srv rw - ext4 /dev/vda rw\n\
25 20 254:32 / /ro ro - ext4 /dev/vdc ro\n\
26 20 8:0 / /usb rw - vfat /dev/sda rw\n\
27 20 254:48 / /root2 rw - ext4 /dev/root rw\n";

    #[test]
    fn picks_writable_virtio_disks_once_each_in_mount_order() {
        let virtio = |m: &MountEntry| m.source.starts_with("/dev/vd") || m.dev == (254, 48);
        let t = freeze_targets(mountinfo::parse(INFO), virtio);
        let points: Vec<&str> = t.iter().map(|m| m.mount_point.as_str()).collect();
        assert_eq!(points, ["/", "/data", "/root2"]);
    }

    #[test]
    fn nothing_to_thaw_is_fine() {
        assert_eq!(thaw_all(Vec::new()).unwrap(), 0);
    }

    #[tokio::test]
    async fn thaw_without_freeze_is_idempotent() {
        let f = Arc::new(FsFreezer::default());
        assert_eq!(f.thaw().await.unwrap(), 0);
        assert_eq!(f.thaw().await.unwrap(), 0);
    }
}

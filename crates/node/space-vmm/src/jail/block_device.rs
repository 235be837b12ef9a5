//! The block device under a VM's disk file, for the cgroup's disk I/O limit: the source of
//! the mount whose device number the file reports (a loop device for a loop-mounted store).

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::Mutex;

/// Block devices by file-system device number, looked up once per file system.
#[derive(Debug, Default)]
pub(crate) struct BlockDevices {
    known: Mutex<HashMap<u64, Option<(u32, u32)>>>,
}

impl BlockDevices {
    /// The whole-disk block device (`major`, `minor`) holding `file`, if one can be named
    /// (none for tmpfs, overlay or a partition, which blk-throttle does not take).
    pub(crate) fn of(&self, file: &Path) -> Option<(u32, u32)> {
        let dev = std::fs::metadata(file).ok()?.dev();
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        *known.entry(dev).or_insert_with(|| lookup(dev))
    }
}

fn lookup(dev: u64) -> Option<(u32, u32)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let source = mount_source(&info, libc::major(dev), libc::minor(dev))?;
    let meta = std::fs::metadata(source).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
    let partition = Path::new(&format!("/sys/dev/block/{major}:{minor}/partition")).exists();
    (!partition).then_some((major, minor))
}

/// The mount source of the file system numbered `major:minor` in a mountinfo text.
fn mount_source(mountinfo: &str, major: u32, minor: u32) -> Option<&str> {
    let want = format!("{major}:{minor}");
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.nth(2)? != want {
            return None;
        }
        let (_, after) = line.split_once(" - ")?;
        let mut rest = after.split(' ');
        let _fstype = rest.next()?;
        rest.next().filter(|s| s.starts_with("/dev/"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_source_of_a_mount() {
        let info = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
                    36 22 0:52 / /data/store rw,relatime shared:9 - btrfs /dev/loop3 rw,space_cache=v2\n\
                    40 22 0:60 / /tmp rw - tmpfs tmpfs rw\n";
        assert_eq!(mount_source(info, 0, 52), Some("/dev/loop3"));
        assert_eq!(mount_source(info, 8, 1), Some("/dev/vda1"));
        assert_eq!(mount_source(info, 0, 60), None, "tmpfs has no device");
        assert_eq!(mount_source(info, 9, 9), None);
    }
}

//! Parsing `/proc/self/mountinfo` (pure) and the few questions the store asks of it.

use std::path::{Path, PathBuf};

use crate::error::{IoContext, StorageError};

/// One line of mountinfo: the parts the store needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Filesystem type, e.g. `btrfs`.
    pub fstype: String,
    /// Mount source, e.g. `/dev/loop3`.
    pub source: String,
}

/// Parses the text of a mountinfo file. Malformed lines are skipped (the kernel writes it, but
/// skipping is safer than failing the store over a line we do not understand).
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let mut fields = line.split(' ');
    // id, parent id, major:minor, root, mount point.
    let mount_point = fields.nth(4)?;
    // Mount options, then optional fields up to the "-" separator.
    let mut rest = fields.skip(1).skip_while(|f| *f != "-");
    rest.next()?;
    let fstype = rest.next()?;
    let source = rest.next()?;
    Some(MountEntry {
        mount_point: PathBuf::from(unescape(mount_point)),
        fstype: unescape(fstype),
        source: unescape(source),
    })
}

/// Undoes the kernel's octal escaping (`\040` for space, `\134` for backslash, ...).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') as u32 * 64
                + (bytes[i + 2] - b'0') as u32 * 8
                + (bytes[i + 3] - b'0') as u32;
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount visible at `path`: the last (topmost) entry for it.
pub fn mount_at<'a>(mounts: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    mounts.iter().rev().find(|m| m.mount_point == path)
}

/// Mounts strictly below `path`, deepest first (the order to unmount them in).
pub fn mounts_below(mounts: &[MountEntry], path: &Path) -> Vec<PathBuf> {
    let mut below: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| m.mount_point != path && m.mount_point.starts_with(path))
        .map(|m| m.mount_point.clone())
        .collect();
    below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    below.dedup();
    below
}

/// Reads and parses this process's mount table.
pub fn read() -> Result<Vec<MountEntry>, StorageError> {
    let path = Path::new("/proc/self/mountinfo");
    Ok(parse(&std::fs::read_to_string(path).ctx("read", path)?))
}

/// Unmounts everything mounted below `path` (deepest first, lazily if busy), so the directory
/// can be deleted without reaching into another filesystem. Fails if a mount remains.
pub fn unmount_all_below(path: &Path) -> Result<(), StorageError> {
    for mount in mounts_below(&read()?, path) {
        tracing::warn!(mount = %mount.display(), "unmounting leftover mount below {}", path.display());
        if nix::mount::umount2(&mount, nix::mount::MntFlags::empty()).is_err() {
            // Busy: detach it from the tree; it goes away when its last user does.
            if let Err(e) = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH) {
                tracing::warn!(mount = %mount.display(), error = %e, "cannot unmount");
            }
        }
    }
    if let Some(left) = mounts_below(&read()?, path).into_iter().next() {
        return Err(StorageError::MountedBelow {
            path: path.to_owned(),
            mount: left,
        });
    }
    Ok(())
}

/// Deletes a directory tree, first making sure nothing is mounted inside it. Missing is fine.
pub fn remove_tree(path: &Path) -> Result<(), StorageError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    unmount_all_below(path)?;
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io("remove directory", path, e)),
    }
}

/// Last-resort cleanup of everything under `dir`: lazy-unmounts its mounts and detaches loop
/// devices backed by files in it Tests and leak checks use it when a test failed before its stores were
/// recorded; errors are reported on stderr, never fatal.
pub fn release_all_under(dir: &Path) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    if let Ok(mounts) = read() {
        for m in mounts_below(&mounts, &dir) {
            eprintln!("guard: lazily unmounting leftover {}", m.display());
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&m)
                .status();
        }
    }
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let backing =
            std::fs::read_to_string(e.path().join("loop/backing_file")).unwrap_or_default();
        if Path::new(backing.trim_end()).starts_with(&dir) {
            let dev = format!("/dev/{}", e.file_name().to_string_lossy());
            eprintln!("guard: detaching leftover {dev}");
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(&dev)
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
36 22 0:39 / /tmp/a\\040b/store rw,noatime shared:5 master:1 - btrfs /dev/loop3 rw,discard=async,space_cache=v2,subvolid=5,subvol=/
37 36 0:40 / /tmp/a\\040b/store/x rw - tmpfs tmpfs rw
38 36 0:41 / /tmp/a\\040b/store/x/y rw - proc proc rw
39 22 0:42 / /tmp/a\\040b/storex rw - tmpfs tmpfs rw
garbage line
";

    #[test]
    fn parses_fields_and_escapes() {
        let m = parse(SAMPLE);
        assert_eq!(m.len(), 5);
        assert_eq!(m[1].mount_point, Path::new("/tmp/a b/store"));
        assert_eq!(m[1].fstype, "btrfs");
        assert_eq!(m[1].source, "/dev/loop3");
        assert_eq!(
            mount_at(&m, Path::new("/tmp/a b/store")).map(|e| e.source.as_str()),
            Some("/dev/loop3")
        );
        assert!(mount_at(&m, Path::new("/tmp/a b")).is_none());
    }

    #[test]
    fn below_is_deepest_first_and_not_prefix_siblings() {
        let m = parse(SAMPLE);
        let below = mounts_below(&m, Path::new("/tmp/a b/store"));
        assert_eq!(
            below,
            vec![
                PathBuf::from("/tmp/a b/store/x/y"),
                PathBuf::from("/tmp/a b/store/x")
            ]
        );
    }

    #[test]
    fn unescape_backslash() {
        assert_eq!(unescape("a\\134b\\011c"), "a\\b\tc");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }
}

//! `/proc/self/mountinfo`, as far as the daemon needs it: which device is mounted where,
//! with which file system, and whether it is writable. Pure parsing; callers read the file.

/// Where the kernel lists this process's mounts.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One mount, as far as we need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the device.
    pub dev: (u32, u32),
    /// Where it is mounted.
    pub mount_point: String,
    /// File system type.
    pub fstype: String,
    /// Mount source (e.g. `/dev/vda`).
    pub source: String,
    /// Both the mount and its super block are read-write.
    pub writable: bool,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c));
        let value = if octal {
            u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0')
        } else {
            256
        };
        if let Ok(byte) = u8::try_from(value) {
            out.push(byte);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every parsable mount, in mount order (the order of the file).
pub fn parse(mountinfo: &str) -> Vec<MountEntry> {
    mountinfo.lines().filter_map(parse_line).collect()
}

/// The top-most mount at `mount_point` in `/proc/self/mountinfo` text.
pub fn find_mount(mountinfo: &str, mount_point: &str) -> Option<MountEntry> {
    mountinfo
        .lines()
        .rev()
        .filter_map(parse_line)
        .find(|m| m.mount_point == mount_point)
}

fn has_rw(options: &str) -> bool {
    options.split(',').any(|o| o == "rw")
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let l: Vec<&str> = left.split(' ').collect();
    let r: Vec<&str> = right.split(' ').collect();
    if l.len() < 6 || r.len() < 2 {
        return None;
    }
    let (maj, min) = l[2].split_once(':')?;
    Some(MountEntry {
        dev: (maj.parse().ok()?, min.parse().ok()?),
        mount_point: unescape(l[4]),
        fstype: r[0].to_owned(),
        source: unescape(r[1]),
        writable: has_rw(l[5]) && r.get(2).is_some_and(|o| has_rw(o)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
23 22 0:5 / /dev rw shared:2 - devtmpfs devtmpfs rw,size=1k\n\
30 22 0:40 / /mnt/with\\040space rw - tmpfs tmpfs rw\n\
31 1 0:41 / / rw - overlay overlay rw\n\
32 22 254:16 / /data ro,relatime - ext4 /dev/vdb rw\n";

    #[test]
    fn parses_mountinfo() {
        let root = find_mount(INFO, "/").unwrap();
        assert_eq!(root.fstype, "overlay", "the last (top-most) mount wins");
        let first = parse_line(INFO.lines().next().unwrap()).unwrap();
        assert_eq!(
            first,
            MountEntry {
                dev: (254, 0),
                mount_point: "/".into(),
                fstype: "ext4".into(),
                source: "/dev/vda".into(),
                writable: true,
            }
        );
        assert!(find_mount(INFO, "/mnt/with space").is_some());
        assert!(find_mount(INFO, "/nope").is_none());
        assert_eq!(parse_line("garbage"), None);
        let all = parse(INFO);
        assert_eq!(all.len(), 5);
        assert!(!all[4].writable, "a read-only mount of a rw super block");
    }

    #[test]
    fn read_only_super_block() {
        let m = parse_line("40 22 254:32 / /x rw,relatime - ext4 /dev/vdc ro,errors=remount-ro")
            .unwrap();
        assert!(!m.writable);
    }
}

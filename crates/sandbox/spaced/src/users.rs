//! Users and groups from `/etc/passwd` and `/etc/group`, parsed by hand.
//!
//! The daemon is linked statically against glibc, where `getpwnam` and friends need NSS
//! modules loaded at run time; templates may not even ship them. The sandbox's accounts are
//! plain files, so we read them ourselves, fresh on every lookup (a process may have run
//! `useradd` a moment ago). The names of ids, which every file stat reports, come from a
//! cache that is read again whenever either file changes ([`NameCache`]). Parsing is pure
//! and unit-tested; [`lookup`] and [`NameCache`] do the I/O.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Largest passwd/group file read; bigger files are cut (a sandbox has a few dozen users).
const MAX_DB_BYTES: u64 = 8 * 1024 * 1024;

/// The accounts database.
const PASSWD: &str = "/etc/passwd";
/// The groups database.
const GROUP: &str = "/etc/group";

/// Shell used when the passwd entry names none.
const DEFAULT_SHELL: &str = "/bin/sh";

/// One line of `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory.
    pub home: String,
    /// Login shell.
    pub shell: String,
}

/// One line of `/etc/group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    /// Group name.
    pub name: String,
    /// Group id.
    pub gid: u32,
    /// Supplementary members (user names).
    pub members: Vec<String>,
}

/// Everything needed to act as a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Primary group first, then supplementary groups, without duplicates.
    pub groups: Vec<u32>,
    /// Home directory (`/` when the entry has none).
    pub home: String,
    /// Login shell.
    pub shell: String,
}

impl UserInfo {
    /// The superuser, used when the accounts database cannot be read at all.
    pub fn root() -> Self {
        UserInfo {
            name: "root".into(),
            uid: 0,
            gid: 0,
            groups: vec![0],
            home: "/root".into(),
            shell: DEFAULT_SHELL.into(),
        }
    }
}

/// Why a user could not be looked up.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// No such user in `/etc/passwd`.
    #[error("no such user: {0}")]
    NotFound(String),
    /// The accounts database could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// Which file.
        path: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

/// Parses `/etc/passwd` text; malformed lines are skipped.
pub fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines().filter_map(parse_passwd_line).collect()
}

fn parse_passwd_line(line: &str) -> Option<PasswdEntry> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 || f[0].is_empty() {
        return None;
    }
    let home = if f[5].is_empty() { "/" } else { f[5] };
    let shell = if f[6].is_empty() { DEFAULT_SHELL } else { f[6] };
    Some(PasswdEntry {
        name: f[0].to_owned(),
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: home.to_owned(),
        shell: shell.to_owned(),
    })
}

/// Parses `/etc/group` text; malformed lines are skipped.
pub fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines().filter_map(parse_group_line).collect()
}

fn parse_group_line(line: &str) -> Option<GroupEntry> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 4 || f[0].is_empty() {
        return None;
    }
    Some(GroupEntry {
        name: f[0].to_owned(),
        gid: f[2].parse().ok()?,
        members: f[3]
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .collect(),
    })
}

/// Resolves `name` against parsed databases: the first matching passwd entry, its primary
/// group and every group that lists the user as a member.
pub fn resolve(name: &str, passwd: &[PasswdEntry], groups: &[GroupEntry]) -> Option<UserInfo> {
    let p = passwd.iter().find(|p| p.name == name)?;
    let mut gids = vec![p.gid];
    for g in groups {
        if g.members.iter().any(|m| m == name) && !gids.contains(&g.gid) {
            gids.push(g.gid);
        }
    }
    Some(UserInfo {
        name: p.name.clone(),
        uid: p.uid,
        gid: p.gid,
        groups: gids,
        home: p.home.clone(),
        shell: p.shell.clone(),
    })
}

/// Finds a group id by name (e.g. `tty`).
pub fn group_id(name: &str, groups: &[GroupEntry]) -> Option<u32> {
    groups.iter().find(|g| g.name == name).map(|g| g.gid)
}

/// Reads an accounts file, at most [`MAX_DB_BYTES`] of it.
fn read_text(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_DB_BYTES).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn read_db(path: &'static str) -> Result<String, UserError> {
    read_text(Path::new(path)).map_err(|source| UserError::Io { path, source })
}

/// Looks a user up in `/etc/passwd` and `/etc/group`. A missing `/etc/group` only means
/// no supplementary groups.
pub fn lookup(name: &str) -> Result<UserInfo, UserError> {
    let passwd = parse_passwd(&read_db(PASSWD)?);
    let groups = read_db(GROUP).map(|t| parse_group(&t)).unwrap_or_default();
    resolve(name, &passwd, &groups).ok_or_else(|| UserError::NotFound(name.to_owned()))
}

/// The names of user and group ids.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AccountNames {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl AccountNames {
    /// From parsed databases; the first entry of an id names it (as `getpwuid` does).
    pub fn new(passwd: &[PasswdEntry], groups: &[GroupEntry]) -> Self {
        let mut names = AccountNames::default();
        for p in passwd {
            names.users.entry(p.uid).or_insert_with(|| p.name.clone());
        }
        for g in groups {
            names.groups.entry(g.gid).or_insert_with(|| g.name.clone());
        }
        names
    }

    /// The name of user `uid`.
    pub fn user(&self, uid: u32) -> Option<&str> {
        self.users.get(&uid).map(String::as_str)
    }

    /// The name of group `gid`.
    pub fn group(&self, gid: u32) -> Option<&str> {
        self.groups.get(&gid).map(String::as_str)
    }
}

/// What identifies a version of an accounts file: inode (tools replace it by rename),
/// modification time and size. `None` when it cannot be stat'ed.
type FileVersion = Option<(u64, i64, i64, u64)>;
/// The versions of the passwd and the group file.
type Versions = (FileVersion, FileVersion);

fn version(path: &Path) -> FileVersion {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

/// [`AccountNames`] read from a passwd and a group file, and read again whenever either
/// changes.
#[derive(Debug)]
pub struct NameCache {
    passwd: PathBuf,
    group: PathBuf,
    /// The names, and the versions of (passwd, group) they were read from.
    cached: Mutex<Option<(Versions, Arc<AccountNames>)>>,
}

impl NameCache {
    /// A cache of the names in these two files (nothing is read yet).
    pub fn new(passwd: impl Into<PathBuf>, group: impl Into<PathBuf>) -> Self {
        NameCache {
            passwd: passwd.into(),
            group: group.into(),
            cached: Mutex::new(None),
        }
    }

    /// The names as of the files now. A file that cannot be read gives no names and is not
    /// cached (the caller may be acting as a user who cannot read it); a missing one gives
    /// none.
    pub fn names(&self) -> Arc<AccountNames> {
        let current = (version(&self.passwd), version(&self.group));
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, names)) = cached.as_ref() {
            if *seen == current {
                return names.clone();
            }
        }
        let read = |path: &Path| match read_text(path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(String::new()),
            Err(_) => None,
        };
        let (Some(passwd), Some(group)) = (read(&self.passwd), read(&self.group)) else {
            return Arc::default();
        };
        let names = Arc::new(AccountNames::new(
            &parse_passwd(&passwd),
            &parse_group(&group),
        ));
        *cached = Some((current, names.clone()));
        names
    }
}

/// The names of ids as of the guest's current `/etc/passwd` and `/etc/group`.
pub fn account_names() -> Arc<AccountNames> {
    static ETC: OnceLock<NameCache> = OnceLock::new();
    ETC.get_or_init(|| NameCache::new(PASSWD, GROUP)).names()
}

/// Looks up the gid of a group by name; `None` if it does not exist or cannot be read.
pub fn lookup_group(name: &str) -> Option<u32> {
    let groups = parse_group(&read_db(GROUP).ok()?);
    group_id(name, &groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # comment\n\
        user:x:1000:1000:User,,,:/home/user:/bin/bash\n\
        broken:x:notanumber:1:::\n\
        short:x:1\n\
        nohome:x:1001:1001:::\n";
    const GROUP: &str = "root:x:0:\nsudo:x:27:user,other\nuser:x:1000:\ndocker:x:999: user \ntty:x:5:\nbad:x:zz:user\n";

    #[test]
    fn parses_passwd_and_skips_garbage() {
        let p = parse_passwd(PASSWD);
        assert_eq!(p.len(), 3);
        assert_eq!(
            p[1],
            PasswdEntry {
                name: "user".into(),
                uid: 1000,
                gid: 1000,
                home: "/home/user".into(),
                shell: "/bin/bash".into()
            }
        );
        assert_eq!(p[2].home, "/");
        assert_eq!(p[2].shell, DEFAULT_SHELL);
    }

    #[test]
    fn names_ids_by_their_first_entry() {
        let names = AccountNames::new(
            &parse_passwd(&format!("{PASSWD}dup:x:1000:1000::/:/bin/sh\n")),
            &parse_group(GROUP),
        );
        assert_eq!(names.user(0), Some("root"));
        assert_eq!(names.user(1000), Some("user"), "the first entry wins");
        assert_eq!(names.user(4242), None);
        assert_eq!(names.group(27), Some("sudo"));
        assert_eq!(names.group(1234), None);
    }

    #[test]
    fn the_name_cache_reads_again_when_a_file_changes() {
        let d = tempfile::tempdir().unwrap();
        let (p, g) = (d.path().join("passwd"), d.path().join("group"));
        std::fs::write(&p, PASSWD).unwrap();
        let cache = NameCache::new(&p, &g);
        let names = cache.names();
        assert_eq!(names.user(1000), Some("user"));
        assert_eq!(
            names.group(1000),
            None,
            "a missing group file names no group"
        );
        assert!(
            Arc::ptr_eq(&names, &cache.names()),
            "unchanged files are not read again"
        );
        // Replaced the way useradd does it: a new file renamed over the old one.
        std::fs::write(
            d.path().join("passwd.new"),
            "agent:x:1000:1000::/:/bin/sh\n",
        )
        .unwrap();
        std::fs::rename(d.path().join("passwd.new"), &p).unwrap();
        std::fs::write(&g, GROUP).unwrap();
        let names = cache.names();
        assert_eq!(names.user(1000), Some("agent"));
        assert_eq!(names.group(1000), Some("user"));
    }

    #[test]
    fn resolves_supplementary_groups() {
        let p = parse_passwd(PASSWD);
        let g = parse_group(GROUP);
        let u = resolve("user", &p, &g).unwrap();
        assert_eq!(u.uid, 1000);
        assert_eq!(u.groups, vec![1000, 27, 999]);
        assert_eq!(resolve("root", &p, &g).unwrap().groups, vec![0]);
        assert!(resolve("nobody", &p, &g).is_none());
        assert_eq!(group_id("tty", &g), Some(5));
    }
}

//! Users and groups from `/etc/passwd` and `/etc/group`, parsed by hand.
//!
//! The daemon is linked statically against glibc, where `getpwnam` and friends need NSS
//! modules loaded at run time; templates may not even ship them. The sandbox's accounts are
//! plain files, so we read them ourselves, fresh on every lookup (a process may have run
//! `useradd` a moment ago). Parsing is pure and unit-tested; [`lookup`] does the I/O.

use std::io::Read;

/// Largest passwd/group file read; bigger files are cut (a sandbox has a few dozen users).
const MAX_DB_BYTES: u64 = 8 * 1024 * 1024;

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

fn read_db(path: &'static str) -> Result<String, UserError> {
    let file = std::fs::File::open(path).map_err(|source| UserError::Io { path, source })?;
    let mut bytes = Vec::new();
    file.take(MAX_DB_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|source| UserError::Io { path, source })?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Looks a user up in `/etc/passwd` and `/etc/group`. A missing `/etc/group` only means
/// no supplementary groups.
pub fn lookup(name: &str) -> Result<UserInfo, UserError> {
    let passwd = parse_passwd(&read_db("/etc/passwd")?);
    let groups = read_db("/etc/group")
        .map(|t| parse_group(&t))
        .unwrap_or_default();
    resolve(name, &passwd, &groups).ok_or_else(|| UserError::NotFound(name.to_owned()))
}

/// Looks up the gid of a group by name; `None` if it does not exist or cannot be read.
pub fn lookup_group(name: &str) -> Option<u32> {
    let groups = parse_group(&read_db("/etc/group").ok()?);
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

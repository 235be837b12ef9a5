//! The messages of envd's `filesystem.Filesystem` service in the proto3 JSON mapping (see
//! [`super::process`] for the rules), and [`EntryInfo::of`], SPACE's `FileStat` as envd
//! describes an entry. Written from the interface's facts (`docs/e2b-compat.md`, 3.1).

use serde::{Deserialize, Serialize};
use space_core::files::{FileKind, FileStat};

use crate::timestamp::rfc3339;

/// A request naming one path (`Stat`, `MakeDir`, `Remove`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PathRequest {
    /// The guest path.
    pub path: String,
}

/// `Move`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MoveRequest {
    /// From.
    pub source: String,
    /// To.
    pub destination: String,
}

/// `ListDir`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ListDirRequest {
    /// The directory.
    pub path: String,
    /// Levels to descend (proto3's default 0 reads as 1: the directory's own entries).
    #[serde(default)]
    pub depth: u32,
}

impl ListDirRequest {
    /// The depth to list (at least 1).
    pub fn effective_depth(&self) -> u32 {
        self.depth.max(1)
    }
}

/// `WatchDir` and `CreateWatcher`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchDirRequest {
    /// The directory.
    pub path: String,
    /// Watch below it too.
    #[serde(default)]
    pub recursive: bool,
    /// Put the entry's info into each event.
    #[serde(default, alias = "include_entry")]
    pub include_entry: bool,
    /// Allow watching network mounts.
    #[serde(default, alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileType {
    /// Anything else (device, socket, fifo).
    #[serde(rename = "FILE_TYPE_UNSPECIFIED")]
    Unspecified,
    /// A regular file.
    #[serde(rename = "FILE_TYPE_FILE")]
    File,
    /// A directory.
    #[serde(rename = "FILE_TYPE_DIRECTORY")]
    Directory,
    /// A symbolic link.
    #[serde(rename = "FILE_TYPE_SYMLINK")]
    Symlink,
}

/// An entry as envd describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    /// Base name.
    pub name: String,
    /// What it is.
    #[serde(rename = "type")]
    pub file_type: FileType,
    /// Absolute guest path.
    pub path: String,
    /// Size in bytes (`int64`: a string in JSON).
    #[serde(with = "int64_string")]
    pub size: u64,
    /// Permission bits (`0o777`; of the target, for a symlink), as E2B's envd.
    pub mode: u32,
    /// Go's `FileMode.String()` of the entry itself, as E2B's envd: e.g. `-rw-r--r--`,
    /// `dtrwxrwxrwx`, `Lrwxrwxrwx`, `urwxr-xr-x`.
    pub permissions: String,
    /// Owner's user name (or the uid when it has none).
    pub owner: String,
    /// Group name (or the gid).
    pub group: String,
    /// Last modification, RFC 3339.
    pub modified_time: String,
    /// For a symlink, the path it resolves to (every link followed; the link's own path
    /// when it is broken), as E2B's envd (`filepath.EvalSymlinks`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Its metadata (`X-Metadata-*` at upload).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Whether it is a symlink (proto3 default `false` omitted). `type` is then the
    /// target's (newer envd; SDKs that know this field show the link as a symlink, older
    /// ones as what it points to, as E2B's envd of their time did).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_symlink: bool,
}

/// `int64` as a JSON string (accepting a number on input).
mod int64_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&n.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(u64),
        }
        match Raw::deserialize(d)? {
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
            Raw::Number(n) => Ok(n),
        }
    }
}

/// Go's `os.FileMode.String()` of an entry of `kind` with `mode` (`st_mode`), what E2B's
/// envd reports: the letters of the set type and mode bits in Go's order (`d` directory,
/// `L` symlink, `u` setuid, `g` setgid, `t` sticky), `-` if none, then `rwxrwxrwx`.
/// Devices, fifos and sockets (`FileKind::Other`) carry no type letter: the guest reports
/// them as one kind.
pub fn permissions(kind: FileKind, mode: u32) -> String {
    let mut out = String::with_capacity(12);
    let letters = [
        (kind == FileKind::Dir, 'd'),
        (kind == FileKind::Symlink, 'L'),
        (mode & 0o4000 != 0, 'u'),
        (mode & 0o2000 != 0, 'g'),
        (mode & 0o1000 != 0, 't'),
    ];
    out.extend(letters.iter().filter(|(set, _)| *set).map(|(_, c)| *c));
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    out
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::File,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Other => FileType::Unspecified,
    }
}

impl EntryInfo {
    /// SPACE's `stat` as envd's entry; `owner` and `group` are the names the guest's
    /// passwd and group files give `stat.uid` and `stat.gid`.
    pub fn of(stat: &FileStat, owner: String, group: String) -> EntryInfo {
        // A symlink as E2B's envd reports it: its target's type and permission bits, and
        // the resolved path; a broken one has no type, mode 0, and its own path.
        let (file_type, mode, symlink_target) = match (stat.kind, &stat.resolved) {
            (FileKind::Symlink, Some(to)) => {
                (file_type(to.kind), to.mode & 0o777, Some(to.path.clone()))
            }
            (FileKind::Symlink, None) => (FileType::Unspecified, 0, Some(stat.path.clone())),
            (kind, _) => (file_type(kind), stat.mode & 0o777, None),
        };
        EntryInfo {
            name: stat.name.clone(),
            file_type,
            path: stat.path.clone(),
            size: stat.size,
            mode,
            permissions: permissions(stat.kind, stat.mode),
            owner,
            group,
            modified_time: rfc3339(stat.modified_ms),
            symlink_target,
            metadata: stat.metadata.clone(),
            is_symlink: stat.kind == FileKind::Symlink,
        }
    }
}

/// `Stat`, `MakeDir` and `Move` responses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryResponse {
    /// The entry.
    pub entry: EntryInfo,
}

/// `ListDir`'s response.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ListDirResponse {
    /// The entries.
    pub entries: Vec<EntryInfo>,
}

/// What happened to a watched entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// Created.
    #[serde(rename = "EVENT_TYPE_CREATE")]
    Create,
    /// Written.
    #[serde(rename = "EVENT_TYPE_WRITE")]
    Write,
    /// Removed.
    #[serde(rename = "EVENT_TYPE_REMOVE")]
    Remove,
    /// Renamed.
    #[serde(rename = "EVENT_TYPE_RENAME")]
    Rename,
    /// Permissions changed.
    #[serde(rename = "EVENT_TYPE_CHMOD")]
    Chmod,
}

/// One change in a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemEvent {
    /// Path relative to the watched directory.
    pub name: String,
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// The entry, when the watch asked for it and it still exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// `GetWatcherEvents` and `RemoveWatcher`: the watcher `CreateWatcher` made.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatcherRequest {
    /// Its id.
    #[serde(alias = "watcher_id")]
    pub watcher_id: String,
}

/// `CreateWatcher`'s response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateWatcherResponse {
    /// The new watcher.
    pub watcher_id: String,
}

/// `GetWatcherEvents`' response: the changes since the last call.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GetWatcherEventsResponse {
    /// Oldest first.
    pub events: Vec<FilesystemEvent>,
}

/// One message of a `WatchDir` stream: exactly one field is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WatchDirResponse {
    /// The watch is in place (always first).
    Start {},
    /// A change (boxed: an event with its entry is much larger than the other variants).
    Filesystem(Box<FilesystemEvent>),
    /// Nothing happened for a while.
    Keepalive {},
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn permission_strings_are_ls_style() {
        // What Go's os.FileMode.String() prints for these.
        assert_eq!(permissions(FileKind::File, 0o100644), "-rw-r--r--");
        assert_eq!(permissions(FileKind::Dir, 0o40755), "drwxr-xr-x");
        assert_eq!(permissions(FileKind::Symlink, 0o777), "Lrwxrwxrwx");
        assert_eq!(permissions(FileKind::Dir, 0o1777), "dtrwxrwxrwx");
        assert_eq!(permissions(FileKind::File, 0o4755), "urwxr-xr-x");
        assert_eq!(permissions(FileKind::Dir, 0o2775), "dgrwxrwxr-x");
        assert_eq!(permissions(FileKind::File, 0o6755), "ugrwxr-xr-x");
        assert_eq!(permissions(FileKind::Other, 0), "----------");
    }

    #[test]
    fn entries_render_in_the_proto3_json_mapping() {
        let stat = FileStat {
            path: "/home/user/a.txt".into(),
            name: "a.txt".into(),
            kind: FileKind::File,
            size: 5_000_000_000,
            mode: 0o100640,
            uid: 1000,
            gid: 1000,
            owner: Some("user".into()),
            group: Some("user".into()),
            modified_ms: 1_764_417_600_000,
            symlink_target: None,
            resolved: None,
            metadata: Default::default(),
        };
        let json = serde_json::to_value(EntryResponse {
            entry: EntryInfo::of(&stat, "user".into(), "user".into()),
        })
        .unwrap();
        assert_eq!(
            json,
            json!({"entry": {
                "name": "a.txt", "type": "FILE_TYPE_FILE", "path": "/home/user/a.txt",
                "size": "5000000000", "mode": 0o640, "permissions": "-rw-r-----",
                "owner": "user", "group": "user", "modifiedTime": "2025-11-29T12:00:00Z"
            }})
        );
        let back: EntryResponse = serde_json::from_value(json).unwrap();
        assert_eq!(back.entry.size, 5_000_000_000);
    }

    #[test]
    fn symlinks_report_their_target_as_e2b_does() {
        let link = |resolved| FileStat {
            path: "/home/user/py".into(),
            name: "py".into(),
            kind: FileKind::Symlink,
            size: 16,
            mode: 0o777,
            uid: 0,
            gid: 0,
            owner: None,
            group: None,
            modified_ms: 0,
            symlink_target: Some("../../usr/bin/python3".into()),
            resolved,
            metadata: Default::default(),
        };
        let e = EntryInfo::of(
            &link(Some(space_core::files::ResolvedLink {
                path: "/usr/bin/python3.11".into(),
                kind: FileKind::File,
                mode: 0o755,
            })),
            "root".into(),
            "root".into(),
        );
        assert_eq!(
            (e.file_type, e.mode, e.permissions.as_str(), e.is_symlink),
            (FileType::File, 0o755, "Lrwxrwxrwx", true)
        );
        assert_eq!(e.symlink_target.as_deref(), Some("/usr/bin/python3.11"));
        let broken = EntryInfo::of(&link(None), "root".into(), "root".into());
        assert_eq!(
            (broken.file_type, broken.mode, broken.is_symlink),
            (FileType::Unspecified, 0, true)
        );
        assert_eq!(broken.symlink_target.as_deref(), Some("/home/user/py"));
    }

    #[test]
    fn requests_parse_with_defaults_and_either_name_style() {
        let l: ListDirRequest = serde_json::from_value(json!({"path": "/"})).unwrap();
        assert_eq!(l.effective_depth(), 1);
        let w: WatchDirRequest =
            serde_json::from_value(json!({"path": "/d", "recursive": true, "include_entry": true}))
                .unwrap();
        assert!(w.recursive && w.include_entry && !w.allow_network_mounts);
        let m: MoveRequest =
            serde_json::from_value(json!({"source": "/a", "destination": "/b"})).unwrap();
        assert_eq!(m.destination, "/b");
        assert!(serde_json::from_value::<PathRequest>(json!({})).is_err());
    }

    #[test]
    fn watch_events_render_as_one_key() {
        let e = WatchDirResponse::Filesystem(Box::new(FilesystemEvent {
            name: "sub/x".into(),
            event_type: EventType::Create,
            entry: None,
        }));
        assert_eq!(
            serde_json::to_value(e).unwrap(),
            json!({"filesystem": {"name": "sub/x", "type": "EVENT_TYPE_CREATE"}})
        );
        assert_eq!(
            serde_json::to_value(WatchDirResponse::Start {}).unwrap(),
            json!({"start": {}})
        );
    }
}

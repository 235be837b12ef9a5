//! Watching a directory: what to watch, and the events a watch stream carries.
//!
//! The guest daemon watches with inotify, acting as the requesting user; the events follow
//! the conventions of Go's fsnotify (what E2B's envd reports), so a client written for one
//! reads the other: a change inside the tree is `create`, `write`, `chmod` or `remove`; a
//! move inside the tree is `rename` for the old name and `create` for the new one; a move out
//! is `rename`, a move in `create`.

use serde::{Deserialize, Serialize};

use super::{validate_path, FileStat, PathError};
use crate::process::validate_user_name;

/// The name a watch event gives the watched directory itself (removed, or moved away).
pub const WATCH_ROOT_NAME: &str = ".";

/// Watch a directory for changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema, utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct WatchRequest {
    /// Directory to watch: absolute, or relative to the user's home.
    pub path: String,
    /// Also watch every subdirectory, including those created while the watch runs.
    #[serde(default)]
    pub recursive: bool,
    /// User to act as; default the sandbox's default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Why a [`WatchRequest`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchRequestError {
    /// The path is not acceptable.
    #[error("bad path: {0}")]
    Path(#[from] PathError),
    /// The user name is not acceptable.
    #[error("bad user name: [a-z_][a-z0-9_-]*, at most 32 bytes")]
    User,
}

impl WatchRequest {
    /// Checks the path and the user name, as every file operation does.
    pub fn validate(&self) -> Result<(), WatchRequestError> {
        validate_path(&self.path)?;
        match &self.user {
            Some(u) if validate_user_name(u).is_err() => Err(WatchRequestError::User),
            _ => Ok(()),
        }
    }
}

/// What happened to an entry of a watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FileChange {
    /// Created, or moved into the watched tree (also the new name of a move inside it).
    Create,
    /// Its content was written.
    Write,
    /// Removed.
    Remove,
    /// Moved away: the old name of a move inside the tree, or moved out of it.
    Rename,
    /// Its metadata changed (mode, owner, timestamps, extended attributes).
    Chmod,
}

/// One line of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
// Events pass one at a time through a bounded stream: the size of the one carrying a stat
// costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum WatchEvent {
    /// The watch is in place: changes from now on are reported.
    Started {
        /// Sequence number (1 for this first event, then one more per event).
        seq: u64,
    },
    /// `name` is the path relative to the watched directory (`sub/file.txt`; [`WATCH_ROOT_NAME`]
    /// for the watched directory itself).
    Change {
        /// Sequence number.
        seq: u64,
        /// Path relative to the watched directory.
        name: String,
        /// What happened.
        change: FileChange,
        /// The entry after the change (lstat), when it still exists.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stat: Option<FileStat>,
    },
    /// Changes were lost (the queue or the kernel's overflowed); the stream goes on.
    Overflow {
        /// Sequence number.
        seq: u64,
    },
}

impl WatchEvent {
    /// The event's sequence number.
    pub fn seq(&self) -> u64 {
        match self {
            WatchEvent::Started { seq }
            | WatchEvent::Change { seq, .. }
            | WatchEvent::Overflow { seq } => *seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_snake_case() {
        let ev = WatchEvent::Change {
            seq: 3,
            name: "sub/a.txt".into(),
            change: FileChange::Chmod,
            stat: None,
        };
        let json = serde_json::to_string(&ev).unwrap();
        assert_eq!(
            json,
            r#"{"type":"change","seq":3,"name":"sub/a.txt","change":"chmod"}"#
        );
        assert_eq!(serde_json::from_str::<WatchEvent>(&json).unwrap(), ev);
        assert_eq!(
            serde_json::to_string(&WatchEvent::Overflow { seq: 9 }).unwrap(),
            r#"{"type":"overflow","seq":9}"#
        );
        assert_eq!(WatchEvent::Started { seq: 1 }.seq(), 1);
    }

    #[test]
    fn requests_are_checked_like_file_operations() {
        let req = |path: &str, user: Option<&str>| WatchRequest {
            path: path.into(),
            recursive: false,
            user: user.map(Into::into),
        };
        assert!(req("/home/user", Some("user")).validate().is_ok());
        assert!(req("notes", None).validate().is_ok());
        assert_eq!(
            req("/a/../b", None).validate(),
            Err(WatchRequestError::Path(PathError::Traversal))
        );
        assert_eq!(
            req("/tmp", Some("Bad!")).validate(),
            Err(WatchRequestError::User)
        );
        let parsed: WatchRequest = serde_json::from_str(r#"{"path":"/tmp"}"#).unwrap();
        assert!(!parsed.recursive);
    }
}

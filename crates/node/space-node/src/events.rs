//! The event log of each sandbox: every lifecycle transition with its time and detail,
//! appended to `records/<id>.events` (JSON lines, bounded: the file rotates once at
//! [`MAX_LOG_BYTES`]) and broadcast to live followers.

use std::io::Write;
use std::path::{Path, PathBuf};

use space_core::{LifecycleEntry, SandboxId};
use tokio::sync::broadcast;

/// Size at which a sandbox's event log rotates (the previous file is kept as `.1`).
pub const MAX_LOG_BYTES: u64 = 256 * 1024;
/// Entries a slow follower may lag behind before it misses some.
const FOLLOWER_BUFFER: usize = 1024;

/// Appends and reads event logs; fans entries out to followers.
pub(crate) struct EventLog {
    dir: PathBuf,
    tx: broadcast::Sender<LifecycleEntry>,
}

impl EventLog {
    pub(crate) fn new(dir: &Path) -> EventLog {
        EventLog {
            dir: dir.to_owned(),
            tx: broadcast::channel(FOLLOWER_BUFFER).0,
        }
    }

    fn path(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(format!("{id}.events"))
    }

    /// Records one entry. Losing an entry to an I/O error is logged, never fatal.
    pub(crate) fn append(&self, entry: LifecycleEntry) {
        let path = self.path(&entry.sandbox_id);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > MAX_LOG_BYTES) {
            let _ = std::fs::rename(&path, path.with_extension("events.1"));
        }
        let write = serde_json::to_vec(&entry)
            .map_err(std::io::Error::other)
            .and_then(|mut line| {
                line.push(b'\n');
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)?
                    .write_all(&line)
            });
        if let Err(e) = write {
            tracing::warn!(sandbox = %entry.sandbox_id, error = %e, "cannot append to event log");
        }
        let _ = self.tx.send(entry);
    }

    /// Starts the log of a sandbox that has none here with `entries` (its log from another
    /// node), not broadcast: they happened before. A sandbox with a log here keeps it.
    pub(crate) fn seed(&self, id: &SandboxId, entries: &[LifecycleEntry]) {
        let path = self.path(id);
        if entries.is_empty() || path.exists() || path.with_extension("events.1").exists() {
            return;
        }
        let mut lines = Vec::new();
        for e in entries.iter().filter(|e| e.sandbox_id == *id) {
            if let Ok(mut line) = serde_json::to_vec(e) {
                line.push(b'\n');
                lines.extend_from_slice(&line);
            }
        }
        if let Err(e) = std::fs::write(&path, &lines) {
            tracing::warn!(sandbox = %id, error = %e, "cannot carry a sandbox's event log over");
        }
    }

    /// Every kept entry of a sandbox, oldest first.
    pub(crate) fn read(&self, id: &SandboxId) -> Vec<LifecycleEntry> {
        let path = self.path(id);
        [path.with_extension("events.1"), path]
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Removes a sandbox's log (when its record is pruned).
    pub(crate) fn remove(&self, id: &SandboxId) {
        let path = self.path(id);
        let _ = std::fs::remove_file(path.with_extension("events.1"));
        let _ = std::fs::remove_file(path);
    }

    /// Entries of every sandbox from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<LifecycleEntry> {
        self.tx.subscribe()
    }
}

//! Directory watches the way envd offers them: streamed (`WatchDir`, what the JS and async
//! Python SDKs use) or polled (`CreateWatcher`, then `GetWatcherEvents` until
//! `RemoveWatcher`, what the sync Python SDK uses). Both stand on SPACE's own watch (the
//! guest daemon's inotify watch, streamed over the channel).
//!
//! A polled watcher is a task here that reads its watch stream into a bounded buffer; it
//! belongs to one sandbox, and one nobody polls for [`WATCHER_IDLE_TTL`] is removed (the
//! SDK's handle may be dropped without `stop()`). The number per sandbox is bounded, since
//! each holds one of the guest's watch streams.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::StreamExt;
use space_core::files::watch::{FileChange, WatchEvent};
use space_core::SandboxId;
use space_guest_client::GuestError;

use super::filesystem::{EventType, FilesystemEvent};
use super::filesystem_service::entry;
use crate::connect::{Code, ConnectError};
use space_core::error::excerpt;

/// Most polled watchers one sandbox may have.
pub const MAX_WATCHERS_PER_SANDBOX: usize = 16;
/// Changes a polled watcher keeps between two polls; later ones are dropped until the next.
pub const MAX_BUFFERED_EVENTS: usize = 4096;
/// A watcher not polled for this long is removed.
pub const WATCHER_IDLE_TTL: Duration = Duration::from_secs(300);

/// envd's event type for a SPACE change.
pub fn event_type(change: FileChange) -> EventType {
    match change {
        FileChange::Create => EventType::Create,
        FileChange::Write => EventType::Write,
        FileChange::Remove => EventType::Remove,
        FileChange::Rename => EventType::Rename,
        FileChange::Chmod => EventType::Chmod,
    }
}

/// envd's event for a SPACE watch event; `None` for what envd has no event for (the start,
/// an overflow).
pub fn filesystem_event(ev: WatchEvent, include_entry: bool) -> Option<FilesystemEvent> {
    match ev {
        WatchEvent::Change {
            name, change, stat, ..
        } => Some(FilesystemEvent {
            name,
            event_type: event_type(change),
            entry: stat.filter(|_| include_entry).map(|s| entry(&s)),
        }),
        WatchEvent::Overflow { .. } => {
            tracing::debug!("a directory watch overflowed: changes were lost");
            None
        }
        WatchEvent::Started { .. } => None,
    }
}

/// SPACE writes a file atomically: a temporary file next to it, renamed over it once
/// complete. A watch sees changes of the temporary file and a `create` of the target; envd
/// writes in place, and the SDKs expect the file's own `create` and `write`. This hides
/// the temporary file and reports its rename into place as that pair.
#[derive(Debug, Default)]
pub struct AtomicWrites {
    /// The file a temporary file was just renamed away to (relative to the watched dir).
    landing: Option<String>,
}

impl AtomicWrites {
    /// The events to report for `ev`.
    pub fn translate(&mut self, ev: WatchEvent) -> Vec<WatchEvent> {
        let WatchEvent::Change {
            seq,
            name,
            change,
            stat,
        } = ev
        else {
            return vec![ev];
        };
        let (dir, base) = match name.rsplit_once('/') {
            Some((dir, base)) => (Some(dir), base),
            None => (None, name.as_str()),
        };
        if let Some(target) = space_core::files::atomic_write_target(base) {
            if change == FileChange::Rename {
                self.landing = Some(match dir {
                    Some(d) => format!("{d}/{target}"),
                    None => target.to_owned(),
                });
            }
            return Vec::new();
        }
        if change == FileChange::Create && self.landing.as_deref() == Some(name.as_str()) {
            self.landing = None;
            let write = WatchEvent::Change {
                seq,
                name: name.clone(),
                change: FileChange::Write,
                stat: stat.clone(),
            };
            return vec![
                WatchEvent::Change {
                    seq,
                    name,
                    change,
                    stat,
                },
                write,
            ];
        }
        vec![WatchEvent::Change {
            seq,
            name,
            change,
            stat,
        }]
    }
}

/// `events` as envd would report them (see [`AtomicWrites`]).
pub fn as_envd_writes(
    events: BoxStream<'static, Result<WatchEvent, GuestError>>,
) -> BoxStream<'static, Result<WatchEvent, GuestError>> {
    events
        .scan(AtomicWrites::default(), |writes, ev| {
            let out: Vec<Result<WatchEvent, GuestError>> = match ev {
                Ok(ev) => writes.translate(ev).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            std::future::ready(Some(futures::stream::iter(out)))
        })
        .flatten()
        .boxed()
}

/// What a polled watcher has collected.
#[derive(Default)]
struct Buffer {
    events: VecDeque<FilesystemEvent>,
    /// Why the watch ended, if it did (reported once the buffer is drained).
    ended: Option<ConnectError>,
}

struct Watcher {
    sandbox: SandboxId,
    buffer: Arc<Mutex<Buffer>>,
    last_poll: Instant,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A new, unguessable watcher id.
fn watcher_id() -> String {
    use rand::distributions::{Alphanumeric, DistString};
    format!(
        "w-{}",
        Alphanumeric.sample_string(&mut rand::thread_rng(), 24)
    )
}

/// The polled watchers of the node. Cheap to clone.
#[derive(Clone, Default)]
pub struct Watchers(Arc<Mutex<HashMap<String, Watcher>>>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few map or queue operations that cannot leave the data
    // half-changed, so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn not_found(id: &str) -> ConnectError {
    ConnectError::new(
        Code::NotFound,
        format!("watcher {} not found", excerpt(id, 64)),
    )
}

impl Watchers {
    /// Removes the watchers nobody polled for [`WATCHER_IDLE_TTL`].
    fn expire(map: &mut HashMap<String, Watcher>) {
        map.retain(|_, w| w.last_poll.elapsed() < WATCHER_IDLE_TTL);
    }

    /// A new watcher of `sandbox` reading `events` (whose `Started` has been seen).
    pub fn create(
        &self,
        sandbox: &SandboxId,
        events: BoxStream<'static, Result<WatchEvent, GuestError>>,
        include_entry: bool,
    ) -> Result<String, ConnectError> {
        let mut map = lock(&self.0);
        Self::expire(&mut map);
        if map.values().filter(|w| &w.sandbox == sandbox).count() >= MAX_WATCHERS_PER_SANDBOX {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_WATCHERS_PER_SANDBOX} watchers per sandbox"),
            ));
        }
        let buffer: Arc<Mutex<Buffer>> = Arc::default();
        let fill = buffer.clone();
        let mut events = as_envd_writes(events);
        let task = tokio::spawn(async move {
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(ev) => {
                        if let Some(ev) = filesystem_event(ev, include_entry) {
                            let mut b = lock(&fill);
                            if b.events.len() < MAX_BUFFERED_EVENTS {
                                b.events.push_back(ev);
                            }
                        }
                    }
                    Err(e) => {
                        lock(&fill).ended = Some(ConnectError::new(
                            Code::Unavailable,
                            format!("the watch broke off: {e}"),
                        ));
                        return;
                    }
                }
            }
        });
        let id = watcher_id();
        map.insert(
            id.clone(),
            Watcher {
                sandbox: sandbox.clone(),
                buffer,
                last_poll: Instant::now(),
                task,
            },
        );
        Ok(id)
    }

    /// The changes watcher `id` of `sandbox` collected since the last call.
    pub fn take_events(
        &self,
        sandbox: &SandboxId,
        id: &str,
    ) -> Result<Vec<FilesystemEvent>, ConnectError> {
        let mut map = lock(&self.0);
        Self::expire(&mut map);
        let watcher = map
            .get_mut(id)
            .filter(|w| &w.sandbox == sandbox)
            .ok_or_else(|| not_found(id))?;
        watcher.last_poll = Instant::now();
        let mut b = lock(&watcher.buffer);
        if b.events.is_empty() {
            if let Some(e) = b.ended.take() {
                drop(b);
                map.remove(id);
                return Err(e);
            }
        }
        Ok(b.events.drain(..).collect())
    }

    /// Removes watcher `id` of `sandbox`.
    pub fn remove(&self, sandbox: &SandboxId, id: &str) -> Result<(), ConnectError> {
        let mut map = lock(&self.0);
        match map.get(id) {
            Some(w) if &w.sandbox == sandbox => {
                map.remove(id);
                Ok(())
            }
            _ => Err(not_found(id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(name: &str, change: FileChange) -> Result<WatchEvent, GuestError> {
        Ok(WatchEvent::Change {
            seq: 2,
            name: name.into(),
            change,
            stat: None,
        })
    }

    #[test]
    fn atomic_writes_read_as_writes_in_place() {
        let tmp = space_core::files::atomic_write_temp_name("e.txt", 7);
        let ev = |name: &str, change| WatchEvent::Change {
            seq: 1,
            name: name.into(),
            change,
            stat: None,
        };
        let mut w = AtomicWrites::default();
        let mut seen = Vec::new();
        for e in [
            ev(&format!("sub/{tmp}"), FileChange::Create),
            ev(&format!("sub/{tmp}"), FileChange::Write),
            ev(&format!("sub/{tmp}"), FileChange::Rename),
            ev("sub/e.txt", FileChange::Create),
            ev("other.txt", FileChange::Create),
        ] {
            for out in w.translate(e) {
                if let WatchEvent::Change { name, change, .. } = out {
                    seen.push((name, change));
                }
            }
        }
        assert_eq!(
            seen,
            vec![
                ("sub/e.txt".into(), FileChange::Create),
                ("sub/e.txt".into(), FileChange::Write),
                ("other.txt".into(), FileChange::Create),
            ]
        );
    }

    #[tokio::test]
    async fn polled_watchers_collect_changes_for_their_sandbox_only() {
        let w = Watchers::default();
        let mine = SandboxId::generate();
        let other = SandboxId::generate();
        let events = futures::stream::iter(vec![
            change("a", FileChange::Create),
            Ok(WatchEvent::Overflow { seq: 3 }),
            change("a", FileChange::Remove),
        ])
        .chain(futures::stream::pending())
        .boxed();
        let id = w.create(&mine, events, false).unwrap();
        tokio::task::yield_now().await;
        assert_eq!(w.take_events(&other, &id).unwrap_err().code, Code::NotFound);
        let got = w.take_events(&mine, &id).unwrap();
        let kinds: Vec<_> = got
            .iter()
            .map(|e| (e.name.as_str(), e.event_type))
            .collect();
        assert_eq!(
            kinds,
            vec![("a", EventType::Create), ("a", EventType::Remove)]
        );
        assert!(w.take_events(&mine, &id).unwrap().is_empty(), "drained");
        assert_eq!(w.remove(&other, &id).unwrap_err().code, Code::NotFound);
        w.remove(&mine, &id).unwrap();
        assert_eq!(w.take_events(&mine, &id).unwrap_err().code, Code::NotFound);
    }

    #[tokio::test]
    async fn watchers_are_bounded_per_sandbox_and_report_a_broken_watch() {
        let w = Watchers::default();
        let sbx = SandboxId::generate();
        for _ in 0..MAX_WATCHERS_PER_SANDBOX {
            w.create(&sbx, futures::stream::pending().boxed(), false)
                .unwrap();
        }
        let refused = w.create(&sbx, futures::stream::pending().boxed(), false);
        assert_eq!(refused.unwrap_err().code, Code::ResourceExhausted);
        let other = SandboxId::generate();
        let broken =
            futures::stream::iter(vec![Err(GuestError::Disconnected("gone".into()))]).boxed();
        let id = w.create(&other, broken, false).unwrap();
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert_eq!(
            w.take_events(&other, &id).unwrap_err().code,
            Code::Unavailable
        );
        assert_eq!(w.take_events(&other, &id).unwrap_err().code, Code::NotFound);
    }
}

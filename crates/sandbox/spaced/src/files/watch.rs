//! Directory watches (`GET /v1/files/watch`): one thread per watch, acting as the user,
//! reading inotify and queueing `WatchEvent`s for the response body.
//!
//! The thread places every watch before the stream starts (errors are an ordinary error
//! response), queues `started`, then follows the tree: a new subdirectory is watched as it
//! appears, and its `create` reported once it is, then its entries' (`create`, and `write`
//! for files with content), since they may predate the watch; so an entry created in that
//! instant can be reported twice. Changes are reported with the entry's lstat; a queue the
//! reader does not drain drops changes and reports `overflow` once it has room again. The
//! thread ends when the reader goes away (the response body is dropped, which wakes it
//! through an eventfd) or after the watched directory itself is removed or moved.

mod tracker;

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use space_core::files::watch::{FileChange, WatchEvent};
use space_core::files::FileKind;
use space_core::ErrorCode;
use space_guest_proto::limits::{MAX_WATCHED_DIRS, MAX_WATCH_QUEUE};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use self::tracker::{Step, Tracker};
use crate::error::ApiError;
use crate::files::inotify::{self, Inotify};
use crate::files::ops;
use crate::fsuser::FsUserGuard;
use crate::users::UserInfo;

/// What every watched directory reports.
const WATCH_MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR
    | libc::IN_DONT_FOLLOW;
/// Bytes read from inotify at once (many records; one is at most 16 + 256 bytes).
const READ_BUFFER: usize = 64 * 1024;
/// How long a directory moved away waits for the record of its arrival inside the tree
/// (the kernel queues both at once; this only covers a read that split them).
const MOVE_PAIR_WAIT: Duration = Duration::from_millis(20);

/// A directory to watch, resolved by the API layer.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// Absolute path of the directory.
    pub root: PathBuf,
    /// Watch subdirectories too.
    pub recursive: bool,
    /// The acting user.
    pub user: UserInfo,
}

/// Wakes the watch thread when dropped (the reader went away).
#[derive(Debug)]
pub struct Canceller(Arc<OwnedFd>);

impl Drop for Canceller {
    fn drop(&mut self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a valid buffer to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}

/// A running watch; dropping it stops the thread.
#[derive(Debug)]
pub struct Watch {
    events: mpsc::Receiver<WatchEvent>,
    _canceller: Canceller,
}

impl Watch {
    /// The next event (`started` first); `None` once the watch has ended.
    pub async fn recv(&mut self) -> Option<WatchEvent> {
        self.events.recv().await
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Option<WatchEvent> {
        self.events.try_recv().ok()
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by eventfd and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Starts a watch; returns once every watch is in place, or with the reason none could be.
/// `permit` (one of `MAX_WATCH_STREAMS`) is held until the watch ends.
pub async fn start(spec: WatchSpec, permit: OwnedSemaphorePermit) -> Result<Watch, ApiError> {
    let cancel = Arc::new(eventfd().map_err(|e| ApiError::internal(format!("eventfd: {e}")))?);
    let (tx, events) = mpsc::channel(MAX_WATCH_QUEUE);
    let (ready_tx, ready) = oneshot::channel();
    let woken = cancel.clone();
    std::thread::Builder::new()
        .name("spaced-watch".into())
        .spawn(move || {
            let _permit = permit;
            run(spec, tx, &woken, ready_tx);
        })
        .map_err(|e| ApiError::internal(format!("cannot start a watch thread: {e}")))?;
    ready
        .await
        .map_err(|_| ApiError::internal("the watch thread ended before it was ready"))??;
    Ok(Watch {
        events,
        _canceller: Canceller(cancel),
    })
}

/// Queues events without ever blocking the thread: a full queue drops them and owes the
/// reader an `overflow`.
struct Emitter {
    tx: mpsc::Sender<WatchEvent>,
    next_seq: u64,
    owes_overflow: bool,
}

impl Emitter {
    fn push(&mut self, ev: WatchEvent) {
        match self.tx.try_send(ev) {
            Ok(()) => self.next_seq += 1,
            // Closed: the reader is gone, and the main loop notices.
            Err(_) => self.owes_overflow = true,
        }
    }

    /// Queues the event `make` builds (only when there is room, so a dropped change costs
    /// no lstat).
    fn emit(&mut self, make: impl FnOnce(u64) -> WatchEvent) {
        if self.owes_overflow {
            if self.tx.capacity() == 0 {
                return;
            }
            self.owes_overflow = false;
            self.push(WatchEvent::Overflow { seq: self.next_seq });
        }
        if self.tx.capacity() == 0 {
            self.owes_overflow = true;
            return;
        }
        let ev = make(self.next_seq);
        self.push(ev);
    }

    fn overflow(&mut self) {
        if !self.owes_overflow {
            self.emit(|seq| WatchEvent::Overflow { seq });
        }
    }
}

/// The tree being watched.
struct Watcher {
    root: PathBuf,
    ino: Inotify,
    tracker: Tracker,
    out: Emitter,
}

/// What watching a subtree found.
#[derive(Default)]
struct Walked {
    /// Entries found, when asked to report them (at most `MAX_WATCH_QUEUE`: more could not
    /// be queued anyway).
    found: Vec<String>,
    /// Some entries or directories were left out (a bound was reached).
    partial: bool,
}

impl Watcher {
    fn change(&mut self, name: String, change: FileChange) {
        let path = if name == space_core::files::watch::WATCH_ROOT_NAME {
            self.root.clone()
        } else {
            self.root.join(&name)
        };
        // Removed and moved-away entries are gone (a new one under the name is another entry).
        let exists = !matches!(change, FileChange::Remove | FileChange::Rename);
        self.out.emit(|seq| WatchEvent::Change {
            seq,
            name,
            change,
            stat: exists.then(|| ops::stat(&path).ok()).flatten(),
        });
    }

    /// Reports an entry found in a directory that was just watched: its `create` and, for a
    /// file with content, a `write`. Both may predate the watch, and a reader that re-reads
    /// a file on `write` must not miss content written before the watch could see it.
    fn found(&mut self, name: String) {
        let stat = ops::stat(&self.root.join(&name)).ok();
        let written = stat
            .as_ref()
            .is_some_and(|st| st.kind == FileKind::File && st.size > 0);
        let changes: &[FileChange] = if written {
            &[FileChange::Create, FileChange::Write]
        } else {
            &[FileChange::Create]
        };
        for &change in changes {
            let (name, stat) = (name.clone(), stat.clone());
            self.out.emit(|seq| WatchEvent::Change {
                seq,
                name,
                change,
                stat,
            });
        }
    }

    /// Watches the directory at `name` (relative to the root) and every directory below it,
    /// as far as [`MAX_WATCHED_DIRS`] allows; with `report`, collects the entries found.
    fn watch_tree(&mut self, name: &str, report: bool) -> Walked {
        let mut walked = Walked::default();
        let mut todo = vec![name.to_owned()];
        while let Some(rel) = todo.pop() {
            if self.tracker.dirs() >= MAX_WATCHED_DIRS {
                walked.partial = true;
                break;
            }
            let path = self.root.join(&rel);
            // Gone already, unreadable, or no longer a directory: nothing to watch there.
            let Ok(wd) = self.ino.add_watch(&path, WATCH_MASK) else {
                continue;
            };
            self.tracker.add_dir(wd, rel.clone());
            let Ok(entries) = fs::read_dir(&path) else {
                continue;
            };
            for entry in entries.flatten() {
                let child = format!("{rel}/{}", entry.file_name().to_string_lossy());
                // file_type does not follow symlinks.
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(child.clone());
                }
                if report {
                    if walked.found.len() < MAX_WATCH_QUEUE {
                        walked.found.push(child);
                    } else {
                        walked.partial = true;
                    }
                }
            }
        }
        walked
    }

    /// Carries out the tracker's steps; false once the watch has ended.
    fn apply(&mut self, steps: Vec<Step>) -> bool {
        for step in steps {
            match step {
                Step::Change { name, change } => self.change(name, change),
                Step::Overflow => self.out.overflow(),
                Step::Watch { name, created } => {
                    let walked = self.watch_tree(&name, created);
                    self.change(name, FileChange::Create);
                    for entry in walked.found {
                        self.found(entry);
                    }
                    if walked.partial {
                        // Beyond a bound: that part of the tree goes unreported.
                        self.out.overflow();
                    }
                }
                Step::Unwatch(wds) => wds.iter().for_each(|wd| self.ino.rm_watch(*wd)),
                Step::End => return false,
            }
        }
        true
    }
}

/// The error for a failure to place the watch on the root.
fn root_error(root: &Path, e: &io::Error) -> ApiError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => ApiError::new(
            ErrorCode::TooManyRequests,
            "the guest kernel's limit on inotify watches is reached",
        ),
        Some(libc::EMFILE) => ApiError::new(
            ErrorCode::TooManyRequests,
            "the guest kernel's limit on inotify instances is reached",
        ),
        _ => ApiError::io("watch", root, e),
    }
}

/// Places the watches: the root, and with `recursive` its whole tree.
fn setup(spec: &WatchSpec, out: Emitter) -> Result<Watcher, ApiError> {
    let root = &spec.root;
    ops::require_dir("watch", root)?;
    let ino = Inotify::new().map_err(|e| root_error(root, &e))?;
    let root_wd = ino
        .add_watch(root, WATCH_MASK)
        .map_err(|e| root_error(root, &e))?;
    let mut w = Watcher {
        root: root.clone(),
        ino,
        tracker: Tracker::new(root_wd, spec.recursive),
        out,
    };
    if spec.recursive {
        let subdirs: Vec<String> = fs::read_dir(root)
            .map_err(|e| ApiError::io("watch", root, &e))?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        for sub in subdirs {
            if w.watch_tree(&sub, false).partial {
                return Err(ApiError::new(
                    ErrorCode::TooManyRequests,
                    format!(
                        "{} holds more than {MAX_WATCHED_DIRS} directories: too many to watch",
                        root.display()
                    ),
                ));
            }
        }
    }
    Ok(w)
}

/// Waits until inotify has records (true) or `timeout` passes (false); `None` when the
/// reader went away or polling failed.
fn wait(ino: &Inotify, cancel: &OwnedFd, timeout: Option<Duration>) -> Option<bool> {
    let mut fds = [
        libc::pollfd {
            fd: ino.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: cancel.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
    loop {
        // SAFETY: fds is a valid array of two pollfd structures.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if n >= 0 {
            break;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return None;
        }
    }
    if fds[1].revents != 0 {
        return None;
    }
    Some(fds[0].revents != 0)
}

/// The watch thread.
fn run(
    spec: WatchSpec,
    tx: mpsc::Sender<WatchEvent>,
    cancel: &OwnedFd,
    ready: oneshot::Sender<Result<(), ApiError>>,
) {
    let _guard = match FsUserGuard::act_as(&spec.user) {
        Ok(g) => g,
        Err(e) => {
            let _ = ready.send(Err(ApiError::internal(format!(
                "act as {}: {e}",
                spec.user.name
            ))));
            return;
        }
    };
    let out = Emitter {
        tx,
        next_seq: 1,
        owes_overflow: false,
    };
    let mut w = match setup(&spec, out) {
        Ok(w) => w,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    w.out.emit(|seq| WatchEvent::Started { seq });
    if ready.send(Ok(())).is_err() {
        return;
    }
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let timeout = w.tracker.awaiting_move().then_some(MOVE_PAIR_WAIT);
        let Some(readable) = wait(&w.ino, cancel, timeout) else {
            return;
        };
        if w.out.tx.is_closed() {
            return;
        }
        let mut steps = Vec::new();
        if !readable {
            w.tracker.settle(&mut steps);
        } else {
            let n = match w.ino.read(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, root = %spec.root.display(), "reading inotify failed; ending the watch");
                    return;
                }
            };
            for ev in inotify::parse(&buf[..n]) {
                w.tracker.event(&ev, &mut steps);
            }
        }
        if !w.apply(steps) {
            return;
        }
    }
}

//! QMP over the VM's control socket, with the `qapi` crate: connect (retrying while QEMU
//! starts), negotiate, read events in a task (which also delivers command replies), and run
//! commands with a timeout.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use qapi::futures::{QapiEvents, QapiService, QmpStreamTokio};
use qapi::{qmp, Enum};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::VmmError;

/// Bound on any single QMP command; QEMU's main loop answers in milliseconds even under TCG.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between connection attempts while QEMU creates its sockets.
const CONNECT_RETRY: Duration = Duration::from_millis(20);

type QmpRead = QmpStreamTokio<ReadHalf<UnixStream>>;
type QmpWrite = QmpStreamTokio<WriteHalf<UnixStream>>;
pub(crate) type QmpEventStream = QapiEvents<QmpRead>;

/// What the last QMP `SHUTDOWN` event said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShutdownSeen {
    /// True when the guest asked for it (poweroff, reboot, panic).
    pub guest: bool,
    /// QEMU's `ShutdownCause`, e.g. `guest-shutdown`, `host-qmp-quit`.
    pub reason: String,
}

/// When the vCPUs last stopped and started, by QEMU's event timestamps.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RunChanges {
    pub stopped: Option<Duration>,
    pub resumed: Option<Duration>,
}

/// State the event task shares with the VM: the SHUTDOWN seen, and whether QMP has closed.
#[derive(Debug)]
pub(crate) struct QmpState {
    shutdown: Mutex<Option<ShutdownSeen>>,
    /// QEMU's timestamps of the last STOP and RESUME events (vCPUs stopped, started).
    run_changes: Mutex<RunChanges>,
    closed: watch::Sender<bool>,
}

impl QmpState {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(QmpState {
            shutdown: Mutex::new(None),
            run_changes: Mutex::new(RunChanges::default()),
            closed: watch::channel(false).0,
        })
    }

    pub(crate) fn shutdown(&self) -> Option<ShutdownSeen> {
        match self.shutdown.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(crate) fn run_changes(&self) -> RunChanges {
        *self.run_changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record_run_change(&self, stopped: bool, at: Option<Duration>) {
        let mut g = self.run_changes.lock().unwrap_or_else(|p| p.into_inner());
        if stopped {
            g.stopped = at;
        } else {
            g.resumed = at;
        }
    }

    fn set_shutdown(&self, seen: ShutdownSeen) {
        match self.shutdown.lock() {
            Ok(mut g) => *g = Some(seen),
            Err(poisoned) => *poisoned.into_inner() = Some(seen),
        }
    }

    /// Resolves once the event task has seen the end of the QMP stream.
    pub(crate) async fn wait_closed(&self) {
        let mut rx = self.closed.subscribe();
        // An error means the sender is gone, which also means nothing more will be read.
        let _ = rx.wait_for(|closed| *closed).await;
    }
}

/// A negotiated QMP session (command side). Replies arrive only while the event task runs.
pub(crate) struct Qmp {
    vm: String,
    service: QapiService<QmpWrite>,
    /// A second descriptor of the QMP socket, for sending descriptors (`SCM_RIGHTS`), which
    /// the `qapi` stream cannot.
    socket: OwnedFd,
    /// One descriptor in flight at a time: QEMU keeps the last one received until a `getfd`
    /// takes it.
    passing: tokio::sync::Mutex<()>,
    /// Set when a command failed to be written or went unanswered: `qapi` then still holds
    /// that command's slot, and panics on the next command (without out-of-band support
    /// every command has id 0). Nothing more is sent on a broken connection.
    broken: std::sync::atomic::AtomicBool,
}

impl Qmp {
    /// Connects to `path`, retrying while the socket does not exist or refuses (QEMU still
    /// starting) as long as `alive()` says the process runs, until `deadline`.
    pub(crate) async fn connect(
        vm: &str,
        path: &Path,
        deadline: Instant,
        alive: impl Fn() -> bool,
    ) -> Result<(Qmp, QmpEventStream), VmmError> {
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                    ) =>
                {
                    if !alive() {
                        return Err(VmmError::Exited(
                            "QEMU exited before its QMP socket answered".into(),
                        ));
                    }
                    if Instant::now() >= deadline {
                        return Err(VmmError::Timeout(format!(
                            "QMP socket {} did not accept a connection",
                            path.display()
                        )));
                    }
                    tokio::time::sleep(CONNECT_RETRY).await;
                }
                Err(e) => {
                    return Err(VmmError::io(
                        format!("connect to QMP socket {}", path.display()),
                        e,
                    ))
                }
            }
        };
        let socket = stream
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| VmmError::io("duplicate the QMP socket", e))?;
        let (read, write) = tokio::io::split(stream);
        let handshake = async {
            let negotiation = QmpStreamTokio::open_split(read, write).await?;
            negotiation.negotiate().await
        };
        // QEMU serves one QMP client at a time: a greeting that never comes usually means
        // another client (e.g. a leftover process) still holds the monitor.
        let stream = tokio::time::timeout_at(deadline, handshake)
            .await
            .map_err(|_| {
                VmmError::Timeout(format!(
                    "no QMP greeting on {} (is another client connected?)",
                    path.display()
                ))
            })?
            .map_err(|e| VmmError::Qmp(format!("handshake on {}: {e}", path.display())))?;
        let (service, events) = stream.into_parts();
        Ok((
            Qmp {
                vm: vm.to_owned(),
                service,
                socket,
                passing: tokio::sync::Mutex::new(()),
                broken: std::sync::atomic::AtomicBool::new(false),
            },
            events,
        ))
    }

    /// Runs one command with [`COMMAND_TIMEOUT`].
    pub(crate) async fn execute<C>(&self, command: C) -> Result<C::Ok, VmmError>
    where
        C: qmp::QmpCommand,
    {
        use std::sync::atomic::Ordering;
        if self.broken.load(Ordering::SeqCst) {
            return Err(VmmError::Qmp(format!(
                "{} on VM {}: its QMP connection broke earlier",
                C::NAME,
                self.vm
            )));
        }
        match tokio::time::timeout(COMMAND_TIMEOUT, self.service.execute(command)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if matches!(e, qapi::ExecuteError::Io(_)) {
                    self.broken.store(true, Ordering::SeqCst);
                }
                Err(VmmError::Qmp(format!("{} on VM {}: {e}", C::NAME, self.vm)))
            }
            Err(_) => {
                self.broken.store(true, Ordering::SeqCst);
                Err(VmmError::Timeout(format!(
                    "QMP {} on VM {} did not answer within {COMMAND_TIMEOUT:?}",
                    C::NAME,
                    self.vm
                )))
            }
        }
    }
}

impl Qmp {
    /// Hands QEMU an open descriptor under `name` (QMP `getfd`), for a later `fd:name` URI.
    /// A jailed QEMU can open no file of ours and run no program, so migration streams
    /// reach it this way.
    pub(crate) async fn pass_fd(&self, name: &str, fd: BorrowedFd<'_>) -> Result<(), VmmError> {
        let _one = self.passing.lock().await;
        // QEMU takes descriptors from whatever bytes they come with; a space is ignored by
        // its JSON parser.
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let sent = nix::sys::socket::sendmsg::<()>(
                self.socket.as_raw_fd(),
                &[std::io::IoSlice::new(b" ")],
                &[nix::sys::socket::ControlMessage::ScmRights(&[
                    fd.as_raw_fd()
                ])],
                nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                None,
            );
            match sent {
                Ok(_) => break,
                Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(1)).await
                }
                Err(e) => {
                    return Err(VmmError::io(
                        format!("pass a descriptor to VM {}", self.vm),
                        e.into(),
                    ))
                }
            }
        }
        self.execute(qmp::getfd {
            fdname: name.to_owned(),
        })
        .await
        .map(drop)
    }
}

/// Reads QMP until EOF: logs events, records SHUTDOWN, and (inside `qapi`) routes replies.
pub(crate) async fn run_events(vm: String, events: QmpEventStream, state: Arc<QmpState>) {
    let mut events = Box::pin(events);
    while let Some(item) = events.next().await {
        match item {
            Ok(event) => on_event(&vm, &state, event),
            // QEMU exiting with our last command unread shows up as a reset: a normal close.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                tracing::debug!(vm = %vm, "QMP connection reset")
            }
            // The codec stops after a decode error; the loop then ends with the stream.
            Err(e) => tracing::warn!(vm = %vm, error = %e, "QMP stream error"),
        }
    }
    tracing::debug!(vm = %vm, "QMP connection closed");
    state.closed.send_replace(true);
}

fn on_event(vm: &str, state: &QmpState, event: qmp::Event) {
    match event {
        qmp::Event::SHUTDOWN { data, .. } => {
            tracing::info!(vm = %vm, guest = data.guest, reason = data.reason.name(), "QMP event SHUTDOWN");
            state.set_shutdown(ShutdownSeen {
                guest: data.guest,
                reason: data.reason.name().to_owned(),
            });
        }
        qmp::Event::RESET { data, .. } => {
            tracing::info!(vm = %vm, guest = data.guest, reason = data.reason.name(), "QMP event RESET");
        }
        qmp::Event::GUEST_PANICKED { data, .. } => {
            tracing::warn!(vm = %vm, ?data, "QMP event GUEST_PANICKED");
        }
        qmp::Event::STOP { timestamp, .. } => {
            tracing::debug!(vm = %vm, "QMP event STOP");
            state.record_run_change(true, since_epoch(&timestamp));
        }
        qmp::Event::RESUME { timestamp, .. } => {
            tracing::debug!(vm = %vm, "QMP event RESUME");
            state.record_run_change(false, since_epoch(&timestamp));
        }
        other => tracing::debug!(vm = %vm, event = ?other, "QMP event"),
    }
}

/// `qapi` keeps the fields of an event timestamp private; they serialise as
/// `{"seconds": s, "microseconds": us}`.
fn since_epoch(ts: &qapi::Timestamp) -> Option<Duration> {
    let v = serde_json::to_value(ts).ok()?;
    let secs = v.get("seconds")?.as_u64()?;
    let micros = v.get("microseconds")?.as_u64()?;
    Some(Duration::from_secs(secs) + Duration::from_micros(micros))
}

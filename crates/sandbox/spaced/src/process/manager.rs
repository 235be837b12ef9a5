//! The table of processes: start, look up, signal, resize, stdin, output streams, eviction.
//!
//! Each process owns a bounded replay buffer that its output is always drained into, so a
//! process never blocks on a slow or absent reader. Readers follow the buffer by sequence
//! number and are woken through a watch channel. Finished processes are kept (bounded) for
//! late readers; running ones are bounded too.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use space_core::process::{
    ExitStatus, OutputEvent, OutputStream, ProcessId, ProcessInfo, PtySize, MAX_OUTPUT_CHUNK,
};
use space_core::ErrorCode;
use space_guest_proto::limits::{
    MAX_FINISHED_PROCESSES, MAX_JSON_BODY, MAX_LISTED_ENV_BYTES, MAX_RUNNING_PROCESSES,
    OUTPUT_REPLAY_BYTES,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::output_buffer::OutputBuffer;
use super::reaper::Reaper;
use super::spawn::{self, SpawnError, SpawnRequest, Spawned};
use crate::error::ApiError;
use crate::fdstream::SharedFd;
use crate::workload::Workload;

/// After the process exits, how long we wait for its output pipes to reach EOF before
/// reporting `exit` (descendants may keep them open; their later output is discarded).
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// Events per chunk of an output stream.
const EVENTS_PER_CHUNK: usize = 16;
/// Byte sent for "close stdin" on a pty (end-of-file at the start of a line).
const PTY_EOF: u8 = 0x04;

/// Where stdin writes go.
#[derive(Debug)]
enum StdinSink {
    Pipe(SharedFd),
    Pty(SharedFd),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The part of a requested environment a listing shows: variables in name order while they
/// fit in [`MAX_LISTED_ENV_BYTES`].
fn listed_env(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut budget = MAX_LISTED_ENV_BYTES;
    env.iter()
        .take_while(|(k, v)| {
            let size = k.len() + v.len();
            let fits = size <= budget;
            budget = budget.saturating_sub(size);
            fits
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// One process.
#[derive(Debug)]
pub struct Proc {
    id: ProcessId,
    pid: u32,
    argv: Vec<String>,
    user: String,
    /// The environment the start asked for (listed; the spawn's is the merged one).
    env: BTreeMap<String, String>,
    cwd: String,
    tag: Option<String>,
    started_at_ms: u64,
    master: Option<SharedFd>,
    output: Mutex<OutputBuffer>,
    seen: watch::Sender<u64>,
    stdin: tokio::sync::Mutex<Option<StdinSink>>,
    exit: Mutex<Option<ExitStatus>>,
}

impl Proc {
    /// Its listing entry.
    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            id: self.id,
            pid: self.pid,
            argv: self.argv.clone(),
            user: self.user.clone(),
            env: listed_env(&self.env),
            cwd: Some(self.cwd.clone()),
            tag: self.tag.clone(),
            pty: self.master.is_some(),
            started_at_ms: self.started_at_ms,
            exit: *lock(&self.exit),
        }
    }

    fn exited(&self) -> bool {
        lock(&self.exit).is_some()
    }

    fn push_data(&self, stream: OutputStream, data: Bytes) {
        let seq = lock(&self.output).push_data(stream, data);
        if let Some(seq) = seq {
            self.seen.send_replace(seq);
        }
    }

    /// Delivers `signal` to the process group.
    pub fn signal(&self, signal: i32) -> Result<(), ApiError> {
        space_core::process::validate_signal(signal)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        if self.exited() {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("process {} has exited", self.id),
            ));
        }
        // SAFETY: kill with a negative pid signals the process group.
        if unsafe { libc::kill(-(self.pid as i32), signal) } < 0 {
            let e = std::io::Error::last_os_error();
            return Err(ApiError::internal(format!(
                "signal process group {}: {e}",
                self.pid
            )));
        }
        Ok(())
    }

    /// Changes the terminal size; 409 if the process has no pty.
    pub fn resize(&self, size: PtySize) -> Result<(), ApiError> {
        size.validate()
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        let Some(master) = &self.master else {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("process {} does not run on a pty", self.id),
            ));
        };
        super::pty::set_size(&master.raw(), size)
            .map_err(|e| ApiError::internal(format!("resize pty: {e}")))
    }

    /// Writes a chunk to stdin, waiting while the pipe is full.
    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), ApiError> {
        let guard = self.stdin.lock().await;
        let sink = match guard.as_ref() {
            Some(StdinSink::Pipe(fd)) | Some(StdinSink::Pty(fd)) => fd,
            None => return Err(self.stdin_closed()),
        };
        sink.write_all(data).await.map_err(|e| {
            if e.raw_os_error() == Some(libc::EPIPE) || e.raw_os_error() == Some(libc::EIO) {
                self.stdin_closed()
            } else {
                ApiError::internal(format!("write stdin: {e}"))
            }
        })
    }

    /// Closes stdin (a pipe is closed; a pty gets an end-of-file character).
    pub async fn close_stdin(&self) -> Result<(), ApiError> {
        let mut guard = self.stdin.lock().await;
        match guard.as_ref() {
            Some(StdinSink::Pipe(_)) => {
                guard.take();
                Ok(())
            }
            Some(StdinSink::Pty(fd)) => fd
                .write_all(&[PTY_EOF])
                .await
                .map_err(|_| self.stdin_closed()),
            None => Ok(()),
        }
    }

    /// Whether the process accepts stdin at all.
    pub async fn has_stdin(&self) -> bool {
        self.stdin.lock().await.is_some()
    }

    fn stdin_closed(&self) -> ApiError {
        ApiError::new(
            ErrorCode::Conflict,
            format!(
                "stdin of process {} is not open (started without stdin, closed, or exited)",
                self.id
            ),
        )
    }

    /// NDJSON output events from now on: `started` first, then only events produced after
    /// this call (for an exited process, `started` then its `exit`).
    pub fn live_stream(
        self: Arc<Self>,
    ) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
        let after = lock(&self.output).live_after();
        let started = OutputEvent::Started {
            seq: 1,
            id: self.id,
            pid: self.pid,
        };
        let mut line = serde_json::to_vec(&started).unwrap_or_default();
        line.push(b'\n');
        futures::stream::once(async move { Ok(Bytes::from(line)) }).chain(self.output_stream(after))
    }

    /// NDJSON output events with `seq > after`, following live output until `exit`.
    pub fn output_stream(
        self: Arc<Self>,
        after: u64,
    ) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
        let rx = self.seen.subscribe();
        futures::stream::unfold(Some((self, after, rx)), |state| async move {
            let (proc, mut after, mut rx) = state?;
            loop {
                rx.borrow_and_update();
                let read = lock(&proc.output).read_after(after, EVENTS_PER_CHUNK);
                if read.events.is_empty() && read.finished {
                    return None;
                }
                if let Some(last) = read.events.last() {
                    after = last.seq();
                    let mut chunk = Vec::new();
                    for ev in &read.events {
                        if serde_json::to_writer(&mut chunk, ev).is_ok() {
                            chunk.push(b'\n');
                        }
                    }
                    let next = (!read.finished).then_some((proc, after, rx));
                    return Some((Ok(Bytes::from(chunk)), next));
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
    }
}

#[derive(Debug, Default)]
struct Table {
    procs: BTreeMap<ProcessId, Arc<Proc>>,
    finished: VecDeque<ProcessId>,
    running: usize,
}

/// All processes of this boot.
#[derive(Debug)]
pub struct ProcessManager {
    next_id: AtomicU64,
    table: Mutex<Table>,
    reaper: Arc<Reaper>,
    workload: Arc<Workload>,
}

/// What to start, resolved by the API layer.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The spawn parameters.
    pub spawn: SpawnRequest,
    /// Kill after this long.
    pub timeout: Option<Duration>,
    /// Label.
    pub tag: Option<String>,
    /// The environment the start asked for, as listed.
    pub requested_env: BTreeMap<String, String>,
}

impl ProcessManager {
    /// An empty table; `reaper` must already be started. Processes start in `workload`.
    pub fn new(reaper: Arc<Reaper>, workload: Arc<Workload>) -> Arc<Self> {
        Arc::new(ProcessManager {
            next_id: AtomicU64::new(1),
            table: Mutex::new(Table::default()),
            reaper,
            workload,
        })
    }

    /// Processes currently running.
    pub fn running(&self) -> usize {
        lock(&self.table).running
    }

    /// Looks a process up; 404 when unknown or evicted.
    pub fn get(&self, id: ProcessId) -> Result<Arc<Proc>, ApiError> {
        lock(&self.table)
            .procs
            .get(&id)
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no process {id}")))
    }

    /// Kept processes, by id. The listing stays within `MAX_JSON_BODY` (the host refuses
    /// larger bodies): running processes come first, then finished ones newest first; what
    /// does not fit is left out (still reachable by id).
    pub fn list(&self) -> Vec<ProcessInfo> {
        let procs: Vec<Arc<Proc>> = lock(&self.table).procs.values().cloned().collect();
        let mut infos: Vec<ProcessInfo> = procs.iter().map(|p| p.info()).collect();
        infos.sort_by_key(|i| (i.exit.is_some(), std::cmp::Reverse(i.id)));
        let mut budget = MAX_JSON_BODY.saturating_sub(64);
        infos.retain(|i| {
            let size = serde_json::to_vec(i).map_or(usize::MAX, |v| v.len() + 1);
            if size <= budget {
                budget -= size;
                true
            } else {
                false
            }
        });
        infos.sort_by_key(|i| i.id);
        infos
    }

    /// Kills every running process group (daemon shutdown).
    pub fn kill_all(&self) {
        for p in lock(&self.table).procs.values() {
            if !p.exited() {
                // SAFETY: signal a process group.
                unsafe { libc::kill(-(p.pid as i32), libc::SIGKILL) };
            }
        }
    }

    /// Starts a process. Returns its listing entry.
    pub async fn start(self: &Arc<Self>, req: StartRequest) -> Result<ProcessInfo, ApiError> {
        {
            let mut t = lock(&self.table);
            if t.running >= MAX_RUNNING_PROCESSES {
                return Err(ApiError::new(
                    ErrorCode::TooManyRequests,
                    format!("at most {MAX_RUNNING_PROCESSES} processes may run at once"),
                ));
            }
            t.running += 1;
        }
        let argv = req.spawn.argv.clone();
        let user = req.spawn.user.name.clone();
        let cwd = req.spawn.cwd.display().to_string();
        let reaper = self.reaper.clone();
        let workload = self.workload.clone();
        let spawned = tokio::task::spawn_blocking(move || {
            // Held until the child is in the workload cgroup and has exec'd.
            let _permit = workload.spawn_permit().ok_or(SpawnError::WorkloadFrozen)?;
            spawn::spawn(req.spawn, &reaper, workload.procs_fd())
        })
        .await;
        let spawned = match spawned {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e @ SpawnError::Exec { .. })) => {
                Err(ApiError::new(ErrorCode::ExecFailed, e.to_string()))
            }
            Ok(Err(e @ SpawnError::WorkloadFrozen)) => {
                Err(ApiError::new(ErrorCode::Conflict, e.to_string()))
            }
            Ok(Err(e)) => Err(ApiError::internal(e.to_string())),
            Err(e) => Err(ApiError::from(e)),
        };
        let spawned = match spawned {
            Ok(s) => s,
            Err(e) => {
                let mut t = lock(&self.table);
                t.running = t.running.saturating_sub(1);
                return Err(e);
            }
        };
        let Spawned {
            pid,
            stdin,
            stdout,
            stderr,
            pty_master,
            exit,
        } = spawned;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);

        // Registering descriptors with the reactor cannot fail for pipes and ptys in
        // practice; if it does, the process still runs and is reaped, just without output.
        let reg = |fd: Option<OwnedFd>| {
            fd.and_then(|fd| {
                SharedFd::new(fd)
                    .map_err(|e| tracing::warn!(error = %e, "register fd"))
                    .ok()
            })
        };
        let master = reg(pty_master);
        let stdin_sink = match (&master, reg(stdin)) {
            (Some(m), _) => Some(StdinSink::Pty(m.clone())),
            (None, Some(p)) => Some(StdinSink::Pipe(p)),
            (None, None) => None,
        };
        let mut buffer = OutputBuffer::new(OUTPUT_REPLAY_BYTES);
        let first = buffer.push_started(id, pid);
        let proc = Arc::new(Proc {
            id,
            pid,
            argv,
            user,
            env: req.requested_env,
            cwd,
            tag: req.tag,
            started_at_ms: now_ms(),
            master: master.clone(),
            output: Mutex::new(buffer),
            seen: watch::Sender::new(first),
            stdin: tokio::sync::Mutex::new(stdin_sink),
            exit: Mutex::new(None),
        });
        lock(&self.table).procs.insert(id, proc.clone());

        let mut drains = Vec::new();
        if let Some(m) = master {
            drains.push(drain(proc.clone(), m, OutputStream::Pty));
        }
        for (fd, stream) in [
            (stdout, OutputStream::Stdout),
            (stderr, OutputStream::Stderr),
        ] {
            if let Some(fd) = reg(fd) {
                drains.push(drain(proc.clone(), fd, stream));
            }
        }
        let info = proc.info();
        tokio::spawn(self.clone().supervise(proc, exit, req.timeout, drains));
        Ok(info)
    }

    /// Waits for the exit (killing the group on timeout), lets output drain, records `exit`.
    async fn supervise(
        self: Arc<Self>,
        proc: Arc<Proc>,
        mut exit: tokio::sync::oneshot::Receiver<ExitStatus>,
        timeout: Option<Duration>,
        drains: Vec<JoinHandle<()>>,
    ) {
        let mut timed_out = false;
        let status = match timeout {
            Some(t) => tokio::select! {
                s = &mut exit => s,
                _ = tokio::time::sleep(t) => {
                    timed_out = true;
                    // SAFETY: signal the process group.
                    unsafe { libc::kill(-(proc.pid as i32), libc::SIGKILL) };
                    exit.await
                }
            },
            None => exit.await,
        };
        // The reaper never drops a registered sender, so Err is impossible; report it plainly.
        let mut status = status.unwrap_or(ExitStatus {
            exit_code: None,
            signal: None,
            timed_out: false,
        });
        status.timed_out = timed_out;
        let _ = tokio::time::timeout(DRAIN_GRACE, futures::future::join_all(drains)).await;

        let seq = lock(&proc.output).push_exit(status);
        *lock(&proc.exit) = Some(status);
        // Drop the stdin pipe so later writers fail fast. A writer still blocked on it (a
        // descendant holds the pipe and does not read) keeps it; we never wait for it.
        if let Ok(mut sink) = proc.stdin.try_lock() {
            if matches!(*sink, Some(StdinSink::Pipe(_))) {
                sink.take();
            }
        }
        if let Some(seq) = seq {
            proc.seen.send_replace(seq);
        }
        let mut t = lock(&self.table);
        t.running = t.running.saturating_sub(1);
        t.finished.push_back(proc.id);
        while t.finished.len() > MAX_FINISHED_PROCESSES {
            if let Some(old) = t.finished.pop_front() {
                t.procs.remove(&old);
            }
        }
    }
}

/// Copies one output descriptor into the replay buffer until EOF. Keeps reading (and
/// discarding) after `exit` so descendants that inherited it never get SIGPIPE.
fn drain(proc: Arc<Proc>, fd: SharedFd, stream: OutputStream) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_OUTPUT_CHUNK];
        loop {
            match fd.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => proc.push_data(stream, Bytes::copy_from_slice(&buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // EIO: the pty's last slave descriptor was closed.
                Err(_) => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_show_a_bounded_environment() {
        let small: BTreeMap<String, String> = [("A".into(), "1".into())].into();
        assert_eq!(listed_env(&small), small);
        let big: BTreeMap<String, String> = (0..10)
            .map(|i| (format!("V{i}"), "x".repeat(MAX_LISTED_ENV_BYTES / 4)))
            .collect();
        let listed = listed_env(&big);
        assert!(listed.len() < big.len() && !listed.is_empty());
        let bytes: usize = listed.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes <= MAX_LISTED_ENV_BYTES);
    }
}

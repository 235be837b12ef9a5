//! `spaced agent`: sets up the runtime and serves the channel.

use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use space_guest_proto::limits::{MAX_PORT_CONNECTIONS, MAX_WATCH_STREAMS};
use tokio::sync::Semaphore;
use tracing_subscriber::EnvFilter;

use crate::channel::{self, ChannelSpec};
use crate::fsfreeze::FsFreezer;
use crate::process::reaper::Reaper;
use crate::process::ProcessManager;
use crate::state::{AppState, RuntimeConfig, INITIAL_DEFAULT_USER};
use crate::workload::Workload;

/// Log lines queued for the console before new ones are dropped.
const LOG_QUEUE_LINES: usize = 1024;

/// Entry point of `spaced agent`.
pub fn run(spec: ChannelSpec) -> ExitCode {
    let filter = EnvFilter::try_from_env("SPACED_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Logs go to the serial console through a bounded queue and a thread of their own, lines
    // dropped when it is full: a console write can block for good (after a restore the
    // emulated UART may never raise its transmit interrupt again, and the tty buffer fills),
    // and a log line must never stall a session.
    let (console, _console_guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("spaced-log")
        .finish(std::io::stderr());
    // Plain text: the console ends up in a log file on the host.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(console)
        .with_target(false)
        .with_ansi(false)
        .init();

    // SAFETY: umask, prctl and sigprocmask on a local empty set have no memory-safety
    // preconditions.
    unsafe {
        // Start from an empty signal mask whatever our parent blocked (init blocks SIGCHLD
        // for sigwait, and the mask survives fork and exec): a blocked SIGCHLD here would
        // leave every finished process a zombie that never reports its exit.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::umask(0o022);
        // Orphans of the processes we start are reparented to us and reaped by the reaper,
        // so they never linger as zombies whatever runs as PID 1.
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot become a child subreaper");
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(spec)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "agent failed");
            ExitCode::FAILURE
        }
    }
}

async fn serve(spec: ChannelSpec) -> anyhow::Result<()> {
    let reaper = Arc::new(Reaper::default());
    reaper.clone().start()?;
    let host_safe = matches!(spec, ChannelSpec::Unix(_));
    let workload = Arc::new(Workload::setup(host_safe));
    let state = Arc::new(AppState {
        boot_id: hex::encode(rand::random::<[u8; 16]>()),
        started: Instant::now(),
        host_safe,
        config: RwLock::new(RuntimeConfig {
            env: Default::default(),
            default_user: INITIAL_DEFAULT_USER.to_owned(),
            default_workdir: None,
        }),
        processes: ProcessManager::new(reaper, workload.clone()),
        workload,
        freezer: Arc::new(FsFreezer::default()),
        api_requests: AtomicU64::new(0),
        watches: Arc::new(Semaphore::new(MAX_WATCH_STREAMS)),
        port_connections: Arc::new(Semaphore::new(MAX_PORT_CONNECTIONS)),
    });
    let chan = tokio::task::block_in_place(|| channel::open(&spec))?;
    tracing::info!(version = crate::api::DAEMON_VERSION, boot_id = %state.boot_id, channel = %spec, "spaced agent started");
    let router = crate::api::router(state.clone());

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    tokio::select! {
        res = crate::session::serve(chan, state.clone(), router) => res?,
        _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
        _ = sigint.recv() => tracing::info!("SIGINT: stopping"),
    }
    // Never leave the disks frozen behind us (power-off would hang in its final sync).
    if let Err(e) = state.freezer.thaw().await {
        tracing::warn!(error = %e, "cannot thaw the file systems");
    }
    state.processes.kill_all();
    if let ChannelSpec::Unix(path) = &spec {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

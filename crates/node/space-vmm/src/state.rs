//! Saving and restoring VM state with QEMU migration to and from a file.
//!
//! A save streams device state (and guest RAM, unless it lives in a shared memory file and
//! `x-ignore-shared` is on) into a file the node opens and hands QEMU over QMP (`getfd`, then
//! an `fd:` URI): QEMU 7.2 has no `file:` URI, and a jailed QEMU can neither open our files
//! nor run `exec:cat` (its seccomp filter forbids spawning).
//! A live save copies RAM while the guest runs and pauses it only for the final pass, so the
//! guest-visible pause is milliseconds even when RAM is large. When a save completes QEMU
//! leaves the VM paused, which lets the caller snapshot the disk at the same instant before
//! resuming it.
//!
//! A save writes to any descriptor QEMU can write a stream to: a file, or a pipe whose
//! reader seals what comes through under a tenant's data key (the sandbox manager's
//! checkpoints); nothing here knows which.
//!
//! A restore starts QEMU with `-incoming defer` and feeds a readable descriptor (a file, or
//! a pipe a sealed state is opened into) with `migrate-incoming` (see [`restore`]); the VM
//! is left paused for its launcher to check what fed it and resume it.

use std::time::Duration;

use qapi::{qmp, Enum};
use tokio::time::Instant;

use crate::error::VmmError;
use crate::qmp::Qmp;

/// How often migration progress is polled. A save of a small device state completes in
/// ~10 ms, so this is the resolution of every save and restore.
const POLL: Duration = Duration::from_millis(3);
/// No bandwidth cap: the destination is a local file. QEMU's default (128 MiB/s) would make
/// a save of 100 MiB of RAM take most of a second.
const MAX_BANDWIDTH_BYTES_PER_SEC: u64 = 64 << 30;

/// How to save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveOptions {
    /// Leave RAM that lives in a shared memory file out of the state (`x-ignore-shared`).
    pub ignore_shared: bool,
    /// Copy RAM while the guest runs; pause only for the final pass. Without it the VM is
    /// paused before the save starts.
    pub live: bool,
    /// Longest pause the final pass of a live save may cause (QEMU's `downtime-limit`).
    pub max_downtime: Duration,
    /// The whole save must finish within this; otherwise it is cancelled.
    pub timeout: Duration,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            ignore_shared: false,
            live: true,
            max_downtime: Duration::from_millis(100),
            timeout: Duration::from_secs(120),
        }
    }
}

/// What a completed save measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveReport {
    /// From the start of the save until QEMU reported completion.
    pub duration: Duration,
    /// QEMU's own measure of how long the guest was stopped for the final pass (live saves).
    pub downtime: Option<Duration>,
    /// Bytes QEMU wrote, by its own count.
    pub bytes: u64,
}

/// Descriptor names of the two directions of a state transfer.
const SAVE_FD: &str = "state-save";
const RESTORE_FD: &str = "state-restore";

async fn set_capabilities(qmp: &Qmp, ignore_shared: bool) -> Result<(), VmmError> {
    qmp.execute(qmp::migrate_set_capabilities {
        capabilities: vec![qmp::MigrationCapabilityStatus {
            capability: qmp::MigrationCapability::x_ignore_shared,
            state: ignore_shared,
        }],
    })
    .await?;
    Ok(())
}

/// Polls `query-migrate` until the migration completed, failed, or `deadline` passed.
async fn wait_migration(qmp: &Qmp, deadline: Instant) -> Result<qmp::MigrationInfo, VmmError> {
    loop {
        let info = qmp.execute(qmp::query_migrate {}).await?;
        match info.status {
            Some(qmp::MigrationStatus::completed) => return Ok(info),
            Some(s @ (qmp::MigrationStatus::failed | qmp::MigrationStatus::cancelled)) => {
                return Err(VmmError::Migration(format!(
                    "{}: {}",
                    s.name(),
                    info.error_desc.as_deref().unwrap_or("no detail from QEMU")
                )))
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(VmmError::Timeout(
                "VM state transfer did not complete in time".into(),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Saves the VM's state into `out` (see the module docs). On success the VM is paused
/// (QEMU's `postmigrate`); the caller resumes it. On failure the VM is running again, as it
/// was.
pub(crate) async fn save(
    qmp: &Qmp,
    out: std::os::fd::BorrowedFd<'_>,
    opts: SaveOptions,
) -> Result<SaveReport, VmmError> {
    let started = std::time::Instant::now();
    qmp.pass_fd(SAVE_FD, out).await?;
    let uri = format!("fd:{SAVE_FD}");
    set_capabilities(qmp, opts.ignore_shared).await?;
    qmp.execute(qmp::migrate_set_parameters(qmp::MigrateSetParameters {
        downtime_limit: Some(opts.max_downtime.as_millis().max(1) as u64),
        max_bandwidth: Some(MAX_BANDWIDTH_BYTES_PER_SEC),
        ..Default::default()
    }))
    .await?;
    if !opts.live {
        qmp.execute(qmp::stop {}).await?;
    }
    let outcome = async {
        qmp.execute(qmp::migrate {
            uri: Some(uri),
            channels: None,
            detach: None,
            resume: None,
        })
        .await?;
        wait_migration(qmp, Instant::now() + opts.timeout).await
    }
    .await;
    match outcome {
        Ok(info) => Ok(SaveReport {
            duration: started.elapsed(),
            downtime: info
                .downtime
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis),
            bytes: info
                .ram
                .and_then(|ram| u64::try_from(ram.transferred).ok())
                .unwrap_or(0),
        }),
        Err(e) => {
            // Whatever happened, the VM must come out of this running as it went in.
            if let Err(cancel) = qmp.execute(qmp::migrate_cancel {}).await {
                tracing::warn!(error = %cancel, "cannot cancel failed VM state save");
            }
            if let Err(cont) = qmp.execute(qmp::cont {}).await {
                tracing::warn!(error = %cont, "cannot resume VM after failed state save");
            }
            Err(e)
        }
    }
}

/// Cancels a save that may still be running (one started by a node process that died) and
/// waits until QEMU says it is over. The VM may be left paused; the caller resumes it.
pub(crate) async fn cancel(qmp: &Qmp) -> Result<(), VmmError> {
    qmp.execute(qmp::migrate_cancel {}).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = qmp.execute(qmp::query_migrate {}).await?;
        match info.status {
            None
            | Some(
                qmp::MigrationStatus::none
                | qmp::MigrationStatus::cancelled
                | qmp::MigrationStatus::completed
                | qmp::MigrationStatus::failed,
            ) => return Ok(()),
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(VmmError::Timeout("cancelling a VM state save".into()));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Feeds a saved state from `state` into a QEMU started with `-incoming defer`. Leaves the
/// VM paused.
pub(crate) async fn restore(
    qmp: &Qmp,
    state: std::os::fd::BorrowedFd<'_>,
    ignore_shared: bool,
    deadline: Instant,
) -> Result<(), VmmError> {
    set_capabilities(qmp, ignore_shared).await?;
    qmp.pass_fd(RESTORE_FD, state).await?;
    let uri = format!("fd:{RESTORE_FD}");
    qmp.execute(qmp::migrate_incoming {
        uri: Some(uri),
        channels: None,
        exit_on_error: None,
    })
    .await?;
    wait_migration(qmp, deadline).await.map(drop)
}

//! The node's periodic work on running sandboxes: scheduled disk snapshots and checkpoints
//! (each sandbox's `SnapshotSchedule`), their tiered retention, and pausing sandboxes that
//! have been idle longer than their `auto_pause_secs`.
//!
//! Activity comes from the daemon's counters (workload CPU time, disk and network bytes,
//! TCP connections, API requests). A sandbox whose counters did not move is idle; an idle
//! sandbox also gets no new scheduled snapshots (nothing changed since the last one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use space_core::{SandboxId, SandboxState, SnapshotInfo, SnapshotKind, SnapshotTrigger};
use space_guest_proto::Activity;
use space_storage::SnapshotSizes;

use crate::sandbox_manager::now_ms;
use crate::{Node, PauseCause};

/// How often the scheduler looks at every sandbox.
pub const TICK: Duration = Duration::from_secs(5);
/// CPU time below which a sandbox's workload counts as idle over one tick.
const IDLE_CPU_USEC: u64 = 20_000;
/// Disk I/O below which a sandbox counts as idle over one tick (a filesystem freeze for a
/// disk snapshot flushes the journal: ~48 KiB).
const IDLE_DISK_BYTES: u64 = 256 * 1024;

/// What the scheduler remembers about one sandbox between ticks.
#[derive(Debug, Clone, Default)]
struct Seen {
    activity: Option<Activity>,
    /// Last time its counters moved.
    active_at_ms: i64,
    /// Last time counters moved since the last scheduled snapshot of each kind.
    changed_since: HashMap<&'static str, bool>,
}

/// Scheduler state: the last activity sample of every sandbox.
#[derive(Default)]
pub(crate) struct Scheduler {
    seen: Mutex<HashMap<SandboxId, Seen>>,
}

/// Did anything happen between two samples?
pub(crate) fn moved(before: &Activity, after: &Activity) -> bool {
    after.api_requests != before.api_requests
        || after
            .workload_cpu_usec
            .saturating_sub(before.workload_cpu_usec)
            > IDLE_CPU_USEC
        || after.disk_io_bytes.saturating_sub(before.disk_io_bytes) > IDLE_DISK_BYTES
        || after.net_bytes != before.net_bytes
        || after.tcp_connections != before.tcp_connections
        || after.workload_processes != before.workload_processes
}

fn kind_key(kind: SnapshotKind) -> &'static str {
    kind.as_str()
}

impl Node {
    /// Starts the scheduler task.
    pub(crate) fn start_scheduler(&self) {
        let weak = Arc::downgrade(&self.inner);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Node { inner }.schedule_once().await;
            }
        });
        self.inner
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task.abort_handle());
    }

    /// One pass over every running sandbox.
    pub(crate) async fn schedule_once(&self) {
        let running: Vec<_> = self
            .sandboxes()
            .into_iter()
            .filter(|r| r.state == SandboxState::Running)
            .collect();
        let work = running.into_iter().map(|rec| async move {
            let id = rec.id.clone();
            let now = now_ms();
            let activity = match self.guest(&id) {
                Ok(g) => g.activity().await.ok(),
                Err(_) => None,
            };
            let (idle_for_ms, changed) = self.inner.scheduler.observe(&id, activity, now);
            if let Some(secs) = rec.auto_pause_secs {
                if idle_for_ms >= secs.saturating_mul(1000) as i64 {
                    tracing::info!(%id, idle_s = idle_for_ms / 1000, "pausing idle sandbox");
                    if let Err(e) = self.pause_sandbox(&id, PauseCause::Idle).await {
                        tracing::warn!(%id, error = %e, "cannot pause idle sandbox");
                    }
                    return;
                }
            }
            for kind in [SandboxKindOrder::Checkpoint, SandboxKindOrder::Disk] {
                let kind = kind.kind();
                if !changed.get(kind_key(kind)).copied().unwrap_or(true) {
                    continue;
                }
                self.scheduled_snapshot(&id, &rec.snapshots, kind, rec.created_at_ms, now)
                    .await;
            }
        });
        futures::future::join_all(work).await;
        let live: std::collections::HashSet<SandboxId> =
            self.sandboxes().into_iter().map(|r| r.id).collect();
        self.inner.scheduler.forget_except(&live);
    }

    /// Takes a scheduled snapshot of `kind` if one is due, then prunes by retention.
    async fn scheduled_snapshot(
        &self,
        id: &SandboxId,
        schedule: &space_core::SnapshotSchedule,
        kind: SnapshotKind,
        created_at_ms: i64,
        now: i64,
    ) {
        let store = self.inner.store.clone();
        let list = {
            let id = id.clone();
            tokio::task::spawn_blocking(move || store.list_snapshots(&id, SnapshotSizes::Stored))
                .await
        };
        let Ok(Ok(list)) = list else { return };
        let scheduled: Vec<&SnapshotInfo> = list
            .iter()
            .filter(|s| s.kind == kind && s.trigger == SnapshotTrigger::Schedule && !s.persistent)
            .collect();
        // The first one is due one interval after the sandbox was created.
        let last = scheduled
            .iter()
            .map(|s| s.created_at_ms)
            .max()
            .or(Some(created_at_ms));
        if !schedule.due(kind, last, now) {
            return;
        }
        let taken = match kind {
            SnapshotKind::Disk => self
                .snapshot_disk(id, None, SnapshotTrigger::Schedule, None)
                .await
                .map(drop),
            SnapshotKind::Checkpoint => self
                .checkpoint(id, None, SnapshotTrigger::Schedule, None)
                .await
                .map(drop),
        };
        match taken {
            Ok(()) => self.inner.scheduler.snapshot_taken(id, kind),
            Err(e) => {
                tracing::warn!(%id, kind = kind.as_str(), error = %e, "scheduled snapshot failed");
                return;
            }
        }
        self.prune(id, schedule, kind).await;
    }

    /// Deletes scheduled snapshots of `kind` the retention policy no longer keeps.
    async fn prune(
        &self,
        id: &SandboxId,
        schedule: &space_core::SnapshotSchedule,
        kind: SnapshotKind,
    ) {
        let Ok(list) = self.inner.store.list_snapshots(id, SnapshotSizes::Stored) else {
            return;
        };
        let scheduled: Vec<_> = list
            .iter()
            .filter(|s| s.kind == kind && s.trigger == SnapshotTrigger::Schedule && !s.persistent)
            .map(|s| (s.id.clone(), s.created_at_ms))
            .collect();
        let keep = schedule.retention(kind).retain(now_ms(), &scheduled);
        for (snap, _) in scheduled.iter().filter(|(s, _)| !keep.contains(s)) {
            if let Err(e) = self.delete_snapshot(id, snap).await {
                tracing::warn!(%id, snapshot = %snap, error = %e, "cannot prune snapshot");
            }
        }
    }
}

/// Checkpoints first: when both are due, the checkpoint also covers the disk.
#[derive(Clone, Copy)]
enum SandboxKindOrder {
    Checkpoint,
    Disk,
}

impl SandboxKindOrder {
    fn kind(self) -> SnapshotKind {
        match self {
            SandboxKindOrder::Checkpoint => SnapshotKind::Checkpoint,
            SandboxKindOrder::Disk => SnapshotKind::Disk,
        }
    }
}

impl Scheduler {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a sample; returns how long the sandbox has been idle and, per snapshot kind,
    /// whether it changed since the last scheduled snapshot of that kind.
    fn observe(
        &self,
        id: &SandboxId,
        activity: Option<Activity>,
        now: i64,
    ) -> (i64, HashMap<&'static str, bool>) {
        let mut seen = self.lock();
        let s = seen.entry(id.clone()).or_insert_with(|| Seen {
            activity: None,
            active_at_ms: now,
            changed_since: HashMap::new(),
        });
        let moved = match (&s.activity, &activity) {
            (Some(before), Some(after)) => moved(before, after),
            // First sample, or the daemon did not answer: count as active.
            _ => true,
        };
        if moved {
            s.active_at_ms = now;
            for k in [SnapshotKind::Disk, SnapshotKind::Checkpoint] {
                s.changed_since.insert(kind_key(k), true);
            }
        }
        if activity.is_some() {
            s.activity = activity;
        }
        (now - s.active_at_ms, s.changed_since.clone())
    }

    fn snapshot_taken(&self, id: &SandboxId, kind: SnapshotKind) {
        if let Some(s) = self.lock().get_mut(id) {
            s.changed_since.insert(kind_key(kind), false);
        }
    }

    fn forget_except(&self, live: &std::collections::HashSet<SandboxId>) {
        self.lock().retain(|id, _| live.contains(id));
    }

    /// Forgets a sandbox's samples (after a resume its counters restart the idle clock).
    pub(crate) fn reset(&self, id: &SandboxId) {
        self.lock().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(cpu: u64, disk: u64, api: u64) -> Activity {
        Activity {
            workload_processes: 1,
            workload_cpu_usec: cpu,
            disk_io_bytes: disk,
            net_bytes: 0,
            tcp_connections: 0,
            api_requests: api,
        }
    }

    #[test]
    fn idle_means_nothing_moved_beyond_noise() {
        let a = sample(1_000_000, 10 << 20, 5);
        assert!(!moved(&a, &sample(1_005_000, (10 << 20) + 48 * 1024, 5)));
        assert!(moved(&a, &sample(1_100_000, 10 << 20, 5)));
        assert!(moved(&a, &sample(1_000_000, 12 << 20, 5)));
        assert!(moved(&a, &sample(1_000_000, 10 << 20, 6)));
    }

    #[test]
    fn idle_clock_and_change_tracking() {
        let s = Scheduler::default();
        let id = SandboxId::generate();
        let a = sample(0, 0, 0);
        let (idle, changed) = s.observe(&id, Some(a), 1_000);
        assert_eq!(idle, 0);
        assert!(changed["disk"]);
        s.snapshot_taken(&id, SnapshotKind::Disk);
        let (idle, changed) = s.observe(&id, Some(a), 61_000);
        assert_eq!(idle, 60_000);
        assert!(!changed["disk"], "no new disk snapshot of an idle sandbox");
        assert!(changed["checkpoint"]);
        let (idle, changed) = s.observe(&id, Some(sample(0, 0, 1)), 62_000);
        assert_eq!(idle, 0);
        assert!(changed["disk"]);
        // A daemon that does not answer is never taken for idle.
        let (idle, _) = s.observe(&id, None, 90_000);
        assert_eq!(idle, 0);
    }
}

//! Sandboxes that survive a lost node (`on_node_loss: restore`, a cluster with an object
//! store).
//!
//! The leader stores a checkpoint of each such sandbox in object storage every
//! `checkpoint_interval_secs` while it runs (a checkpoint taken on its node, the guest
//! paused only for its final pass, then uploaded while it runs on and committed as the
//! sandbox's `stored_checkpoint`; the one it replaces is collected). When the
//! sandbox's node is declared lost, the sandbox becomes suspended in its last stored
//! checkpoint and is resumed on another node (what it did since that checkpoint is lost);
//! one without a checkpoint yet stays `lost`, as with `fail`. Its old node, if it returns,
//! is reconciled before it serves again: the row no longer names it, so its copy is
//! deleted there.
//!
//! Each sandbox is its own task, one at a time per sandbox, except that a restore does not
//! wait for a checkpoint under way (stuck, maybe, on the node that was lost; it cannot
//! commit once the sandbox is suspended). A job that fails is not tried again for
//! [`RETRY_AFTER`] (a failed checkpoint does not hold a restore back).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use space_core::sandbox::{OnNodeLoss, DEFAULT_STORED_CHECKPOINT_SECS};
use space_core::{SandboxId, SandboxState};

use crate::api::error::ApiResult;
use crate::api::AppState;
use crate::db::{now_ms, SandboxRow};
use crate::scheduler::NodeState;

/// How long a failed checkpoint or restore waits before the next try.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Sandboxes with a checkpoint or restore under way in this process, and those to leave
/// alone until a time (a failure's back-off).
#[derive(Default)]
struct Work {
    in_flight: HashMap<SandboxId, Job>,
    /// Per sandbox and job: a failed checkpoint does not hold a restore back.
    not_before: HashMap<(SandboxId, Job), Instant>,
}

fn work() -> &'static Mutex<Work> {
    // Process-wide: the leader is one process, and a sandbox id names one sandbox
    // whichever test server of a process sees it.
    static WORK: std::sync::OnceLock<Mutex<Work>> = std::sync::OnceLock::new();
    WORK.get_or_init(Default::default)
}

/// Whether `row`'s next stored checkpoint is due at `now_ms`: `checkpoint_interval_secs`
/// after its last one (or after it was created).
pub fn checkpoint_due(row: &SandboxRow, now_ms: i64) -> bool {
    let every_ms = row
        .spec
        .checkpoint_interval_secs
        .unwrap_or(DEFAULT_STORED_CHECKPOINT_SECS)
        .saturating_mul(1000);
    let last = row.stored_checkpoint_at_ms.unwrap_or(row.created_at_ms);
    now_ms.saturating_sub(last) >= i64::try_from(every_ms).unwrap_or(i64::MAX)
}

/// One leader pass: checkpoints that are due, restores of sandboxes whose node is lost.
pub async fn run(st: &AppState) -> ApiResult<()> {
    if st.objects.is_none() || !st.nodes.is_cluster() {
        return Ok(());
    }
    let now = now_ms();
    for row in st.db.live_sandboxes().await? {
        if row.spec.on_node_loss != OnNodeLoss::Restore
            || row.suspended_snapshot.is_some()
            || row.create_latency_ms.is_none()
        {
            continue;
        }
        match st.nodes.state(&row.node) {
            Some(NodeState::Lost) if row.stored_checkpoint.is_some() => {
                start(st, row, Job::Restore);
            }
            Some(NodeState::Ready | NodeState::Cordoned) if checkpoint_due(&row, now) => {
                start(st, row, Job::Checkpoint);
            }
            _ => {}
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Job {
    Checkpoint,
    Restore,
}

/// Runs `job` for `row` in a task of its own, unless one is under way or backing off.
fn start(st: &AppState, row: SandboxRow, job: Job) {
    {
        let mut w = work().lock().unwrap_or_else(|p| p.into_inner());
        // A restore does not wait for a checkpoint under way: that one may be stuck on the
        // very node that was lost (its commit fails once the sandbox is suspended).
        let busy = match w.in_flight.get(&row.id) {
            Some(Job::Checkpoint) => job != Job::Restore,
            Some(Job::Restore) => true,
            None => false,
        };
        let key = (row.id.clone(), job);
        if busy || w.not_before.get(&key).is_some_and(|t| Instant::now() < *t) {
            return;
        }
        w.not_before.remove(&key);
        w.in_flight.insert(row.id.clone(), job);
    }
    let st = st.clone();
    tokio::spawn(async move {
        let id = row.id.clone();
        let result = match job {
            Job::Checkpoint => checkpoint(&st, row).await,
            Job::Restore => restore(&st, row).await,
        };
        let mut w = work().lock().unwrap_or_else(|p| p.into_inner());
        if w.in_flight.get(&id) == Some(&job) {
            w.in_flight.remove(&id);
        }
        if let Err(e) = result {
            tracing::warn!(sandbox = %id, ?job, error = %e.body.message, "node-loss protection failed; tried again later");
            w.not_before.insert((id, job), Instant::now() + RETRY_AFTER);
        }
    });
}

/// A stored checkpoint of a sandbox that runs (one paused, stopped or busy is left for a
/// later pass).
async fn checkpoint(st: &AppState, row: SandboxRow) -> ApiResult<()> {
    let node = st.node_of(&row).await?;
    let running = node
        .sandbox(&row.id)
        .await?
        .is_some_and(|v| v.state == SandboxState::Running);
    if !running {
        return Ok(());
    }
    super::suspend::checkpoint_row(st, row).await
}

/// A sandbox of a lost node, restored on another from its stored checkpoint.
async fn restore(st: &AppState, row: SandboxRow) -> ApiResult<()> {
    let id = row.id.clone();
    if !st.db.suspend_in_stored_checkpoint(&id).await? {
        return Ok(());
    }
    tracing::warn!(sandbox = %id, node = %row.node, "its node is lost: restoring the sandbox elsewhere from its stored checkpoint");
    let Some(suspended) = st.db.sandbox_any_tenant(&id).await? else {
        return Ok(());
    };
    // A resume that fails leaves it suspended in that checkpoint: any later resume (a
    // client's, or auto_resume) brings it back.
    let info = super::suspend::resume(st, suspended).await?;
    tracing::info!(sandbox = %id, from = %row.node, to = %info.node, "sandbox of a lost node restored");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{DesiredState, SandboxSpec};

    fn row(created_at_ms: i64, every: Option<u64>, last: Option<i64>) -> SandboxRow {
        SandboxRow {
            id: SandboxId::generate(),
            tenant_id: space_core::TenantId::generate(),
            node: "n".into(),
            template: "t".into(),
            template_digest: "d".into(),
            spec: SandboxSpec {
                resources: Default::default(),
                env_keys: vec![],
                forked_from: None,
                from_snapshot: None,
                public_ports: Default::default(),
                on_node_loss: OnNodeLoss::Restore,
                checkpoint_interval_secs: every,
                snapshot_storage: Default::default(),
            },
            labels: Default::default(),
            desired_state: DesiredState::Running,
            created_at_ms,
            expires_at_ms: i64::MAX,
            timeout_secs: 1,
            on_timeout: Default::default(),
            auto_resume: false,
            timed_out_at_ms: None,
            deleted_at_ms: None,
            create_latency_ms: Some(1),
            creating_replica: None,
            suspended_snapshot: None,
            stored_checkpoint: last.map(|_| space_core::SnapshotId::generate()),
            stored_checkpoint_at_ms: last,
            tokens: Default::default(),
        }
    }

    #[test]
    fn a_checkpoint_is_due_one_interval_after_the_last_or_the_create() {
        assert!(!checkpoint_due(&row(0, Some(10), None), 9_999));
        assert!(checkpoint_due(&row(0, Some(10), None), 10_000));
        assert!(!checkpoint_due(&row(0, Some(10), Some(50_000)), 59_999));
        assert!(checkpoint_due(&row(0, Some(10), Some(50_000)), 60_000));
        // The default interval.
        let every = DEFAULT_STORED_CHECKPOINT_SECS as i64 * 1000;
        assert!(!checkpoint_due(&row(0, None, None), every - 1));
        assert!(checkpoint_due(&row(0, None, None), every));
    }
}

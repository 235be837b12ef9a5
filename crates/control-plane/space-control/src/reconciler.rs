//! The reconciler: converges the nodes' live state to the database's desired state.
//!
//! It runs on the leading replica only (`crate::replica`). Every second it compares the live rows (desired `running`) with the node's records and
//! acts. The decision is a pure function, [`plan`]; [`Reconciler::run_once`] executes it.
//! Every action is idempotent, so running it at any time, twice, or after a crash is safe:
//!
//! - **Expire**: a live row past `expires_at_ms` whose timeout action is `delete` is marked
//!   deleted and the node deletes it. So is one whose action is `pause` or `stop` but that
//!   can be neither (failed, or gone from its node).
//! - **PauseExpired** / **StopExpired**: a running sandbox past its deadline whose action is
//!   `pause` / `stop` is paused / stopped with the cause `timeout`, then its row is marked
//!   timed out (`timed_out_at_ms`): it has no deadline until it runs again, so the action
//!   happens once, not at every pass.
//! - **MarkTimedOut**: a sandbox past that deadline but already paused or stopped is left
//!   as it is, and marked timed out.
//! - **RenewTimeout**: a timed-out sandbox that runs again, however it came to (a client's
//!   resume or start, an automatic wake, a rollback), gets a deadline again: now + its
//!   timeout. (The API renews it at once for the wakes it performs; this catches the rest.)
//! - **MarkGone**: a live row whose node record is missing (or deleted) is marked deleted in
//!   the database, with a log line: the sandbox is gone and will not come back.
//! - **DeleteOrphan**: a node record with no live row (a crash between the two steps of a
//!   create or delete) is deleted on the node; so is a suspended sandbox's record on the
//!   node that took its snapshot, if that node did not free it at once.
//! - **AdoptResumed** / **UndoResume**: the replica resuming a suspended sandbox died: if
//!   the node runs it, it is recorded as resumed; if not, it stays suspended. A suspended
//!   sandbox's timeout still applies (delete, or marked timed out).
//!
//! - **AdoptCreated**: the replica running a create died (or the create outlived
//!   [`CREATE_GRACE`]) and the node made the sandbox: recorded as that replica would have.
//!   If the node never made it, the create is undone (**MarkGone**); if the node failed
//!   it, it is deleted (**Expire**); while the node still creates it, it is left alone.
//!
//! Creates that a live replica is running are left alone (the row names the replica), and
//! so is a sandbox in the middle of an operation when its `pause` or `stop` is due (the
//! next pass acts once the operation has finished).
//!
//! A sandbox's live state (running, paused by a client, idleness or its timeout, stopped, in
//! the middle of a snapshot or rollback, failed) is the node's business, not drift: the
//! desired state only says the sandbox should exist ([`crate::db::DesiredState`]), so every
//! node state but `deleted` is converged. A `delete` timeout applies whatever the live state:
//! a paused or stopped sandbox past its timeout is deleted like a running one.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use space_core::sandbox::TimeoutAction;
use space_core::{ErrorCode, SandboxId, SandboxState};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::AppState;
use crate::db::{now_ms, DbError, ReplicaId, SandboxRow};
use crate::nodes::{NodeApi, NodeCallError, PauseCause, SandboxView, StopCause};

/// How often the reconciler runs.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// One thing to do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Its timeout passed and it is to be deleted: mark deleted, then delete on the node.
    Expire(SandboxId),
    /// Its timeout passed and it runs: pause it (cause `timeout`), then mark it timed out.
    PauseExpired(SandboxId),
    /// Its timeout passed and it runs: stop it (cause `timeout`), then mark it timed out.
    StopExpired(SandboxId),
    /// Its timeout passed while it was paused or stopped already: mark it timed out.
    MarkTimedOut(SandboxId),
    /// It timed out and runs again: renew its deadline.
    RenewTimeout(SandboxId),
    /// The node no longer has it: mark deleted in the database.
    MarkGone(SandboxId),
    /// The node has it but the database does not want it: delete on the node.
    DeleteOrphan(SandboxId),
    /// Its create finished on the node but no replica recorded it (the one that ran it
    /// died): record it as that replica would have.
    AdoptCreated(SandboxId),
    /// It was resuming from object storage and its node runs it, but the replica that
    /// resumed it died before recording it: record it as resumed.
    AdoptResumed(SandboxId),
    /// It was resuming from object storage and the replica resuming it died with nothing
    /// running: it stays suspended.
    UndoResume(SandboxId),
    /// Its node holds it `suspending` but no live replica is suspending it (the one that
    /// was died, or the node restarted): the suspend is given up, the sandbox runs again.
    AbortSuspend(SandboxId),
}

/// Decides what to do. `live_rows` are the rows with desired state `running` (all tenants);
/// `records` the node's records; `live_replicas` the control-plane replicas alive now.
///
/// Read the node's records *before* the rows: then a record without a row really is an
/// orphan (creates insert the row before the node makes the record).
pub fn plan(
    live_rows: &[SandboxRow],
    records: &[SandboxView],
    live_replicas: &HashSet<ReplicaId>,
    now_ms: i64,
) -> Vec<Action> {
    let on_node: HashMap<&SandboxId, &SandboxView> = records
        .iter()
        .filter(|r| r.state != SandboxState::Deleted)
        .map(|r| (&r.id, r))
        .collect();
    let wanted: HashSet<&SandboxId> = live_rows
        .iter()
        .filter(|r| wanted_on_its_node(r))
        .map(|r| &r.id)
        .collect();
    let mut actions = Vec::new();
    for row in live_rows {
        let record = on_node.get(&row.id).map(|r| r.state);
        if row.suspended_snapshot.is_some() {
            actions.extend(plan_suspended(row, record, live_replicas, now_ms));
            continue;
        }
        if record == Some(SandboxState::Suspending) {
            // Not committed (the row is not suspended): only the replica suspending it
            // may carry on; the action checks it is gone before giving the suspend up.
            // Its timeout still applies (below): a `delete` timeout wins over a suspend.
            actions.push(Action::AbortSuspend(row.id.clone()));
        }
        if row.create_latency_ms.is_some() {
            actions.extend(plan_row(row, record, now_ms));
        } else if !create_in_flight(row, live_replicas, now_ms) {
            actions.extend(plan_abandoned_create(row, record));
        }
        // A create under way: its replica records it (or undoes it) when it ends.
    }
    for id in on_node.keys() {
        if !wanted.contains(*id) {
            actions.push(Action::DeleteOrphan((*id).clone()));
        }
    }
    actions.sort();
    actions
}

/// Whether live row `row` wants its sandbox on the node it names: not while it is
/// suspended (no node holds it), unless it is resuming there.
pub fn wanted_on_its_node(row: &SandboxRow) -> bool {
    row.suspended_snapshot.is_none() || row.creating_replica.is_some()
}

/// A suspended sandbox: its timeout still applies; a resume whose replica died is settled
/// by what its node has (running: resumed; nothing: still suspended).
fn plan_suspended(
    row: &SandboxRow,
    record: Option<SandboxState>,
    live_replicas: &HashSet<ReplicaId>,
    now_ms: i64,
) -> Option<Action> {
    let id = row.id.clone();
    if let Some(replica) = &row.creating_replica {
        // A live replica finishes or undoes its resume itself (the node call is bounded).
        if live_replicas.contains(replica) {
            return None;
        }
        return match record {
            Some(SandboxState::Running | SandboxState::Paused) => Some(Action::AdoptResumed(id)),
            Some(SandboxState::Creating) => None,
            _ => Some(Action::UndoResume(id)),
        };
    }
    if row.timed_out_at_ms.is_none() && row.expires_at_ms <= now_ms {
        return Some(match row.on_timeout {
            TimeoutAction::Delete => Action::Expire(id),
            // Not running: it is left as it is, and marked.
            TimeoutAction::Pause | TimeoutAction::Stop => Action::MarkTimedOut(id),
        });
    }
    None
}

/// A create whose replica died before recording it (or that outlived [`CREATE_GRACE`]):
/// finished if the node made the sandbox, undone if it did not, left to the node while
/// the node is still at it.
fn plan_abandoned_create(row: &SandboxRow, record: Option<SandboxState>) -> Option<Action> {
    let id = row.id.clone();
    match record {
        Some(SandboxState::Running | SandboxState::Paused | SandboxState::Stopped) => {
            Some(Action::AdoptCreated(id))
        }
        // The create never reached the node (the replica died before its call arrived,
        // which the replica timeout leaves time for): undone.
        None => Some(Action::MarkGone(id)),
        Some(SandboxState::Failed) => Some(Action::Expire(id)),
        // The node is still creating it.
        Some(_) => None,
    }
}

/// How long a create may run before the reconciler takes it for abandoned even though its
/// replica still heartbeats: the longest a node call may take, and a margin.
pub const CREATE_GRACE: Duration = Duration::from_secs(16 * 60);

/// Whether `row`'s create is still run by a live replica (within [`CREATE_GRACE`]).
pub fn create_in_flight(row: &SandboxRow, live_replicas: &HashSet<ReplicaId>, now_ms: i64) -> bool {
    row.create_latency_ms.is_none()
        && row
            .creating_replica
            .as_ref()
            .is_some_and(|r| live_replicas.contains(r))
        && within_grace(row, now_ms)
}

/// Whether `row`'s create is unfinished (not recorded yet) and within the grace: shown as
/// `creating` until its replica, or the reconciler, records the outcome.
pub fn create_unfinished(row: &SandboxRow, now_ms: i64) -> bool {
    row.create_latency_ms.is_none() && within_grace(row, now_ms)
}

fn within_grace(row: &SandboxRow, now_ms: i64) -> bool {
    let grace_ms = i64::try_from(CREATE_GRACE.as_millis()).unwrap_or(i64::MAX);
    now_ms.saturating_sub(row.created_at_ms) < grace_ms
}

/// What one live row needs, given its sandbox's state on the node (`None`: no record).
fn plan_row(row: &SandboxRow, state: Option<SandboxState>, now_ms: i64) -> Option<Action> {
    let id = row.id.clone();
    if row.timed_out_at_ms.is_some() {
        // No deadline: nothing happens until it runs again (or breaks, or goes).
        return match state {
            None => Some(Action::MarkGone(id)),
            Some(SandboxState::Failed) => Some(Action::Expire(id)),
            Some(s) if s.serves_guest() => Some(Action::RenewTimeout(id)),
            Some(_) => None,
        };
    }
    if row.expires_at_ms > now_ms {
        return state.is_none().then_some(Action::MarkGone(id));
    }
    match (row.on_timeout, state) {
        (TimeoutAction::Delete, _) | (_, None | Some(SandboxState::Failed)) => {
            Some(Action::Expire(id))
        }
        (_, Some(SandboxState::Paused | SandboxState::Stopped)) => Some(Action::MarkTimedOut(id)),
        (TimeoutAction::Pause, Some(SandboxState::Running)) => Some(Action::PauseExpired(id)),
        (TimeoutAction::Stop, Some(SandboxState::Running)) => Some(Action::StopExpired(id)),
        // In the middle of an operation: the next pass acts on where it ends up.
        (_, Some(_)) => None,
    }
}

/// Runs [`plan`] against the real database and node.
#[derive(Clone)]
pub struct Reconciler {
    state: AppState,
    /// How long action log records are kept.
    audit_retention: Duration,
}

/// How often records past the retention are removed from the action log.
pub const AUDIT_PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// Why a pass failed (it is simply retried on the next tick).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A node failed a call the pass depends on.
    #[error(transparent)]
    Node(#[from] NodeCallError),
}

impl Reconciler {
    /// A reconciler over the app's database and node, keeping action log records for
    /// `audit_retention`.
    pub fn new(state: AppState, audit_retention: Duration) -> Self {
        Self {
            state,
            audit_retention,
        }
    }

    /// Removes action log records older than the retention (each tenant's chain keeps an
    /// anchor where its kept part starts).
    pub async fn prune_audit(&self) -> Result<u64, ReconcileError> {
        let keep_ms = i64::try_from(self.audit_retention.as_millis()).unwrap_or(i64::MAX);
        let removed = self
            .state
            .db
            .prune_audit(now_ms().saturating_sub(keep_ms))
            .await?;
        if removed > 0 {
            tracing::info!(removed, "removed action log records past their retention");
        }
        Ok(removed)
    }

    /// One pass: plan, then act. Returns what it did (actions that turned out unnecessary
    /// on re-check are left out).
    pub async fn run_once(&self) -> Result<Vec<Action>, ReconcileError> {
        let st = &self.state;
        // Every node's records before the rows (see `plan`).
        let mut on_nodes = Vec::new();
        for node in st.nodes.all() {
            match node.sandboxes().await {
                Ok(records) => on_nodes.push((node, records)),
                // A node that cannot say is skipped this pass: its sandboxes are not gone.
                Err(e) => {
                    tracing::warn!(node = node.name(), error = %e, "node unavailable; not reconciling it this pass");
                }
            }
        }
        let live = st.db.live_sandboxes().await?;
        let mut done = Vec::new();
        for (node, records) in on_nodes {
            done.extend(self.converge(node.as_ref(), &records, &live).await?);
        }
        Ok(done)
    }

    /// One pass over one node, whatever its state (a lost node rejoining is reconciled
    /// before it is let serve): its sandboxes that should be gone are deleted, timeouts
    /// that passed while it was away are acted on. A node that cannot answer fails it.
    pub async fn reconcile_node(&self, node: &dyn NodeApi) -> Result<Vec<Action>, ReconcileError> {
        let records = node.sandboxes().await?;
        let live = self.state.db.live_sandboxes().await?;
        self.converge(node, &records, &live).await
    }

    /// Plans over `node`'s `records` and the live rows placed on it, and acts.
    async fn converge(
        &self,
        node: &dyn NodeApi,
        records: &[SandboxView],
        live: &[SandboxRow],
    ) -> Result<Vec<Action>, ReconcileError> {
        let rows: Vec<SandboxRow> = live
            .iter()
            .filter(|r| r.node == node.name())
            .cloned()
            .collect();
        let live_replicas = self.state.replica.live_set().await?;
        let mut done = Vec::new();
        for action in plan(&rows, records, &live_replicas, now_ms()) {
            if self.execute(node, &action).await? {
                done.push(action);
            }
        }
        Ok(done)
    }

    /// Records what the platform did to sandbox `id` in its tenant's action log.
    async fn log(&self, id: &SandboxId, action: &str) {
        match self.state.db.sandbox_any_tenant(id).await {
            Ok(Some(row)) => {
                let target = format!("/v1/sandboxes/{id}");
                self.state
                    .db
                    .log_operator_action(&row.tenant_id, action, &target)
                    .await;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(sandbox = %id, error = %e, "the action log could not record a timeout")
            }
        }
    }

    async fn execute(&self, node: &dyn NodeApi, action: &Action) -> Result<bool, ReconcileError> {
        let st = &self.state;
        match action {
            Action::Expire(id) => {
                if st.db.mark_deleted(id, now_ms()).await? {
                    tracing::info!(sandbox = %id, "sandbox timeout expired; deleting");
                    self.log(id, "sandbox.timeout.delete").await;
                }
                self.delete_on_node(node, id).await;
                Ok(true)
            }
            Action::PauseExpired(id) | Action::StopExpired(id) => {
                if !self.still_due(id).await? {
                    return Ok(false);
                }
                let outcome = if matches!(action, Action::PauseExpired(_)) {
                    tracing::info!(sandbox = %id, "sandbox timeout expired; pausing");
                    self.log(id, "sandbox.timeout.pause").await;
                    node.pause(id, PauseCause::Timeout).await
                } else {
                    tracing::info!(sandbox = %id, "sandbox timeout expired; stopping");
                    self.log(id, "sandbox.timeout.stop").await;
                    node.stop(id, StopCause::Timeout).await
                };
                self.timed_out(id, outcome.map(drop)).await
            }
            Action::MarkTimedOut(id) => {
                let marked = st.db.mark_timed_out(id, now_ms()).await?;
                if marked {
                    tracing::info!(sandbox = %id, "sandbox timeout expired while it was paused or stopped; left as it is");
                }
                Ok(marked)
            }
            Action::RenewTimeout(id) => {
                if !node
                    .sandbox(id)
                    .await?
                    .is_some_and(|r| r.state.serves_guest())
                {
                    return Ok(false);
                }
                let renewed = st.db.renew_timeout(id, now_ms()).await?;
                if renewed {
                    tracing::info!(sandbox = %id, "timed-out sandbox runs again; its deadline is renewed");
                }
                Ok(renewed)
            }
            Action::AdoptCreated(id) => {
                let Some(record) = node.sandbox(id).await? else {
                    return Ok(false);
                };
                let Some(mut row) = st.db.sandbox_any_tenant(id).await? else {
                    return Ok(false);
                };
                if row.create_latency_ms.is_some() || self.create_in_flight(&row).await? {
                    return Ok(false);
                }
                row.spec.resources = record.resources;
                // Its real latency died with the replica: from its row to now, an upper bound.
                let latency = now_ms().saturating_sub(row.created_at_ms).max(0);
                let adopted = st
                    .db
                    .set_created(id, &record.template_digest, &row.spec, latency)
                    .await?;
                if adopted {
                    tracing::info!(sandbox = %id, node = node.name(), "adopted a create whose replica did not finish it");
                }
                Ok(adopted)
            }
            Action::AdoptResumed(id) | Action::UndoResume(id) => {
                let Some(row) = st.db.sandbox_any_tenant(id).await? else {
                    return Ok(false);
                };
                let resuming =
                    row.suspended_snapshot.is_some() && row.creating_replica.as_ref().is_some();
                if !resuming || self.replica_alive(&row).await? {
                    return Ok(false);
                }
                let runs = node.sandbox(id).await?.is_some_and(|r| {
                    matches!(r.state, SandboxState::Running | SandboxState::Paused)
                });
                if runs {
                    st.db.finish_resume(id).await?;
                    st.db.renew_timeout(id, now_ms()).await?;
                    tracing::info!(sandbox = %id, node = node.name(), "adopted a resume whose replica did not finish it");
                } else {
                    st.db.undo_resume(id).await?;
                    tracing::warn!(sandbox = %id, node = node.name(), "a resume whose replica died did not happen; the sandbox stays suspended");
                }
                Ok(true)
            }
            Action::AbortSuspend(id) => {
                if st
                    .db
                    .suspend_under_way(id, &st.replica.live_set().await?)
                    .await?
                {
                    return Ok(false);
                }
                match node.abort_suspend(id).await {
                    Ok(_) => {
                        tracing::warn!(sandbox = %id, node = node.name(), "a suspend nobody finishes was given up; the sandbox runs again");
                        Ok(true)
                    }
                    // It moved on meanwhile (freed, or running again).
                    Err(e) if e.code() == ErrorCode::Conflict => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Action::MarkGone(id) => {
                // Re-check against fresh state: a create may have finished since the
                // plan, or its replica come back.
                let Some(row) = st.db.sandbox_any_tenant(id).await? else {
                    return Ok(false);
                };
                if row.desired_state != crate::db::DesiredState::Running
                    || self.create_in_flight(&row).await?
                    || node
                        .sandbox(id)
                        .await?
                        .is_some_and(|r| r.state != SandboxState::Deleted)
                {
                    return Ok(false);
                }
                if st.db.mark_deleted(id, now_ms()).await? {
                    if row.create_latency_ms.is_none() {
                        tracing::warn!(sandbox = %id, replica = ?row.creating_replica, "the replica creating this sandbox died before the node made it; create undone");
                    } else {
                        tracing::warn!(sandbox = %id, "sandbox is missing on its node; marked deleted");
                    }
                }
                Ok(true)
            }
            Action::DeleteOrphan(id) => {
                if st.db.sandbox_any_tenant(id).await?.is_some_and(|r| {
                    r.desired_state == crate::db::DesiredState::Running
                        && r.node == node.name()
                        && wanted_on_its_node(&r)
                }) {
                    return Ok(false);
                }
                tracing::info!(sandbox = %id, "deleting sandbox that is not wanted (orphan)");
                self.delete_on_node(node, id).await;
                Ok(true)
            }
        }
    }

    /// Whether the replica `row` names (creating or resuming it) is alive now.
    async fn replica_alive(&self, row: &SandboxRow) -> Result<bool, ReconcileError> {
        match row.creating_replica.as_ref() {
            Some(r) => Ok(self.state.replica.alive(r).await?),
            None => Ok(false),
        }
    }

    /// Whether `row`'s create is run by a replica alive now (asked of the database afresh).
    async fn create_in_flight(&self, row: &SandboxRow) -> Result<bool, ReconcileError> {
        let Some(replica) = row.creating_replica.as_ref() else {
            return Ok(false);
        };
        Ok(row.create_latency_ms.is_none()
            && within_grace(row, now_ms())
            && self.state.replica.alive(replica).await?)
    }

    /// Whether the row's deadline still stands and has passed (re-read: a client may have
    /// set a new timeout since the plan).
    async fn still_due(&self, id: &SandboxId) -> Result<bool, ReconcileError> {
        Ok(self
            .state
            .db
            .sandbox_any_tenant(id)
            .await?
            .is_some_and(|r| {
                r.desired_state == crate::db::DesiredState::Running
                    && r.timed_out_at_ms.is_none()
                    && r.expires_at_ms <= now_ms()
            }))
    }

    /// After the timeout's pause or stop: the row is marked timed out once it worked. A
    /// sandbox that changed state meanwhile is planned again next pass; one whose pause or
    /// stop broke it is failed, and its timeout then deletes it.
    async fn timed_out(
        &self,
        id: &SandboxId,
        outcome: Result<(), NodeCallError>,
    ) -> Result<bool, ReconcileError> {
        match outcome {
            Ok(()) => Ok(self.state.db.mark_timed_out(id, now_ms()).await?),
            // Its state changed meanwhile (a lifecycle conflict): planned again next pass.
            Err(e) if e.code() == ErrorCode::Conflict => Ok(false),
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "the timeout's action failed; retrying next pass");
                Ok(false)
            }
        }
    }

    async fn delete_on_node(&self, node: &dyn NodeApi, id: &SandboxId) {
        if let Err(e) = node.delete(id).await {
            tracing::warn!(sandbox = %id, error = %e, "node delete failed; retrying next pass")
        }
    }

    /// Runs a pass every [`INTERVAL`] while this replica leads (see [`crate::replica`]),
    /// until `stop` turns true. The hourly prunes (the action log past its retention, idle
    /// request buckets) are the leader's too.
    pub fn spawn(self, stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let next_prune = std::sync::Arc::new(std::sync::Mutex::new(tokio::time::Instant::now()));
        crate::background::every(INTERVAL, stop, move || {
            let (this, next_prune) = (self.clone(), next_prune.clone());
            async move {
                if !this.state.replica.leads().await {
                    return;
                }
                if let Err(e) = this.run_once().await {
                    tracing::warn!(error = %e, "reconciler pass failed");
                }
                if let Err(e) = crate::service::suspend::collect(&this.state).await {
                    tracing::warn!(error = %e.body.message, "collecting stored snapshots failed");
                }
                if let Err(e) = crate::service::node_loss::run(&this.state).await {
                    tracing::warn!(error = %e.body.message, "node-loss protection pass failed");
                }
                if let Err(e) = crate::service::customer_keys::watch(&this.state).await {
                    tracing::warn!(error = %e.body.message, "watching customer keys failed");
                }
                let now = tokio::time::Instant::now();
                let due = {
                    let mut next = next_prune.lock().unwrap_or_else(|p| p.into_inner());
                    let due = now >= *next;
                    if due {
                        *next = now + AUDIT_PRUNE_INTERVAL;
                    }
                    due
                };
                if due {
                    this.prune().await;
                }
            }
        })
    }

    /// The leader's hourly prunes: the action log past its retention, idle request buckets,
    /// objects of snapshots no row names, expired build files.
    async fn prune(&self) {
        match crate::service::suspend::collect_orphans(&self.state).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(snapshots = n, "orphan snapshot objects collected"),
            Err(e) => {
                tracing::warn!(error = %e.body.message, "collecting orphan snapshot objects failed")
            }
        }
        match crate::service::build_files::collect(&self.state).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(archives = n, "expired build files collected"),
            Err(e) => tracing::warn!(error = %e, "collecting expired build files failed"),
        }
        if let Err(e) = self.prune_audit().await {
            tracing::warn!(error = %e, "pruning the action log failed");
        }
        if let Err(e) = self
            .state
            .db
            .prune_rate_buckets(crate::quotas::BUCKET_IDLE)
            .await
        {
            tracing::warn!(error = %e, "pruning idle request buckets failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use space_core::{Resources, TenantId};

    use super::*;
    use crate::db::{DesiredState, SandboxSpec};

    fn row(expires_at_ms: i64) -> SandboxRow {
        SandboxRow {
            id: SandboxId::generate(),
            tenant_id: TenantId::generate(),
            node: "local".into(),
            template: "base".into(),
            template_digest: "d".into(),
            spec: SandboxSpec {
                resources: Resources::default(),
                env_keys: vec![],
                forked_from: None,
                from_snapshot: None,
                public_ports: Default::default(),
                on_node_loss: Default::default(),
                checkpoint_interval_secs: None,
                snapshot_storage: Default::default(),
            },
            labels: BTreeMap::new(),
            desired_state: DesiredState::Running,
            created_at_ms: 0,
            expires_at_ms,
            timeout_secs: 10,
            on_timeout: TimeoutAction::Delete,
            auto_resume: false,
            timed_out_at_ms: None,
            deleted_at_ms: None,
            create_latency_ms: Some(1),
            creating_replica: None,
            suspended_snapshot: None,
            stored_checkpoint: None,
            stored_checkpoint_at_ms: None,
            tokens: Default::default(),
        }
    }

    fn row_on_timeout(expires_at_ms: i64, on_timeout: TimeoutAction) -> SandboxRow {
        SandboxRow {
            on_timeout,
            ..row(expires_at_ms)
        }
    }

    fn record(id: &SandboxId, state: SandboxState) -> SandboxView {
        space_node::SandboxRecord::new(
            id.clone(),
            "base".into(),
            "d".into(),
            Resources::default(),
            state,
        )
        .view()
    }

    #[test]
    fn converged_state_needs_nothing() {
        let rows = vec![row(2000), row(3000)];
        let records: Vec<_> = rows
            .iter()
            .map(|r| record(&r.id, SandboxState::Running))
            .collect();
        assert_eq!(plan(&rows, &records, &HashSet::new(), 1000), vec![]);
        // Failed sandboxes stay until the user (or the TTL) deletes them.
        let records: Vec<_> = rows
            .iter()
            .map(|r| record(&r.id, SandboxState::Failed))
            .collect();
        assert_eq!(plan(&rows, &records, &HashSet::new(), 1000), vec![]);
    }

    /// `want`, plus the check a suspending sandbox always gets (is its suspend still
    /// under way?).
    fn and_suspend_check(
        state: SandboxState,
        id: &SandboxId,
        mut want: Vec<Action>,
    ) -> Vec<Action> {
        if state == SandboxState::Suspending {
            want.push(Action::AbortSuspend(id.clone()));
            want.sort();
        }
        want
    }

    /// Every live node state, stable or transient.
    fn live_states() -> Vec<SandboxState> {
        space_core::lifecycle::ALL_STATES
            .into_iter()
            .filter(|s| *s != SandboxState::Deleted)
            .collect()
    }

    #[test]
    fn paused_stopped_and_busy_sandboxes_are_not_drift() {
        for state in live_states() {
            let rows = vec![row(2000)];
            let mut rec = record(&rows[0].id, state);
            if state == SandboxState::Paused {
                rec.paused_by = Some(PauseCause::Idle);
            }
            assert_eq!(
                plan(&rows, &[rec], &HashSet::new(), 1000),
                and_suspend_check(state, &rows[0].id, vec![]),
                "a live row whose sandbox is {state} needs nothing"
            );
        }
    }

    #[test]
    fn the_ttl_applies_in_every_live_state() {
        for state in live_states() {
            let rows = vec![row(1000)];
            let records = vec![record(&rows[0].id, state)];
            assert_eq!(
                plan(&rows, &records, &HashSet::new(), 1000),
                and_suspend_check(state, &rows[0].id, vec![Action::Expire(rows[0].id.clone())]),
                "an expired sandbox that is {state} is deleted"
            );
        }
    }

    #[test]
    fn a_pause_or_stop_timeout_acts_on_a_running_sandbox_only() {
        for (action, acted) in [
            (
                TimeoutAction::Pause,
                Action::PauseExpired as fn(SandboxId) -> Action,
            ),
            (TimeoutAction::Stop, Action::StopExpired),
        ] {
            for state in live_states() {
                let rows = vec![row_on_timeout(1000, action)];
                let id = rows[0].id.clone();
                let want = match state {
                    SandboxState::Running => vec![acted(id.clone())],
                    // Left as it is, but no longer due.
                    SandboxState::Paused | SandboxState::Stopped => {
                        vec![Action::MarkTimedOut(id.clone())]
                    }
                    // Neither can be paused nor stopped: its timeout deletes it.
                    SandboxState::Failed => vec![Action::Expire(id.clone())],
                    // Mid-operation: the next pass acts on where it ends up.
                    _ => vec![],
                };
                let want = and_suspend_check(state, &id, want);
                assert_eq!(
                    plan(&rows, &[record(&id, state)], &HashSet::new(), 1000),
                    want,
                    "on_timeout {action:?}, sandbox {state}"
                );
                // Not due yet: nothing.
                let early = vec![row_on_timeout(5000, action)];
                let rec = record(&early[0].id, state);
                assert_eq!(
                    plan(&early, &[rec], &HashSet::new(), 1000),
                    and_suspend_check(state, &early[0].id, vec![])
                );
            }
            // Gone from the node: deleted, as with `delete`.
            let rows = vec![row_on_timeout(1000, action)];
            assert_eq!(
                plan(&rows, &[], &HashSet::new(), 1000),
                vec![Action::Expire(rows[0].id.clone())]
            );
        }
    }

    #[test]
    fn a_timed_out_sandbox_has_no_deadline_until_it_runs_again() {
        for action in [TimeoutAction::Pause, TimeoutAction::Stop] {
            let mut timed_out = row_on_timeout(1000, action);
            timed_out.timed_out_at_ms = Some(1000);
            let rows = vec![timed_out];
            let id = rows[0].id.clone();
            for state in live_states() {
                let want = match state {
                    s if s.serves_guest() => vec![Action::RenewTimeout(id.clone())],
                    SandboxState::Failed => vec![Action::Expire(id.clone())],
                    _ => vec![],
                };
                let want = and_suspend_check(state, &id, want);
                // Long past its deadline: never acted on again while it does not run.
                for now in [1000, 2000, 1_000_000] {
                    assert_eq!(
                        plan(&rows, &[record(&id, state)], &HashSet::new(), now),
                        want,
                        "timed out ({action:?}), sandbox {state}, at {now}"
                    );
                }
            }
            assert_eq!(
                plan(&rows, &[], &HashSet::new(), 2000),
                vec![Action::MarkGone(id.clone())]
            );
        }
    }

    #[test]
    fn a_pause_timeout_acts_once_per_run() {
        // The reconciler's actions applied by hand, pass after pass.
        let mut r = row_on_timeout(1000, TimeoutAction::Pause);
        let id = r.id.clone();
        let mut rec = record(&id, SandboxState::Running);
        let pass = |r: &SandboxRow, rec: &SandboxView, now| {
            plan(
                std::slice::from_ref(r),
                std::slice::from_ref(rec),
                &HashSet::new(),
                now,
            )
        };
        assert_eq!(pass(&r, &rec, 999), vec![]);
        assert_eq!(pass(&r, &rec, 1000), vec![Action::PauseExpired(id.clone())]);
        rec.state = SandboxState::Paused;
        rec.paused_by = Some(PauseCause::Timeout);
        r.timed_out_at_ms = Some(1000);
        for now in [1001, 5000, 60_000] {
            assert_eq!(
                pass(&r, &rec, now),
                vec![],
                "paused by its timeout at {now}"
            );
        }
        // A client (or an automatic wake) resumes it: a new deadline, then a new pause.
        rec.state = SandboxState::Running;
        rec.paused_by = None;
        assert_eq!(
            pass(&r, &rec, 70_000),
            vec![Action::RenewTimeout(id.clone())]
        );
        r.timed_out_at_ms = None;
        r.expires_at_ms = 70_000 + i64::try_from(r.timeout_secs * 1000).unwrap();
        assert_eq!(pass(&r, &rec, 70_001), vec![]);
        assert_eq!(
            pass(&r, &rec, r.expires_at_ms),
            vec![Action::PauseExpired(id.clone())]
        );
    }

    #[test]
    fn orphans_are_deleted_in_every_live_state() {
        for state in live_states() {
            let orphan = SandboxId::generate();
            assert_eq!(
                plan(&[], &[record(&orphan, state)], &HashSet::new(), 1000),
                vec![Action::DeleteOrphan(orphan)],
                "{state}"
            );
        }
    }

    /// A row whose create replica `replica` runs, begun at 1000.
    fn unfinished(replica: &ReplicaId) -> SandboxRow {
        SandboxRow {
            create_latency_ms: None,
            created_at_ms: 1000,
            creating_replica: Some(replica.clone()),
            ..row(i64::MAX)
        }
    }

    #[test]
    fn fork_children_in_flight_are_left_alone() {
        // A fork inserts the children's rows before the node admits them, and the node
        // makes their `creating` records while the parent is being checkpointed.
        let me = ReplicaId::generate();
        let live: HashSet<_> = [me.clone()].into_iter().collect();
        let parent = row(5000);
        let children = [unfinished(&me), unfinished(&me)];
        let mut rows = vec![parent.clone()];
        rows.extend(children.iter().cloned());
        let before = vec![record(&parent.id, SandboxState::Checkpointing)];
        assert_eq!(plan(&rows, &before, &live, 2000), vec![]);
        let mut during = before.clone();
        during.push(record(&children[0].id, SandboxState::Creating));
        assert_eq!(plan(&rows, &during, &live, 2000), vec![]);
        during.push(record(&children[1].id, SandboxState::Running));
        assert_eq!(plan(&rows, &during, &live, 2000), vec![]);
    }

    #[test]
    fn expired_rows_are_deleted() {
        let rows = vec![row(1000), row(5000)];
        let records: Vec<_> = rows
            .iter()
            .map(|r| record(&r.id, SandboxState::Running))
            .collect();
        assert_eq!(
            plan(&rows, &records, &HashSet::new(), 1000),
            vec![Action::Expire(rows[0].id.clone())]
        );
        // Expired and already missing on the node: expiry wins (it also marks deleted).
        assert_eq!(
            plan(&rows[..1], &[], &HashSet::new(), 1000),
            vec![Action::Expire(rows[0].id.clone())]
        );
    }

    #[test]
    fn rows_missing_on_the_node_are_marked_gone() {
        let rows = vec![row(5000), row(5000)];
        let records = vec![
            record(&rows[0].id, SandboxState::Running),
            record(&rows[1].id, SandboxState::Deleted),
        ];
        assert_eq!(
            plan(&rows, &records, &HashSet::new(), 1000),
            vec![Action::MarkGone(rows[1].id.clone())]
        );
        assert_eq!(
            plan(&rows[..1], &[], &HashSet::new(), 1000),
            vec![Action::MarkGone(rows[0].id.clone())]
        );
    }

    #[test]
    fn orphans_on_the_node_are_deleted() {
        let orphan = SandboxId::generate();
        let records = vec![record(&orphan, SandboxState::Running)];
        assert_eq!(
            plan(&[], &records, &HashSet::new(), 1000),
            vec![Action::DeleteOrphan(orphan.clone())]
        );
        let records = vec![record(&orphan, SandboxState::Failed)];
        assert_eq!(
            plan(&[], &records, &HashSet::new(), 1000),
            vec![Action::DeleteOrphan(orphan)]
        );
        // Records already deleted on the node need nothing.
        let records = vec![record(&SandboxId::generate(), SandboxState::Deleted)];
        assert_eq!(plan(&[], &records, &HashSet::new(), 1000), vec![]);
    }

    #[test]
    fn creates_a_live_replica_runs_are_left_alone() {
        let other = ReplicaId::generate();
        let live: HashSet<_> = [other.clone()].into_iter().collect();
        let row = unfinished(&other);
        for records in [
            vec![],
            vec![record(&row.id, SandboxState::Creating)],
            vec![record(&row.id, SandboxState::Running)],
            vec![record(&row.id, SandboxState::Failed)],
        ] {
            assert_eq!(
                plan(std::slice::from_ref(&row), &records, &live, 2000),
                vec![]
            );
        }
    }

    #[test]
    fn creates_of_a_dead_replica_are_finished_or_undone() {
        let dead = ReplicaId::generate();
        let live = HashSet::new();
        let row = unfinished(&dead);
        let id = row.id.clone();
        let planned =
            |records: Vec<SandboxView>| plan(std::slice::from_ref(&row), &records, &live, 2000);
        // The node made it: adopted. It never reached the node: undone. The node failed
        // it: deleted. The node is still at it: left to the node.
        assert_eq!(
            planned(vec![record(&id, SandboxState::Running)]),
            vec![Action::AdoptCreated(id.clone())]
        );
        assert_eq!(planned(vec![]), vec![Action::MarkGone(id.clone())]);
        assert_eq!(
            planned(vec![record(&id, SandboxState::Deleted)]),
            vec![Action::MarkGone(id.clone())]
        );
        assert_eq!(
            planned(vec![record(&id, SandboxState::Failed)]),
            vec![Action::Expire(id.clone())]
        );
        assert_eq!(planned(vec![record(&id, SandboxState::Creating)]), vec![]);
        // A row from before replicas were named (none) is a dead replica's too.
        let anonymous = SandboxRow {
            creating_replica: None,
            suspended_snapshot: None,
            stored_checkpoint: None,
            stored_checkpoint_at_ms: None,
            ..row.clone()
        };
        assert_eq!(
            plan(std::slice::from_ref(&anonymous), &[], &live, 2000),
            vec![Action::MarkGone(anonymous.id.clone())]
        );
    }

    #[test]
    fn a_create_past_the_grace_is_abandoned_even_if_its_replica_lives() {
        let me = ReplicaId::generate();
        let live: HashSet<_> = [me.clone()].into_iter().collect();
        let row = unfinished(&me);
        let late = 1000 + i64::try_from(CREATE_GRACE.as_millis()).unwrap();
        assert_eq!(
            plan(std::slice::from_ref(&row), &[], &live, late),
            vec![Action::MarkGone(row.id.clone())]
        );
        assert_eq!(
            plan(std::slice::from_ref(&row), &[], &live, late - 1),
            vec![]
        );
    }

    #[test]
    fn plan_is_idempotent_once_applied() {
        // Applying the actions to the inputs yields a state with nothing left to do.
        let keep = row(5000);
        let expired = row(10);
        let gone = row(5000);
        let orphan = SandboxId::generate();
        let rows = vec![keep.clone(), expired.clone(), gone.clone()];
        let records = vec![
            record(&keep.id, SandboxState::Running),
            record(&expired.id, SandboxState::Running),
            record(&orphan, SandboxState::Running),
        ];
        let actions = plan(&rows, &records, &HashSet::new(), 1000);
        assert_eq!(actions.len(), 3);
        let rows_after: Vec<_> = rows
            .into_iter()
            .filter(|r| {
                !actions
                    .iter()
                    .any(|a| matches!(a, Action::Expire(id) | Action::MarkGone(id) if *id == r.id))
            })
            .collect();
        let records_after: Vec<_> = records
            .into_iter()
            .filter(|r| {
                !actions.iter().any(
                    |a| matches!(a, Action::Expire(id) | Action::DeleteOrphan(id) if *id == r.id),
                )
            })
            .collect();
        assert_eq!(
            plan(&rows_after, &records_after, &HashSet::new(), 1000),
            vec![]
        );
    }
}

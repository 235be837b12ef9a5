//! The reconciler: converges the node's live state to the database's desired state.
//!
//! Every second it compares the live rows (desired `running`) with the node's records and
//! acts. The decision is a pure function, [`plan`]; [`Reconciler::run_once`] executes it.
//! Every action is idempotent, so running it at any time, twice, or after a crash is safe:
//!
//! - **Expire**: a live row past `expires_at_ms` is marked deleted and the node deletes it (TTL).
//! - **MarkGone**: a live row whose node record is missing (or deleted) is marked deleted in
//!   the database, with a log line: the sandbox is gone and will not come back.
//! - **DeleteOrphan**: a node record with no live row (a crash between the two steps of a
//!   create or delete) is deleted on the node.
//!
//! Sandboxes whose create call is still running in this process are left alone.
//!
//! A sandbox's live state (running, paused by a client or by idleness, stopped, in the
//! middle of a snapshot or rollback, failed) is the node's business, not drift: the desired
//! state only says the sandbox should exist ([`crate::db::DesiredState`]), so every node
//! state but `deleted` is converged. The TTL applies whatever the live state: a paused or
//! stopped sandbox past its timeout is deleted like a running one.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use space_core::{SandboxId, SandboxState};
use space_node::SandboxRecord;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::AppState;
use crate::db::{now_ms, DbError, SandboxRow};

/// How often the reconciler runs.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// One thing to do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Its timeout passed: mark deleted, then delete on the node.
    Expire(SandboxId),
    /// The node no longer has it: mark deleted in the database.
    MarkGone(SandboxId),
    /// The node has it but the database does not want it: delete on the node.
    DeleteOrphan(SandboxId),
}

/// Decides what to do. `live_rows` are the rows with desired state `running` (all tenants);
/// `records` the node's records; `creating` the ids whose create call is under way.
///
/// Read the node's records *before* the rows: then a record without a row really is an
/// orphan (creates insert the row before the node makes the record).
pub fn plan(
    live_rows: &[SandboxRow],
    records: &[SandboxRecord],
    creating: &HashSet<SandboxId>,
    now_ms: i64,
) -> Vec<Action> {
    let on_node: HashMap<&SandboxId, &SandboxRecord> = records
        .iter()
        .filter(|r| r.state != SandboxState::Deleted)
        .map(|r| (&r.id, r))
        .collect();
    let wanted: HashSet<&SandboxId> = live_rows.iter().map(|r| &r.id).collect();
    let mut actions = Vec::new();
    for row in live_rows {
        if creating.contains(&row.id) {
            continue;
        }
        if row.expires_at_ms <= now_ms {
            actions.push(Action::Expire(row.id.clone()));
        } else if !on_node.contains_key(&row.id) {
            actions.push(Action::MarkGone(row.id.clone()));
        }
    }
    for id in on_node.keys() {
        if !wanted.contains(*id) && !creating.contains(*id) {
            actions.push(Action::DeleteOrphan((*id).clone()));
        }
    }
    actions.sort();
    actions
}

/// Runs [`plan`] against the real database and node.
#[derive(Clone)]
pub struct Reconciler {
    state: AppState,
}

/// Why a pass failed (it is simply retried on the next tick).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl Reconciler {
    /// A reconciler over the app's database and node.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    /// One pass: plan, then act. Returns what it did (actions that turned out unnecessary
    /// on re-check are left out).
    pub async fn run_once(&self) -> Result<Vec<Action>, ReconcileError> {
        let st = &self.state;
        let records = st.node.sandboxes();
        // Rows placed on other nodes are theirs to reconcile.
        let node = st.node.name().to_owned();
        let rows: Vec<SandboxRow> = st
            .db
            .live_sandboxes()
            .await?
            .into_iter()
            .filter(|r| r.node == node)
            .collect();
        let creating = st.creating.snapshot();
        let mut done = Vec::new();
        for action in plan(&rows, &records, &creating, now_ms()) {
            if self.execute(&action).await? {
                done.push(action);
            }
        }
        Ok(done)
    }

    async fn execute(&self, action: &Action) -> Result<bool, ReconcileError> {
        let st = &self.state;
        match action {
            Action::Expire(id) => {
                if st.db.mark_deleted(id, now_ms()).await? {
                    tracing::info!(sandbox = %id, "sandbox timeout expired; deleting");
                }
                self.delete_on_node(id).await;
                Ok(true)
            }
            Action::MarkGone(id) => {
                // Re-check against fresh state: a create may have finished since the
                // snapshot (its record appears before it leaves the in-flight set).
                if st.creating.contains(id)
                    || st
                        .node
                        .sandbox(id)
                        .is_some_and(|r| r.state != SandboxState::Deleted)
                {
                    return Ok(false);
                }
                if st.db.mark_deleted(id, now_ms()).await? {
                    tracing::warn!(sandbox = %id, "sandbox is missing on its node; marked deleted");
                }
                Ok(true)
            }
            Action::DeleteOrphan(id) => {
                if st.creating.contains(id)
                    || st
                        .db
                        .sandbox_any_tenant(id)
                        .await?
                        .is_some_and(|r| r.desired_state == crate::db::DesiredState::Running)
                {
                    return Ok(false);
                }
                tracing::info!(sandbox = %id, "deleting sandbox that is not wanted (orphan)");
                self.delete_on_node(id).await;
                Ok(true)
            }
        }
    }

    async fn delete_on_node(&self, id: &SandboxId) {
        match self.state.node.delete_sandbox(id).await {
            Ok(()) => {}
            Err(e) if crate::api::sandboxes::already_deleted(&e) => {}
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "node delete failed; retrying next pass")
            }
        }
    }

    /// Runs a pass every [`INTERVAL`] until `stop` turns true.
    pub fn spawn(self, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => {}
                }
                if *stop.borrow() {
                    break;
                }
                if let Err(e) = self.run_once().await {
                    tracing::warn!(error = %e, "reconciler pass failed");
                }
            }
        })
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
            },
            labels: BTreeMap::new(),
            desired_state: DesiredState::Running,
            created_at_ms: 0,
            expires_at_ms,
            deleted_at_ms: None,
            create_latency_ms: None,
        }
    }

    fn record(id: &SandboxId, state: SandboxState) -> SandboxRecord {
        SandboxRecord::new(
            id.clone(),
            "base".into(),
            "d".into(),
            Resources::default(),
            state,
        )
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
                rec.paused_by = Some(space_node::PauseCause::Idle);
            }
            assert_eq!(
                plan(&rows, &[rec], &HashSet::new(), 1000),
                vec![],
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
                vec![Action::Expire(rows[0].id.clone())],
                "an expired sandbox that is {state} is deleted"
            );
        }
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

    #[test]
    fn fork_children_in_flight_are_left_alone() {
        // A fork inserts the children's rows before the node admits them, and the node
        // makes their `creating` records while the parent is being checkpointed.
        let parent = row(5000);
        let children = [row(5000), row(5000)];
        let mut rows = vec![parent.clone()];
        rows.extend(children.iter().cloned());
        let creating: HashSet<_> = children.iter().map(|r| r.id.clone()).collect();
        let before = vec![record(&parent.id, SandboxState::Checkpointing)];
        assert_eq!(plan(&rows, &before, &creating, 1000), vec![]);
        let mut during = before.clone();
        during.push(record(&children[0].id, SandboxState::Creating));
        assert_eq!(plan(&rows, &during, &creating, 1000), vec![]);
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
    fn creates_in_flight_are_left_alone() {
        let rows = vec![row(0)];
        let orphan = SandboxId::generate();
        let records = vec![record(&orphan, SandboxState::Creating)];
        let creating: HashSet<_> = [rows[0].id.clone(), orphan].into_iter().collect();
        assert_eq!(plan(&rows, &records, &creating, 1000), vec![]);
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

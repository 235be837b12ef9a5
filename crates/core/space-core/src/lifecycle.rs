//! The sandbox lifecycle: states, events, and the one transition table.
//!
//! Every state change of a sandbox, anywhere in SPACE, goes through [`SandboxState::apply`].
//! Transient states (`creating`, `deleting`) are persisted like the others, so a node that
//! crashes mid-operation knows on restart what it was doing and can finish or fail it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a sandbox is in its life.
///
/// Stable states: `running`, `paused`, `stopped`, `failed`, `deleted`. The others are
/// transient: each is persisted before its operation starts, so a node that crashes in the
/// middle finds the state on restart and finishes or undoes the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Disk cloned, VM booting or being restored; the daemon has not reported ready yet.
    Creating,
    /// The VM runs and its daemon answers.
    Running,
    /// The vCPUs are being stopped.
    Pausing,
    /// vCPUs stopped, memory resident; resumes in milliseconds.
    Paused,
    /// The vCPUs are being started again and the daemon reconnected.
    Resuming,
    /// The VM is being shut down; the disk is kept.
    Stopping,
    /// No VM; the disk is kept. `start` boots it again (cold: processes and memory are gone).
    Stopped,
    /// Cold boot of a stopped sandbox.
    Starting,
    /// A full checkpoint (memory, device state, disk) is being taken while the VM runs.
    Checkpointing,
    /// The VM is being replaced by one started from a snapshot of this sandbox.
    RollingBack,
    /// The VMM died and the sandbox is being restored from its latest checkpoint.
    Restoring,
    /// Being torn down: VMM killed, disk and sockets removed.
    Deleting,
    /// Gone. Terminal; the record is kept for auditing.
    Deleted,
    /// Broke (VM exited, daemon crashed, guest misbehaved); the reason is recorded. Only
    /// `delete` (or a rollback to one of its snapshots) is allowed from here.
    Failed,
    /// The node that holds it missed its heartbeats: what it is doing is unknown until the
    /// node rejoins and is reconciled. The control plane's view only: no node records it,
    /// and no transition leads to or from it.
    Lost,
    /// Being suspended: the VM is checkpointed and stopped, and the checkpoint's artifacts
    /// are uploaded to object storage; the node frees it once the snapshot is committed.
    Suspending,
    /// Its full snapshot is in object storage and no node holds it; `resume` restores it on
    /// any node. The control plane's view only (no node records it).
    Suspended,
}

/// Something that happens to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxEvent {
    /// The daemon of a new sandbox reported ready and accepted its configuration.
    Ready,
    /// A client (or idleness) asked to pause.
    Pause,
    /// A client (or an API call that needs the guest) asked to resume.
    Resume,
    /// A client asked to stop.
    Stop,
    /// A client asked to start a stopped sandbox.
    Start,
    /// A full checkpoint (or a fork, which starts with one) begins.
    Checkpoint,
    /// A client asked to roll back to a snapshot.
    Rollback,
    /// The VMM died unexpectedly and the policy says restore.
    Crash,
    /// The operation of the current transient state finished.
    Done,
    /// The operation of the current transient state failed harmlessly: back to where it began.
    Abort,
    /// A client (or the TTL) asked for deletion.
    Delete,
    /// The sandbox broke.
    Fail,
    /// A client (or a drain) asked to suspend it to object storage.
    Suspend,
}

/// One entry of a sandbox's event log: a lifecycle transition, when it happened, and what
/// the node had to say about it (e.g. what window of work a crash restore lost).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LifecycleEntry {
    /// The sandbox.
    pub sandbox_id: crate::SandboxId,
    /// When, ms since the Unix epoch.
    pub at_ms: i64,
    /// What happened.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub event: SandboxEvent,
    /// State before.
    pub from: SandboxState,
    /// State after.
    pub to: SandboxState,
    /// Why, or what it cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A transition the table does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {event} a sandbox that is {state}")]
pub struct LifecycleError {
    /// The state the sandbox is in.
    pub state: SandboxState,
    /// The event that was refused.
    pub event: SandboxEvent,
}

use SandboxEvent as E;
use SandboxState as S;

/// The transition table: `(from, event) -> to`. Anything not listed is illegal.
pub const TRANSITIONS: &[(SandboxState, SandboxEvent, SandboxState)] = &[
    (S::Creating, E::Ready, S::Running),
    (S::Running, E::Pause, S::Pausing),
    (S::Pausing, E::Done, S::Paused),
    (S::Pausing, E::Abort, S::Running),
    (S::Paused, E::Resume, S::Resuming),
    (S::Resuming, E::Done, S::Running),
    // A suspended sandbox resumed from object storage: its daemon answers.
    (S::Resuming, E::Ready, S::Running),
    (S::Resuming, E::Abort, S::Paused),
    (S::Running, E::Stop, S::Stopping),
    (S::Paused, E::Stop, S::Stopping),
    (S::Stopping, E::Done, S::Stopped),
    (S::Stopped, E::Start, S::Starting),
    (S::Starting, E::Done, S::Running),
    (S::Starting, E::Abort, S::Stopped),
    (S::Running, E::Checkpoint, S::Checkpointing),
    (S::Checkpointing, E::Done, S::Running),
    (S::Checkpointing, E::Abort, S::Running),
    (S::Running, E::Rollback, S::RollingBack),
    (S::Paused, E::Rollback, S::RollingBack),
    (S::Stopped, E::Rollback, S::RollingBack),
    (S::Failed, E::Rollback, S::RollingBack),
    (S::RollingBack, E::Done, S::Running),
    (S::Running, E::Crash, S::Restoring),
    (S::Restoring, E::Done, S::Running),
    // Every live state can break; a failed teardown leaves the sandbox failed, and delete
    // may be retried.
    (S::Creating, E::Fail, S::Failed),
    (S::Running, E::Fail, S::Failed),
    (S::Pausing, E::Fail, S::Failed),
    (S::Paused, E::Fail, S::Failed),
    (S::Resuming, E::Fail, S::Failed),
    (S::Stopping, E::Fail, S::Failed),
    (S::Starting, E::Fail, S::Failed),
    (S::Checkpointing, E::Fail, S::Failed),
    (S::RollingBack, E::Fail, S::Failed),
    (S::Restoring, E::Fail, S::Failed),
    (S::Deleting, E::Fail, S::Failed),
    // Delete wins over everything but itself finishing.
    (S::Creating, E::Delete, S::Deleting),
    (S::Running, E::Delete, S::Deleting),
    (S::Pausing, E::Delete, S::Deleting),
    (S::Paused, E::Delete, S::Deleting),
    (S::Resuming, E::Delete, S::Deleting),
    (S::Stopping, E::Delete, S::Deleting),
    (S::Stopped, E::Delete, S::Deleting),
    (S::Starting, E::Delete, S::Deleting),
    (S::Checkpointing, E::Delete, S::Deleting),
    (S::RollingBack, E::Delete, S::Deleting),
    (S::Restoring, E::Delete, S::Deleting),
    (S::Failed, E::Delete, S::Deleting),
    (S::Deleting, E::Delete, S::Deleting),
    (S::Deleting, E::Done, S::Deleted),
    // Suspend: the VM checkpointed and stopped, its artifacts uploaded. Then the node either
    // frees it (the control plane committed the snapshot: a delete) or runs it again from
    // the checkpoint (the control plane gave up: an abort).
    (S::Running, E::Suspend, S::Suspending),
    (S::Paused, E::Suspend, S::Suspending),
    (S::Suspending, E::Abort, S::Running),
    (S::Suspending, E::Delete, S::Deleting),
    (S::Suspending, E::Fail, S::Failed),
];

/// Every state, in lifecycle order.
pub const ALL_STATES: [SandboxState; 17] = [
    S::Creating,
    S::Running,
    S::Pausing,
    S::Paused,
    S::Resuming,
    S::Stopping,
    S::Stopped,
    S::Starting,
    S::Checkpointing,
    S::RollingBack,
    S::Restoring,
    S::Deleting,
    S::Deleted,
    S::Failed,
    S::Lost,
    S::Suspending,
    S::Suspended,
];

impl SandboxState {
    /// The state after `event`, or an error naming the current state.
    pub fn apply(self, event: SandboxEvent) -> Result<SandboxState, LifecycleError> {
        TRANSITIONS
            .iter()
            .find(|(from, ev, _)| *from == self && *ev == event)
            .map(|(_, _, to)| *to)
            .ok_or(LifecycleError { state: self, event })
    }

    /// No further transitions except bookkeeping.
    pub fn is_terminal(self) -> bool {
        matches!(self, S::Deleted)
    }

    /// An operation was in progress; after a crash the node must finish or undo it.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            S::Creating
                | S::Pausing
                | S::Resuming
                | S::Stopping
                | S::Starting
                | S::Checkpointing
                | S::RollingBack
                | S::Restoring
                | S::Deleting
                | S::Suspending
        )
    }

    /// The guest daemon can serve requests (exec, files) in this state. A checkpoint is taken
    /// live, so the sandbox keeps serving while it runs.
    pub fn serves_guest(self) -> bool {
        matches!(self, S::Running | S::Checkpointing)
    }

    /// Counts against the node's CPU and memory capacity (a stopped sandbox only holds disk).
    pub fn holds_compute(self) -> bool {
        !matches!(self, S::Stopped | S::Deleted | S::Suspended)
    }

    /// Counts against node capacity (compute or disk).
    pub fn holds_resources(self) -> bool {
        !matches!(self, S::Deleted | S::Suspended)
    }

    /// The lowercase name used in the API, the database and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            S::Creating => "creating",
            S::Running => "running",
            S::Pausing => "pausing",
            S::Paused => "paused",
            S::Resuming => "resuming",
            S::Stopping => "stopping",
            S::Stopped => "stopped",
            S::Starting => "starting",
            S::Checkpointing => "checkpointing",
            S::RollingBack => "rolling_back",
            S::Restoring => "restoring",
            S::Deleting => "deleting",
            S::Deleted => "deleted",
            S::Failed => "failed",
            S::Lost => "lost",
            S::Suspending => "suspending",
            S::Suspended => "suspended",
        }
    }

    /// Parses the name produced by [`SandboxState::as_str`].
    pub fn parse(s: &str) -> Option<SandboxState> {
        ALL_STATES.into_iter().find(|st| st.as_str() == s)
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl SandboxEvent {
    /// The verb used in error messages ("cannot pause a sandbox that is paused").
    pub fn verb(self) -> &'static str {
        match self {
            E::Ready => "mark ready",
            E::Pause => "pause",
            E::Resume => "resume",
            E::Stop => "stop",
            E::Start => "start",
            E::Checkpoint => "checkpoint",
            E::Rollback => "roll back",
            E::Crash => "restore after a crash",
            E::Done => "finish an operation on",
            E::Abort => "abort an operation on",
            E::Delete => "delete",
            E::Fail => "fail",
            E::Suspend => "suspend",
        }
    }
}

impl fmt::Display for SandboxEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.verb())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn happy_path() {
        let s = S::Creating.apply(E::Ready).and_then(|s| s.apply(E::Delete));
        assert_eq!(s.and_then(|s| s.apply(E::Done)), Ok(S::Deleted));
    }

    #[test]
    fn illegal_transition_names_state() {
        let err = S::Deleted.apply(E::Delete).unwrap_err();
        assert_eq!(err.to_string(), "cannot delete a sandbox that is deleted");
        assert!(S::Failed.apply(E::Ready).is_err());
    }

    #[test]
    fn pause_of_paused_names_state() {
        let paused = S::Running.apply(E::Pause).and_then(|s| s.apply(E::Done));
        assert_eq!(paused, Ok(S::Paused));
        let err = S::Paused.apply(E::Pause).unwrap_err();
        assert_eq!(err.to_string(), "cannot pause a sandbox that is paused");
    }

    #[test]
    fn every_transient_state_can_finish_fail_and_be_deleted() {
        for s in ALL_STATES.into_iter().filter(|s| s.is_transient()) {
            // A create ends with Ready; a suspend with the control plane's delete or abort.
            assert!(
                s.apply(E::Done).is_ok() || s == S::Creating || s == S::Suspending,
                "{s} cannot finish"
            );
            assert!(s.apply(E::Fail).is_ok(), "{s} cannot fail");
            assert!(s.apply(E::Delete).is_ok(), "{s} cannot be deleted");
        }
        for s in ALL_STATES.into_iter().filter(|s| !s.is_transient()) {
            assert!(s.apply(E::Done).is_err(), "{s} is stable but has Done");
        }
    }

    #[test]
    fn a_suspend_ends_freed_or_running_again() {
        for from in [S::Running, S::Paused] {
            assert_eq!(from.apply(E::Suspend), Ok(S::Suspending));
        }
        assert_eq!(S::Suspending.apply(E::Abort), Ok(S::Running));
        assert_eq!(S::Suspending.apply(E::Delete), Ok(S::Deleting));
        for from in [S::Stopped, S::Creating, S::Suspending, S::Failed] {
            assert!(from.apply(E::Suspend).is_err(), "{from}");
        }
        // The control plane's view only: no node moves a sandbox to or from it.
        assert!(TRANSITIONS
            .iter()
            .all(|(f, _, t)| *f != S::Suspended && *t != S::Suspended));
        assert!(!S::Suspended.holds_resources());
    }

    #[test]
    fn table_is_deterministic() {
        for (i, (f, e, _)) in TRANSITIONS.iter().enumerate() {
            for (g, d, _) in &TRANSITIONS[i + 1..] {
                assert!(!(f == g && e == d), "duplicate transition {f} {e}");
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for s in ALL_STATES {
            assert_eq!(SandboxState::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
    }
}

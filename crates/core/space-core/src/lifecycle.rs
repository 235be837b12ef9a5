//! The sandbox lifecycle: states, events, and the one transition table.
//!
//! Every state change of a sandbox, anywhere in SPACE, goes through [`SandboxState::apply`].
//! Transient states (`creating`, `deleting`) are persisted like the others, so a node that
//! crashes mid-operation knows on restart what it was doing and can finish or fail it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Disk cloned, VM booting; the daemon has not reported ready yet.
    Creating,
    /// The VM runs and its daemon answers.
    Running,
    /// Being torn down: VMM killed, disk and sockets removed.
    Deleting,
    /// Gone. Terminal; the record is kept for auditing.
    Deleted,
    /// Broke (VM exited, daemon crashed, guest misbehaved); the reason is recorded. Only
    /// `delete` is allowed from here.
    Failed,
}

/// Something that happens to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxEvent {
    /// The daemon inside the guest reported ready and accepted its configuration.
    Ready,
    /// A client (or the TTL) asked for deletion.
    Delete,
    /// Every resource of the sandbox has been released.
    Deleted,
    /// The sandbox broke.
    Fail,
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
    (S::Creating, E::Fail, S::Failed),
    (S::Creating, E::Delete, S::Deleting),
    (S::Running, E::Fail, S::Failed),
    (S::Running, E::Delete, S::Deleting),
    (S::Failed, E::Delete, S::Deleting),
    // A failed teardown leaves the sandbox failed; delete may be retried.
    (S::Deleting, E::Fail, S::Failed),
    (S::Deleting, E::Delete, S::Deleting),
    (S::Deleting, E::Deleted, S::Deleted),
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

    /// The VM should be alive in this state (used when re-adopting after a restart).
    pub fn has_vm(self) -> bool {
        matches!(self, S::Creating | S::Running)
    }

    /// Counts against node capacity.
    pub fn holds_resources(self) -> bool {
        matches!(self, S::Creating | S::Running | S::Deleting | S::Failed)
    }

    /// The lowercase name used in the API, the database and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            S::Creating => "creating",
            S::Running => "running",
            S::Deleting => "deleting",
            S::Deleted => "deleted",
            S::Failed => "failed",
        }
    }

    /// Parses the name produced by [`SandboxState::as_str`].
    pub fn parse(s: &str) -> Option<SandboxState> {
        [S::Creating, S::Running, S::Deleting, S::Deleted, S::Failed]
            .into_iter()
            .find(|st| st.as_str() == s)
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for SandboxEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            E::Ready => "mark ready",
            E::Delete => "delete",
            E::Deleted => "finish deleting",
            E::Fail => "fail",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn happy_path() {
        let s = S::Creating.apply(E::Ready).and_then(|s| s.apply(E::Delete));
        assert_eq!(s.and_then(|s| s.apply(E::Deleted)), Ok(S::Deleted));
    }

    #[test]
    fn illegal_transition_names_state() {
        let err = S::Deleted.apply(E::Delete).unwrap_err();
        assert_eq!(err.to_string(), "cannot delete a sandbox that is deleted");
        assert!(S::Failed.apply(E::Ready).is_err());
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
        for s in [S::Creating, S::Running, S::Deleting, S::Deleted, S::Failed] {
            assert_eq!(SandboxState::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
    }
}

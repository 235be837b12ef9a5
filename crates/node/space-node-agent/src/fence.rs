//! Self-fencing: a node cut off from the control plane pauses, before it can be declared
//! lost, each of its sandboxes that would then be restored on another node
//! (`on_node_loss: restore`). Without it, a node that is only cut off (not dead) would run
//! its copy beside the restored one: two guests, one identity, both reaching the network.
//!
//! Each heartbeat reply says how long the control plane waits before it declares a node
//! lost and which of this node's sandboxes are restorable. The control plane counts from the
//! last heartbeat it received; the node counts from the last reply it received, which is
//! later, so a node that pauses [`FENCE_FRACTION`] of the way into that time does so before
//! the control plane can count the whole of it (the margin covers a reply's travel and the
//! pauses themselves). When heartbeats are answered again — the node was not declared lost,
//! or it rejoined, which first deletes here every sandbox restored elsewhere — the node
//! resumes the sandboxes it paused that are still its own.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use space_core::{SandboxId, SandboxState};
use space_node_proto::api::NodeApi;
use space_node_proto::PauseCause;
use tokio::sync::watch;

/// How far into the control plane's lost timeout, without an answered heartbeat, a node
/// fences itself.
pub const FENCE_FRACTION: (u32, u32) = (3, 4);
/// Shortest heartbeat call timeout.
pub const MIN_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the fence looks at the time.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// Whether a node whose last heartbeat was answered `since_answer` ago fences itself, the
/// control plane declaring nodes lost after `lost_after`.
pub fn fence_due(since_answer: Duration, lost_after: Duration) -> bool {
    let (num, den) = FENCE_FRACTION;
    !lost_after.is_zero() && since_answer >= lost_after * num / den
}

/// What the fence knows from the heartbeats.
struct State {
    /// When a heartbeat was last answered.
    answered: Instant,
    /// The control plane's lost timeout (zero until a reply said).
    lost_after: Duration,
    /// The node's sandboxes restored elsewhere if it is declared lost.
    restorable: Vec<SandboxId>,
    /// Those the fence paused.
    paused: Vec<SandboxId>,
}

/// The node's fence; shared by the heartbeat loop (which feeds it) and its watch.
pub struct Fence {
    state: Mutex<State>,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            state: Mutex::new(State {
                answered: Instant::now(),
                lost_after: Duration::ZERO,
                restorable: Vec::new(),
                paused: Vec::new(),
            }),
        }
    }
}

impl Fence {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A heartbeat was answered (or the node rejoined, reconciled): the time starts again,
    /// and whatever the fence paused is resumed by [`Fence::release`].
    pub fn answered(&self, lost_after: Duration, restorable: Vec<SandboxId>) {
        let mut s = self.lock();
        s.answered = Instant::now();
        if !lost_after.is_zero() {
            s.lost_after = lost_after;
        }
        s.restorable = restorable;
    }

    /// How long a heartbeat call may take: half the control plane's lost timeout once a
    /// reply said it (an answer later than that is of no use, and a call stuck on a cut-off
    /// connection must not delay the next try, or the rejoin, by more), at least
    /// [`MIN_CALL_TIMEOUT`]; `fallback` before.
    pub fn call_timeout(&self, fallback: Duration) -> Duration {
        let lost_after = self.lock().lost_after;
        if lost_after.is_zero() {
            fallback
        } else {
            (lost_after / 2).clamp(MIN_CALL_TIMEOUT, fallback.max(MIN_CALL_TIMEOUT))
        }
    }

    /// The node is back: resumes each sandbox the fence paused that is still here and
    /// still paused by it.
    pub async fn release(&self, node: &dyn NodeApi) {
        let paused = std::mem::take(&mut self.lock().paused);
        for id in paused {
            let still = node.sandbox(&id).await.ok().flatten().is_some_and(|v| {
                v.state == SandboxState::Paused && v.paused_by == Some(PauseCause::CutOff)
            });
            if !still {
                continue;
            }
            match node.resume(&id).await {
                Ok(_) => {
                    tracing::info!(sandbox = %id, "back in touch with the control plane: sandbox resumed")
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "cannot resume a sandbox the fence paused")
                }
            }
        }
    }

    /// Pauses each restorable running sandbox not paused yet, if the fence is due.
    async fn check(&self, node: &dyn NodeApi) {
        let due: Vec<SandboxId> = {
            let s = self.lock();
            if !fence_due(s.answered.elapsed(), s.lost_after) {
                return;
            }
            s.restorable
                .iter()
                .filter(|id| !s.paused.contains(id))
                .cloned()
                .collect()
        };
        for id in due {
            let running = node
                .sandbox(&id)
                .await
                .ok()
                .flatten()
                .is_some_and(|v| v.state == SandboxState::Running);
            if !running {
                continue;
            }
            match node.pause(&id, PauseCause::CutOff).await {
                Ok(_) => {
                    tracing::warn!(sandbox = %id, "cut off from the control plane: sandbox paused (fenced), as it is restored elsewhere if this node is declared lost");
                    self.lock().paused.push(id);
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "cannot fence a sandbox; trying again")
                }
            }
        }
    }

    /// Checks the fence every [`CHECK_EVERY`] until `stop` turns true.
    pub fn watch(
        self: Arc<Self>,
        node: Arc<dyn NodeApi>,
        mut stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    // A dropped sender is a stop too (else `changed` returns at once, forever).
                    changed = stop.changed() => if changed.is_err() { break; },
                }
                if *stop.borrow() {
                    break;
                }
                self.check(node.as_ref()).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_falls_before_the_control_plane_could_declare_the_node_lost() {
        let lost = Duration::from_secs(20);
        assert!(!fence_due(Duration::from_secs(14), lost));
        assert!(fence_due(Duration::from_secs(15), lost));
        assert!(fence_due(Duration::from_secs(60), lost));
        // Until a reply said how long the control plane waits, nothing is fenced.
        assert!(!fence_due(Duration::from_secs(3600), Duration::ZERO));
    }

    #[test]
    fn a_heartbeat_call_gives_up_within_half_the_lost_timeout() {
        let fence = Fence::default();
        let fallback = Duration::from_secs(30);
        assert_eq!(fence.call_timeout(fallback), fallback, "nothing known yet");
        fence.answered(Duration::from_secs(20), vec![]);
        assert_eq!(fence.call_timeout(fallback), Duration::from_secs(10));
        fence.answered(Duration::from_secs(4), vec![]);
        assert_eq!(fence.call_timeout(fallback), MIN_CALL_TIMEOUT);
        fence.answered(Duration::from_secs(600), vec![]);
        assert_eq!(fence.call_timeout(fallback), fallback);
    }
}

//! Recovery: restoring a sandbox whose VMM died (from its latest checkpoint, or by booting
//! it again on its disk), and finishing or undoing, after a node restart, whatever
//! operation the previous node process was in the middle of.

use std::sync::Arc;

use space_core::{SandboxEvent, SandboxId, SandboxState, SnapshotKind};
use space_storage::{ExistingDisk, SnapshotSizes, SANDBOX_DISK_FILE};
use space_vmm::{Vm, VmStatus};

use crate::sandbox_manager::now_ms;
use crate::{Node, NodeError, VmOrigin};

/// Crash restores allowed within [`CRASH_WINDOW_MS`]; one more and the sandbox is failed
/// (a guest that panics at every start must not be restored forever).
pub const MAX_CRASH_RESTORES: usize = 3;
/// The window of [`MAX_CRASH_RESTORES`].
pub const CRASH_WINDOW_MS: i64 = 10 * 60 * 1000;

/// Whether another crash restore (or channel reconnect) is allowed, given the times of
/// earlier ones.
pub fn restore_allowed(earlier_ms: &[i64], now_ms: i64) -> bool {
    recent(earlier_ms, now_ms).count() < MAX_CRASH_RESTORES
}

/// `earlier_ms` still inside the window, plus `now_ms`: what a record keeps after one
/// more restore or reconnect.
pub fn with_one_more(earlier_ms: &[i64], now_ms: i64) -> Vec<i64> {
    recent(earlier_ms, now_ms)
        .chain(std::iter::once(now_ms))
        .collect()
}

fn recent(earlier_ms: &[i64], now_ms: i64) -> impl Iterator<Item = i64> + '_ {
    earlier_ms
        .iter()
        .copied()
        .filter(move |&t| now_ms - t < CRASH_WINDOW_MS)
}

impl Node {
    /// The VMM of a running sandbox died: restore the sandbox from its latest checkpoint
    /// (memory, processes and disk as they were then), or, without one, boot it again on
    /// its current disk. The event log says what was lost. If that fails too, the sandbox
    /// is failed.
    pub(crate) async fn restore_after_crash(&self, id: &SandboxId, vm: Arc<Vm>, reason: String) {
        let Ok(op) = self.op_lock(id) else { return };
        let _guard = op.lock().await;
        // Someone restored it first (a call that found its channel closed while this
        // waited): the sandbox runs on another VM now.
        let still_this_vm = self
            .inner
            .lock()
            .get(id)
            .is_some_and(|e| e.vm.as_ref().is_some_and(|v| Arc::ptr_eq(v, &vm)));
        if !still_this_vm {
            return;
        }
        self.restore_after_crash_locked(id, vm, reason).await;
    }

    /// [`Node::restore_after_crash`], for a caller that holds the sandbox's operation lock.
    async fn restore_after_crash_locked(&self, id: &SandboxId, vm: Arc<Vm>, reason: String) {
        let crashed_at = now_ms();
        let earlier = self
            .sandbox(id)
            .map(|r| r.crash_restores_ms)
            .unwrap_or_default();
        if !restore_allowed(&earlier, crashed_at) {
            let why = format!(
                "{reason}; not restored again: it was restored {MAX_CRASH_RESTORES} times in the last {} minutes",
                CRASH_WINDOW_MS / 60_000
            );
            self.inner.fail(id, Some(&vm), &why).await;
            return;
        }
        if let Err(e) =
            self.inner
                .transition_noted(id, SandboxEvent::Crash, Some(reason.clone()), |r| {
                    r.crash_restores_ms = with_one_more(&r.crash_restores_ms, crashed_at)
                })
        {
            tracing::warn!(%id, error = %e, "cannot start crash restore");
            return;
        }
        let _ = self.inner.nm.kill_vm(&vm).await;
        drop(vm);
        if let Err(e) = self.finish_restore(id, crashed_at).await {
            let why = format!("{reason}; restoring it failed: {e}");
            self.inner.fail(id, None, &why).await;
        }
    }

    /// Second half of a crash restore (also used to finish one after a restart).
    pub(crate) async fn finish_restore(
        &self,
        id: &SandboxId,
        crashed_at: i64,
    ) -> Result<(), NodeError> {
        self.discard_current_vm(id).await?;
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let latest = self
            .inner
            .store
            .list_snapshots(id, SnapshotSizes::Stored)?
            .into_iter()
            .filter(|s| s.kind == SnapshotKind::Checkpoint)
            .max_by_key(|s| s.created_at_ms);
        match latest.and_then(|s| self.inner.store.snapshot(id, &s.id).ok().flatten()) {
            Some((info, paths)) => {
                let image = self
                    .snapshot_disk_image(&rec, &info.id, &paths.disk)
                    .await?;
                let disk = self.inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE);
                self.inner.nm.clone_disk(
                    &self.inner.store,
                    image.path(),
                    &disk,
                    0,
                    ExistingDisk::Replace,
                )?;
                drop(image);
                let state = paths
                    .state
                    .ok_or_else(|| NodeError::Internal("checkpoint without state".into()))?;
                let lost_secs = (crashed_at - info.created_at_ms).max(0) / 1000;
                self.restore_checkpoint_vm(
                    id,
                    &rec,
                    &state,
                    VmOrigin::Checkpoint {
                        sandbox: id.clone(),
                        snapshot: Some(info.id.clone()),
                    },
                )
                .await?;
                self.inner.events.append(space_core::LifecycleEntry {
                    sandbox_id: id.clone(),
                    at_ms: now_ms(),
                    event: SandboxEvent::Done,
                    from: SandboxState::Restoring,
                    to: SandboxState::Running,
                    detail: Some(format!(
                        "restored from checkpoint {} taken at {} ms: the last {lost_secs} s of work (memory, processes and disk) were lost",
                        info.id, info.created_at_ms
                    )),
                });
                Ok(())
            }
            None => {
                self.boot_existing_disk(id).await?;
                self.inner.events.append(space_core::LifecycleEntry {
                    sandbox_id: id.clone(),
                    at_ms: now_ms(),
                    event: SandboxEvent::Done,
                    from: SandboxState::Restoring,
                    to: SandboxState::Running,
                    detail: Some(
                        "no checkpoint: booted again on its disk; processes and memory were lost, files kept"
                            .into(),
                    ),
                });
                Ok(())
            }
        }
    }

    /// After a node restart: brings a sandbox whose record says `state` back to a stable
    /// state (finishing or undoing the operation that was in flight).
    pub(crate) async fn recover_transient(&self, id: &SandboxId, state: SandboxState) {
        // A snapshot the crash interrupted is never listed or used.
        if let Err(e) = self
            .inner
            .nm
            .remove_pending_snapshots(&self.inner.store, id)
        {
            tracing::warn!(%id, error = %e, "cannot remove half-taken snapshots");
        }
        let outcome = match state {
            SandboxState::Pausing => match self.adopt_watched(id).await {
                Ok(_) => self.finish_pause(id).await.map(drop),
                Err(e) => Err(e),
            },
            SandboxState::Paused => self.adopt_watched(id).await.map(drop),
            SandboxState::Resuming => match self.adopt_watched(id).await {
                Ok(_) => self.finish_resume(id).await.map(drop),
                Err(e) => Err(e),
            },
            SandboxState::Stopping => self.finish_stop(id).await.map(drop),
            SandboxState::Starting => {
                let undone = self.discard_current_vm(id).await;
                undone.and_then(|()| {
                    self.inner
                        .transition_noted(
                            id,
                            SandboxEvent::Abort,
                            Some("the node restarted while the sandbox was starting".into()),
                            |r| {
                                r.vmm_pid = None;
                                r.vm_name = None;
                            },
                        )
                        .map(drop)
                })
            }
            SandboxState::Checkpointing => {
                // The half-taken checkpoint is gone (above); the VM may still be stopped for
                // the final pass of the save.
                match self.adopt_watched(id).await {
                    Ok(vm) => {
                        // QEMU carries on with a save its node died in the middle of; it
                        // would pause the VM when it completes.
                        if let Err(e) = vm.cancel_save().await {
                            tracing::warn!(%id, error = %e, "cannot cancel the interrupted checkpoint save");
                        }
                        if !matches!(vm.status().await, Ok(VmStatus::Running)) {
                            let _ = vm.resume().await;
                        }
                        let reconnected = self.reconnect_guest(id, vm).await;
                        // A fork freezes the workload for its checkpoint; never leave it so.
                        if let Ok(g) = self.guest(id) {
                            if let Err(e) = g.thaw_workload().await {
                                tracing::warn!(%id, error = %e, "cannot thaw the workload after an interrupted fork");
                            }
                        }
                        reconnected.and_then(|()| {
                            self.inner
                                .transition_noted(
                                    id,
                                    SandboxEvent::Abort,
                                    Some(
                                        "the node restarted during a checkpoint; it was discarded"
                                            .into(),
                                    ),
                                    |_| {},
                                )
                                .map(drop)
                        })
                    }
                    Err(e) => Err(e),
                }
            }
            SandboxState::RollingBack => self.finish_rollback(id, None).await.map(drop),
            SandboxState::Restoring => self.finish_restore(id, now_ms()).await,
            // Only the control plane knows whether it committed the stored snapshot: the
            // VM stays paused (re-adopted, if it is still there) and the sandbox
            // `suspending` until it frees it here (delete) or gives up (abort).
            SandboxState::Suspending => {
                if let Err(e) = self.adopt_watched(id).await {
                    tracing::warn!(%id, error = %e, "a suspending sandbox's VM is gone; its fate is the control plane's");
                }
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(e) = outcome {
            let reason = format!(
                "the node restarted while the sandbox was {state}, and recovering it failed: {e}"
            );
            tracing::warn!(%id, %reason);
            self.inner.fail(id, None, &reason).await;
        }
    }

    /// Re-attaches to the sandbox's VM (watching only the VM, no channel yet).
    async fn adopt_watched(&self, id: &SandboxId) -> Result<Arc<Vm>, NodeError> {
        let vm = Arc::new(
            self.inner
                .nm
                .adopt_vm(&self.inner.vm_name(id), &self.inner.run_dir(id))
                .await?,
        );
        let _ = self.inner.set_pid(id, vm.pid());
        self.attach(id, vm.clone(), None);
        Ok(vm)
    }

    /// The daemon channel of a running sandbox ended while its VM kept running: opens a
    /// fresh session, as a node restart would. The daemon ends a session whose host stops
    /// answering keep-alives, so a host process that stalled (stopped, starved, swapped)
    /// must not cost the sandbox. A guest that keeps breaking its sessions, or that does
    /// not answer a fresh one, is treated as crashed: restored or failed as its crash
    /// policy says. Safe to call from several places at once (the channel's watcher, a
    /// call that found the channel closed): the first one reconnects, the others find the
    /// new session.
    pub(crate) async fn reconnect_channel(&self, id: &SandboxId, why: &str) {
        let Ok(op) = self.op_lock(id) else { return };
        let _guard = op.lock().await;
        let found = self.inner.lock().get(id).and_then(|e| {
            let broken = e.record.state == SandboxState::Running
                && e.guest.as_ref().is_some_and(|g| g.is_closed());
            broken.then(|| (e.vm.clone(), e.channel_reconnects_ms.clone()))
        });
        // Reconnected already, or an operation changed the sandbox since.
        let Some((Some(vm), earlier)) = found else {
            return;
        };
        let now = now_ms();
        let outcome = if restore_allowed(&earlier, now) {
            crate::vm_start::connect_ready(&vm, self.inner.ready_timeout())
                .await
                .map_err(|e| {
                    format!("daemon channel broke ({why}), and a fresh session failed: {e}")
                })
        } else {
            Err(format!(
                "daemon channel broke ({why}) {MAX_CRASH_RESTORES} times in {} minutes",
                CRASH_WINDOW_MS / 60_000
            ))
        };
        match outcome {
            Ok(guest) => {
                if let Some(e) = self.inner.lock().get_mut(id) {
                    e.channel_reconnects_ms = with_one_more(&e.channel_reconnects_ms, now);
                }
                self.attach(id, vm, Some(guest));
                tracing::warn!(%id, reason = why, "the sandbox's daemon channel broke; a fresh session is open");
            }
            Err(reason) => {
                let on_crash = self.sandbox(id).map(|r| r.on_crash);
                if on_crash == Some(crate::CrashPolicy::Restore) {
                    tracing::warn!(%id, %reason, "sandbox crashed; restoring it");
                    self.restore_after_crash_locked(id, vm, reason).await;
                } else {
                    tracing::warn!(%id, %reason, "sandbox failed");
                    self.inner.fail(id, Some(vm.as_ref()), &reason).await;
                }
            }
        }
    }

    async fn reconnect_guest(&self, id: &SandboxId, vm: Arc<Vm>) -> Result<(), NodeError> {
        // A restored VM (see `connect_restored`); the session is checked to answer.
        let guest = crate::vm_start::connect_restored(&vm, self.inner.ready_timeout()).await?;
        self.attach(id, vm, Some(guest));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_loop_stops_being_restored() {
        let now = 100 * CRASH_WINDOW_MS;
        assert!(restore_allowed(&[], now));
        assert!(restore_allowed(&[now - 1000, now - 2000], now));
        assert!(!restore_allowed(&[now - 1000, now - 2000, now - 3000], now));
        // Old crashes fall out of the window.
        assert!(restore_allowed(
            &[now - CRASH_WINDOW_MS, now - CRASH_WINDOW_MS - 1, now - 3000],
            now
        ));
    }

    #[test]
    fn a_record_keeps_only_the_restores_inside_the_window() {
        let now = 100 * CRASH_WINDOW_MS;
        let kept = with_one_more(&[now - CRASH_WINDOW_MS - 5, now - 10], now);
        assert_eq!(kept, vec![now - 10, now]);
        assert!(!restore_allowed(&with_one_more(&kept, now + 1), now + 2));
    }
}

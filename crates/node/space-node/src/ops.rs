//! Lifecycle operations on an existing sandbox: pause and resume (memory stays resident),
//! stop and start (cold: the disk is kept), and waking a sandbox its timeout paused or
//! stopped. Each pause and stop records its cause (a client, idleness, the timeout).
//!
//! Each operation takes the sandbox's operation lock, persists the transient state first
//! (`pausing`, `resuming`, `stopping`, `starting`), does the work, then persists the stable
//! state. A node that crashes in between finds the transient state on restart and finishes
//! the operation (see `recovery.rs`).

use std::sync::Arc;
use std::time::Duration;

use space_core::template::TemplateInfo;
use space_core::{SandboxEvent, SandboxId, SandboxState};
use space_guest_proto::GuestConfig;
use space_storage::{ExistingDisk, SANDBOX_DISK_FILE};
use space_vmm::Vm;

use crate::sandbox_manager::{now_ms, Inner};
use crate::vm_start::{connect_ready, identity};
use crate::{Node, NodeError, PauseCause, SandboxRecord, StopCause, VmOrigin};

/// How long a stopping guest gets to flush and freeze its filesystems.
const STOP_FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

impl Node {
    /// The operation lock of a live sandbox.
    pub(crate) fn op_lock(&self, id: &SandboxId) -> Result<Arc<tokio::sync::Mutex<()>>, NodeError> {
        let map = self.inner.lock();
        match map.get(id) {
            Some(e) if e.record.state != SandboxState::Deleted => Ok(e.op.clone()),
            _ => Err(NodeError::SandboxNotFound(id.clone())),
        }
    }

    /// The VM of a sandbox that should have one.
    pub(crate) fn vm_of(&self, id: &SandboxId) -> Result<Arc<Vm>, NodeError> {
        self.inner
            .lock()
            .get(id)
            .and_then(|e| e.vm.clone())
            .ok_or_else(|| NodeError::SandboxFailed(format!("sandbox {id} has no VM")))
    }

    /// Stops watching the channel (and drops it) but keeps watching the VM: used before the
    /// guest stops answering on purpose (pause) or the VM goes away on purpose.
    pub(crate) fn detach_guest(&self, id: &SandboxId) {
        let vm = {
            let mut map = self.inner.lock();
            map.get_mut(id).and_then(|e| {
                // Streams clients still read (process output, a download) hold the
                // connection open: end it, or the old session outlives the park.
                if let Some(guest) = e.guest.take() {
                    guest.close();
                }
                e.vm.clone()
            })
        };
        if let Some(vm) = vm {
            self.attach(id, vm, None);
        }
    }

    /// Stops watching and forgets the VM (the caller kills or replaces it).
    pub(crate) fn release_vm(&self, id: &SandboxId) -> Option<Arc<Vm>> {
        let mut map = self.inner.lock();
        map.get_mut(id).and_then(|e| {
            if let Some(m) = e.monitor.take() {
                m.abort();
            }
            e.guest = None;
            e.vm.take()
        })
    }

    /// Pauses a running sandbox: its vCPUs stop, memory stays resident.
    pub async fn pause_sandbox(
        &self,
        id: &SandboxId,
        cause: PauseCause,
    ) -> Result<SandboxRecord, NodeError> {
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        // The cause is persisted with `pausing`: a pause a restart interrupts keeps it.
        self.inner
            .transition(id, SandboxEvent::Pause, |r| r.paused_by = Some(cause))?;
        self.finish_pause(id).await
    }

    /// Second half of a pause (also used to finish one after a restart), with the cause
    /// its `pausing` record holds.
    pub(crate) async fn finish_pause(&self, id: &SandboxId) -> Result<SandboxRecord, NodeError> {
        let cause = self
            .sandbox(id)
            .and_then(|r| r.paused_by)
            .unwrap_or(PauseCause::User);
        let vm = self.vm_of(id)?;
        // A paused guest cannot answer keep-alives: close the channel first, and leave the
        // daemon waiting for the handshake the resume will send.
        self.detach_guest(id);
        crate::vm_start::park(&vm).await;
        match vm.pause().await {
            Ok(()) => {
                let rec = self
                    .inner
                    .transition(id, SandboxEvent::Done, |r| r.paused_by = Some(cause))?;
                tracing::info!(%id, ?cause, "sandbox paused");
                Ok(rec)
            }
            Err(e) => {
                let reason = format!("pause failed: {e}");
                self.inner.fail(id, Some(&vm), &reason).await;
                Err(NodeError::SandboxFailed(reason))
            }
        }
    }

    /// Brings back a sandbox its timeout paused (resume) or stopped (a cold start on its
    /// disk), for a call that needs its guest; `false` if it is in neither case (then
    /// nothing is done). Whether the sandbox wants this (`auto_resume`) is the caller's
    /// decision. Someone else resuming or starting it first is not an error.
    pub async fn wake_timed_out(&self, id: &SandboxId) -> Result<bool, NodeError> {
        let rec = self.settled(id).await?;
        let woken = match (rec.state, rec.paused_by, rec.stopped_by) {
            (SandboxState::Paused, Some(PauseCause::Timeout), _) => self.resume_sandbox(id).await,
            (SandboxState::Stopped, _, Some(StopCause::Timeout)) => self.start_sandbox(id).await,
            _ => return Ok(false),
        };
        match woken {
            Ok(_) => Ok(true),
            Err(NodeError::Lifecycle(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The sandbox's record once no pause or stop is under way: a call that wakes a
    /// sandbox its timeout or idleness is pausing right now waits for that pause to end,
    /// rather than finding it neither running nor paused.
    pub(crate) async fn settled(&self, id: &SandboxId) -> Result<SandboxRecord, NodeError> {
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        if !matches!(rec.state, SandboxState::Pausing | SandboxState::Stopping) {
            return Ok(rec);
        }
        // The operation holds the sandbox's lock until its state is stable again.
        let op = self.op_lock(id)?;
        drop(op.lock().await);
        self.sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))
    }

    /// Resumes a paused sandbox and returns once its daemon answers again.
    pub async fn resume_sandbox(&self, id: &SandboxId) -> Result<SandboxRecord, NodeError> {
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        self.inner.transition(id, SandboxEvent::Resume, |_| {})?;
        self.finish_resume(id).await
    }

    /// Second half of a resume (also used to finish one after a restart).
    pub(crate) async fn finish_resume(&self, id: &SandboxId) -> Result<SandboxRecord, NodeError> {
        let vm = self.vm_of(id)?;
        let resumed = async {
            vm.resume().await?;
            let guest = connect_ready(&vm, self.inner.ready_timeout()).await?;
            // The guest clock stood still while paused.
            guest.set_identity(&identity(id.as_str())).await?;
            Ok::<_, NodeError>(guest)
        };
        match resumed.await {
            Ok(guest) => {
                self.attach(id, vm, Some(guest));
                self.inner.scheduler.reset(id);
                let rec = self
                    .inner
                    .transition(id, SandboxEvent::Done, |r| r.paused_by = None)?;
                tracing::info!(%id, "sandbox resumed");
                Ok(rec)
            }
            Err(e) => {
                let reason = format!("resume failed: {e}");
                self.inner.fail(id, Some(&vm), &reason).await;
                Err(NodeError::SandboxFailed(reason))
            }
        }
    }

    /// Stops a running or paused sandbox: the VM goes away, the disk stays.
    pub async fn stop_sandbox(
        &self,
        id: &SandboxId,
        cause: StopCause,
    ) -> Result<SandboxRecord, NodeError> {
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        // The cause is persisted with `stopping`, and stays while stopped.
        self.inner
            .transition(id, SandboxEvent::Stop, |r| r.stopped_by = Some(cause))?;
        self.finish_stop(id).await
    }

    /// Second half of a stop (also used to finish one after a restart).
    pub(crate) async fn finish_stop(&self, id: &SandboxId) -> Result<SandboxRecord, NodeError> {
        let guest = self.inner.lock().get(id).and_then(|e| e.guest.clone());
        // Flush the guest's file systems so the kept disk is clean (a paused or vanished
        // guest cannot: its disk is then as after a power cut, which ext4 recovers from).
        if let Some(guest) = guest {
            if let Err(e) = guest.freeze_fs(STOP_FREEZE_TIMEOUT).await {
                tracing::warn!(%id, error = %e, "guest did not flush its file systems before stop");
            }
        }
        self.discard_current_vm(id).await?;
        let rec = self.inner.transition(id, SandboxEvent::Done, |r| {
            r.vmm_pid = None;
            r.vm_name = None;
            r.paused_by = None;
        })?;
        tracing::info!(%id, "sandbox stopped");
        Ok(rec)
    }

    /// Starts a stopped sandbox: a cold boot on its kept disk.
    pub async fn start_sandbox(&self, id: &SandboxId) -> Result<SandboxRecord, NodeError> {
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        self.inner
            .admit_compute(id)
            .and_then(|()| self.inner.transition(id, SandboxEvent::Start, |_| {}))?;
        match self.boot_existing_disk(id).await {
            Ok(rec) => Ok(rec),
            Err(e) => {
                // Back to stopped: the disk is untouched and a later start may work.
                let _ = self.inner.transition(id, SandboxEvent::Abort, |r| {
                    r.failure_reason = Some(format!("start failed: {e}"));
                });
                Err(e)
            }
        }
    }

    /// Boots the sandbox's VM on its existing disk and marks it running (`starting` or
    /// `rolling_back` → `running`).
    pub(crate) async fn boot_existing_disk(
        &self,
        id: &SandboxId,
    ) -> Result<SandboxRecord, NodeError> {
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let tpl = self.template(&rec.template)?;
        let config = self.inner.guest_config(id, &tpl)?;
        let pid = self.boot_in_place(&rec, &tpl, &config).await?;
        let rec = self.inner.transition(id, SandboxEvent::Done, |r| {
            r.vmm_pid = Some(pid);
            r.vm_name = None;
            r.origin = VmOrigin::Boot;
            r.failure_reason = None;
            r.paused_by = None;
            r.stopped_by = None;
        })?;
        tracing::info!(%id, "sandbox booted on its disk");
        Ok(rec)
    }

    /// Boots `rec`'s VM on the disk already in its directory, with `config`, and watches
    /// it; returns the VMM's pid. A VM that does not come up is killed.
    pub(crate) async fn boot_in_place(
        &self,
        rec: &SandboxRecord,
        tpl: &TemplateInfo,
        config: &GuestConfig,
    ) -> Result<u32, NodeError> {
        let id = &rec.id;
        let disk = self.inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE);
        let (vm, guest) = match self
            .boot(
                id.as_str(),
                tpl,
                &rec.resources,
                &disk,
                ExistingDisk::Replace,
                config,
                true,
            )
            .await
        {
            Ok(v) => v,
            Err((e, vm)) => {
                if let Some(vm) = vm {
                    let _ = self.inner.nm.kill_vm(&vm).await;
                }
                return Err(e);
            }
        };
        let pid = vm.pid();
        self.attach(id, Arc::new(vm), Some(guest));
        Ok(pid)
    }
}

impl Inner {
    /// The configuration a freshly booted or new guest of sandbox `id` gets: its id as
    /// hostname, its env, its CA to trust, its network, the clock. The root file system is
    /// not grown. (Credential placeholders are not configured: each process start gets the
    /// current ones, see [`Inner::placeholder_env`].)
    pub(crate) fn guest_config(
        &self,
        id: &SandboxId,
        tpl: &TemplateInfo,
    ) -> Result<GuestConfig, NodeError> {
        // The template's env (an image's `Env`) below the sandbox's own.
        let mut env = tpl.env.clone();
        env.extend(
            self.lock()
                .get(id)
                .map(|e| e.record.env.clone())
                .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?,
        );
        let trusted_ca_pem = self.guest_trust(id)?;
        Ok(GuestConfig {
            hostname: id.to_string(),
            env,
            default_user: tpl.default_user.clone(),
            default_workdir: tpl.workdir.clone(),
            resize_root: false,
            time_unix_ms: now_ms(),
            network: self.guest_network(),
            trusted_ca_pem,
        })
    }
}

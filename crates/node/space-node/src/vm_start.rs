//! Bringing a sandbox's VM to "exec-ready": connecting to its daemon, making a restored VM
//! unique, and configuring it. Shared by every way a VM starts (boot, memory image, pool
//! member, checkpoint).

use std::path::Path;
use std::time::Duration;

use rand::RngCore;
use space_guest_client::{GuestClient, GuestError};
use space_guest_proto::{GuestConfig, IdentityRequest};
use space_vmm::Vm;

use crate::sandbox_manager::Inner;
use crate::sealing::ArtifactSeal;
use crate::NodeError;

/// Bound on loading a saved state into a VM (a checkpoint of a few GiB under TCG).
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// Saved state a VM starts from (launched with a [`space_vmm::RestoreFrom`] of the same
/// `ignore_shared`).
pub(crate) struct SavedState<'a> {
    pub path: &'a Path,
    /// Saved with `x-ignore-shared`: RAM comes from the VM's memory image.
    pub ignore_shared: bool,
    /// Leave the VM paused once loaded (to save it again, e.g. into a fork image).
    pub paused: bool,
    /// The key of a sealed state ([`crate::sealing::ArtifactKeys::opener_of_state`]).
    pub open: Option<ArtifactSeal>,
}

/// The one way a launched VM gets its saved state (a memory image, a checkpoint, a fork's):
/// fed in by this process, opened on the way when sealed, checked whole, then the guest
/// resumed unless `paused`. A VM whose state did not load is discarded.
pub(crate) async fn load_saved_state(
    inner: &Inner,
    vm: Vm,
    state: SavedState<'_>,
) -> Result<Vm, NodeError> {
    let loaded = async {
        crate::sealing::feed_state(
            &vm,
            state.path,
            state.ignore_shared,
            state.open,
            LOAD_TIMEOUT,
        )
        .await?;
        if !state.paused {
            vm.resume().await?;
        }
        Ok::<_, NodeError>(())
    }
    .await;
    match loaded {
        Ok(()) => Ok(vm),
        Err(e) => {
            tracing::warn!(vm = %vm.name(), state = %state.path.display(), error = %e, "saved state did not load; discarding the VM");
            let run_dir = vm.paths().run_dir.clone();
            inner.discard_vm(&vm, &run_dir).await;
            Err(e)
        }
    }
}

/// Bytes of host entropy a restored guest mixes into its kernel RNG.
const IDENTITY_ENTROPY_BYTES: usize = 64;

/// Health-probe timeout of each successive session tried: a session that completed the
/// handshake but does not answer is replaced by a fresh one (seen after restores under
/// load, a few in a hundred, cause not found yet; and after node restarts: the handshake
/// resynchronises the port each time). A healthy probe answers in tens of ms, so the first
/// timeout is short: a false alarm costs one more handshake (~20 ms), a stall costs it all.
const PROBE_TIMEOUTS: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(3),
    Duration::from_secs(6),
    Duration::from_secs(15),
];

/// [`connect_ready`] for a VM just restored from saved state (memory image, checkpoint,
/// fork): one throwaway handshake first ([`park`]). Observed on every restore since VMs
/// have a NIC: the first session after a restore completes its handshake and then never
/// answers HTTP/2 (8 s probes stalled as surely as 1 s ones), while the next session
/// answers at once. Likely cause (not proven): every save follows a [`park`], whose
/// disconnect the guest kernel may not have processed when the VM stopped; after the
/// restore that stale "host gone" reaches the daemon as EOF *after* the new host's
/// handshake, ending the fresh HTTP/2 session, so the host's requests land in the next
/// handshake scan. The throwaway handshake absorbs the stale EOF. A handshake that is
/// dropped costs ~20 ms, a stalled probe a second.
pub(crate) async fn connect_restored(vm: &Vm, timeout: Duration) -> Result<GuestClient, NodeError> {
    park(vm).await;
    connect_ready(vm, timeout).await
}

/// Connects to the VM's daemon and checks the session answers, trying fresh sessions when
/// one stalls; fails early (with the VM's own reason) if the VM exits.
pub(crate) async fn connect_ready(vm: &Vm, timeout: Duration) -> Result<GuestClient, NodeError> {
    let channel = vm.paths().channel.clone();
    let attempts = async {
        let mut last = None;
        for probe in PROBE_TIMEOUTS {
            let t0 = std::time::Instant::now();
            match GuestClient::connect(&channel, timeout).await {
                Ok(guest) => match guest.with_timeouts(probe, probe).health().await {
                    Ok(_) => {
                        tracing::debug!(vm = %vm.name(), total_ms = t0.elapsed().as_millis() as u64, "guest session ready");
                        return Ok(guest);
                    }
                    // Dropping `guest` closes the session before the next one is opened
                    // (the channel socket takes one client at a time).
                    Err(e) => {
                        let console = space_vmm::console_tail(&vm.paths().console_log, 600)
                            .unwrap_or_default();
                        tracing::warn!(vm = %vm.name(), error = %e, %console, "guest session did not answer; opening a fresh one");
                        last = Some(e);
                    }
                },
                Err(e) => {
                    // A guest that never answers a handshake leaves no other trace: its
                    // console says whether the kernel or the daemon is the one stuck.
                    let console =
                        space_vmm::console_tail(&vm.paths().console_log, 1200).unwrap_or_default();
                    tracing::warn!(vm = %vm.name(), error = %e, %console, "guest channel never became ready");
                    return Err(NodeError::from(e));
                }
            }
        }
        Err(NodeError::from(last.unwrap_or_else(|| {
            space_guest_client::GuestError::Timeout("no session attempt was made".into())
        })))
    };
    tokio::select! {
        r = attempts => r,
        exit = vm.exited() => {
            // QEMU's own words say why (a lock, a bad device state, …).
            let vmm_log = space_vmm::console_tail(&vm.paths().vmm_log, 1024).unwrap_or_default();
            Err(NodeError::SandboxFailed(format!(
                "VM exited during start: {}; QEMU said: {}",
                exit.reason,
                vmm_log.trim()
            )))
        }
    }
}

/// Restored uniqueness: every VM restored from saved state (memory image, pool member, fork,
/// rollback, crash restore) shares its kernel RNG state with every other VM restored from
/// the same state. Fresh host entropy is mixed in and the RNG reseeded, and hostname and
/// clock set, before the sandbox is handed to anyone.
pub(crate) fn identity(hostname: &str) -> IdentityRequest {
    let mut entropy = [0u8; IDENTITY_ENTROPY_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut entropy);
    IdentityRequest::new(&entropy, hostname, crate::sandbox_manager::now_ms())
}

/// Makes a restored guest unique and configures it, in one round trip (the two requests
/// travel concurrently on the channel).
pub(crate) async fn make_unique_and_configure(
    guest: &GuestClient,
    config: &GuestConfig,
) -> Result<(), GuestError> {
    let id = identity(&config.hostname);
    let (a, b) = tokio::join!(guest.set_identity(&id), guest.configure(config));
    a.and(b)
}

/// How long parking a channel may take.
const PARK_TIMEOUT: Duration = Duration::from_secs(5);

/// Leaves the VM's daemon waiting for a fresh handshake before the VM is paused or saved
/// (see [`GuestClient::park`]); every client of the channel must be dropped first. A
/// failure is logged, not fatal: the next connection then only takes longer.
pub(crate) async fn park(vm: &Vm) {
    if let Err(e) = GuestClient::park(&vm.paths().channel, PARK_TIMEOUT).await {
        tracing::warn!(vm = %vm.name(), error = %e, "cannot park the guest channel");
    }
}

//! Issue 17's figures on real VMs: what sealing a tenant's artifacts at rest under its
//! customer key costs. Two tenants on one machine (the single-machine default, its object
//! store a local directory), one with a customer key at the local key service and one
//! without, each with a 512 MiB sandbox holding 100 MiB of random data: a checkpoint (call
//! latency and the guest's pause), a rollback to it, a disk snapshot, a suspend and a resume
//! to exec-ready, alternating tenant
//! by tenant, sample by sample; and the envelope's own throughput sealing and opening a
//! saved state of that sandbox.
//!
//! Run with `sudo ./scripts/bench-sealing [samples]` (default 10). Prints percentiles and
//! the sealed/plain ratio of each median; every figure is measured.

use std::time::Instant;

use space_control::service::customer_keys::CustomerKeyRequest;
use space_core::sandbox::{CreateSandboxRequest, CreateSnapshotRequest, ResourcesRequest};
use space_core::{SandboxId, SnapshotKind};
use space_kms::{KeyCredentials, KmsConfig};
use test_support::bench::{exec_ok, ms, write_random};
use test_support::{percentile as pct, TestServer, TEST_TEMPLATE};

const MEMORY_MIB: u32 = 512;
const DISK_MIB: u32 = 1024;
const WRITTEN_MIB: u64 = 100;

/// One measured step, for both tenants.
#[derive(Default)]
struct Pair {
    plain: Vec<f64>,
    sealed: Vec<f64>,
}

impl Pair {
    fn push(&mut self, sealed: bool, v: f64) {
        if sealed {
            self.sealed.push(v)
        } else {
            self.plain.push(v)
        }
    }

    fn report(&mut self, name: &str) {
        let (p, s) = (&mut self.plain, &mut self.sealed);
        let (p50, s50) = (pct(p, 0.5), pct(s, 0.5));
        println!(
            "{name:<34} plain p50={p50:>8.1} p90={:>8.1}   sealed p50={s50:>8.1} p90={:>8.1}   ratio {:>5.2}",
            pct(p, 0.9),
            pct(s, 0.9),
            s50 / p50
        );
    }
}

async fn sandbox(c: &space_cli::client::SpaceClient) -> SandboxId {
    let sb = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            resources: ResourcesRequest {
                vcpus: None,
                memory_mib: Some(MEMORY_MIB),
                disk_mib: Some(DISK_MIB),
            },
            ..Default::default()
        })
        .await
        .expect("create");
    write_random(c, &sb.id, WRITTEN_MIB).await;
    sb.id
}

/// Seals and opens a copy of a real saved state (`state`, plaintext) `samples` times:
/// MiB/s each way.
fn envelope_throughput(state: &std::path::Path, samples: usize) -> (Vec<f64>, Vec<f64>) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (sealed, opened) = (dir.path().join("sealed"), dir.path().join("opened"));
    let mib = std::fs::metadata(state).expect("state").len() as f64 / (1 << 20) as f64;
    let key = space_envelope::DataKey::generate();
    let (mut seal, mut open) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let t = Instant::now();
        space_envelope::seal_file(&key, "bench/vm.state", state, &sealed).expect("seal");
        seal.push(mib / t.elapsed().as_secs_f64());
        let t = Instant::now();
        space_envelope::open_file(&key, "bench/vm.state", &sealed, &opened).expect("open");
        open.push(mib / t.elapsed().as_secs_f64());
    }
    (seal, open)
}

/// The directory of snapshot `snap` somewhere under `dir`.
fn snapshot_dir(dir: &std::path::Path, snap: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == snap && path.join(space_storage::SNAPSHOT_META_FILE).is_file() {
            return Some(path);
        }
        if let Some(found) = snapshot_dir(&path, snap) {
            return Some(found);
        }
    }
    None
}

/// The saved state of snapshot `snap` somewhere under `dir`.
fn saved_state(dir: &std::path::Path, snap: &str) -> Option<std::path::PathBuf> {
    snapshot_dir(dir, snap)
        .map(|d| d.join(space_storage::SNAPSHOT_STATE_FILE))
        .filter(|s| s.is_file())
}

/// Waits until snapshot `snap`'s disk is as it stays at rest: sealed (its reflink gone) for
/// a sandbox sealed at rest, at once for another.
async fn until_at_rest(dir: &std::path::Path, snap: &str, is_sealed: bool) {
    if !is_sealed {
        return;
    }
    loop {
        if let Some(d) = snapshot_dir(dir, snap) {
            if d.join(space_storage::SNAPSHOT_SEALED_DISK_FILE).is_file()
                && !d.join(space_storage::SNAPSHOT_DISK_FILE).exists()
            {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    test_support::init_logging();
    let samples: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("samples: a number"))
        .unwrap_or(10);
    let local_keys = tempfile::tempdir().expect("temporary directory");
    let config = KmsConfig::local_only(local_keys.path());
    let ts = TestServer::start_with(|c| c.key_services = config).await;
    let plain = ts.new_tenant_client("bench-plain").await;
    let sealed = ts.new_tenant_client("bench-sealed").await;
    sealed
        .set_customer_key(&CustomerKeyRequest {
            provider: "local".into(),
            key_id: None,
            token: None,
            credentials: KeyCredentials::None,
        })
        .await
        .expect("customer key");
    let ids = [sandbox(&plain).await, sandbox(&sealed).await];
    println!(
        "sandbox: {MEMORY_MIB} MiB RAM, {DISK_MIB} MiB disk, {WRITTEN_MIB} MiB of random data written; one tenant without a customer key (plain), one with one at the local key service (sealed); {samples} samples each, alternating; ms"
    );
    let checkpoint = CreateSnapshotRequest {
        kind: SnapshotKind::Checkpoint,
        ..Default::default()
    };
    let disk_snapshot = CreateSnapshotRequest {
        kind: SnapshotKind::Disk,
        ..Default::default()
    };
    let (mut taken_at_rest, mut disk_at_rest) = (Pair::default(), Pair::default());
    let (mut taken, mut paused, mut rollback, mut disk, mut suspend, mut resume) = (
        Pair::default(),
        Pair::default(),
        Pair::default(),
        Pair::default(),
        Pair::default(),
        Pair::default(),
    );
    for _ in 0..samples {
        for (c, id, is_sealed) in [(&plain, &ids[0], false), (&sealed, &ids[1], true)] {
            let t = Instant::now();
            let snap = c
                .create_snapshot(id, &checkpoint)
                .await
                .expect("checkpoint");
            taken.push(is_sealed, ms(t.elapsed()));
            paused.push(is_sealed, snap.guest_pause_ms.unwrap_or(0) as f64);
            until_at_rest(&ts.data_dir, snap.snapshot.id.as_str(), is_sealed).await;
            taken_at_rest.push(is_sealed, ms(t.elapsed()));
            let t = Instant::now();
            c.rollback(id, &snap.snapshot.id).await.expect("rollback");
            exec_ok(c, id).await;
            rollback.push(is_sealed, ms(t.elapsed()));
            c.delete_snapshot(id, &snap.snapshot.id)
                .await
                .expect("delete");
            let t = Instant::now();
            let snap = c
                .create_snapshot(id, &disk_snapshot)
                .await
                .expect("disk snapshot");
            disk.push(is_sealed, ms(t.elapsed()));
            until_at_rest(&ts.data_dir, snap.snapshot.id.as_str(), is_sealed).await;
            disk_at_rest.push(is_sealed, ms(t.elapsed()));
            c.delete_snapshot(id, &snap.snapshot.id)
                .await
                .expect("delete");
            let t = Instant::now();
            c.suspend_sandbox(id).await.expect("suspend");
            suspend.push(is_sealed, ms(t.elapsed()));
            let t = Instant::now();
            c.resume_sandbox(id).await.expect("resume");
            exec_ok(c, id).await;
            resume.push(is_sealed, ms(t.elapsed()));
        }
    }
    taken.report("checkpoint (call)");
    paused.report("checkpoint (guest paused)");
    taken_at_rest.report("checkpoint, until its disk is sealed at rest");
    rollback.report("rollback to the checkpoint, to exec-ready");
    disk.report("disk snapshot (call)");
    disk_at_rest.report("disk snapshot, until sealed at rest");
    suspend.report("suspend to the local store");
    resume.report("resume to exec-ready");

    // The envelope alone, on a saved state of the plain sandbox (plaintext on disk).
    let snap = plain
        .create_snapshot(&ids[0], &checkpoint)
        .await
        .expect("checkpoint");
    let state =
        saved_state(&ts.data_dir, snap.snapshot.id.as_str()).expect("the checkpoint's saved state");
    let mib = std::fs::metadata(&state).expect("state").len() >> 20;
    let (mut seal, mut open) = envelope_throughput(&state, samples);
    println!(
        "envelope on that saved state ({mib} MiB): seal p50={:.0} p90(slowest)={:.0} MiB/s, open p50={:.0} p90(slowest)={:.0} MiB/s",
        pct(&mut seal, 0.5),
        pct(&mut seal, 0.1),
        pct(&mut open, 0.5),
        pct(&mut open, 0.1)
    );
    ts.stop().await;
}

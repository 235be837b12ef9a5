//! Issue 15's figures on real VMs: suspend to object storage, and resume on another node to
//! exec-ready, of a 512 MiB sandbox with 100 MiB of data written (a cluster of two node
//! processes in namespaces of their own, one replica, PostgreSQL and a private Garage);
//! bytes uploaded against guest RAM plus disk written; on the single-machine default, a
//! suspend and resume through the local store against a plain pause and resume; and a
//! persistent checkpoint kept in object storage against one kept on the node.
//!
//! Run with `sudo ./scripts/bench-suspend [samples]` (default 10). Prints percentiles;
//! every figure is measured.

use std::time::Instant;

use space_core::sandbox::{CreateSandboxRequest, ResourcesRequest};
use space_core::{SandboxId, SandboxState};
use space_node_proto::StoredSnapshot;
use test_support::cluster::Cluster;
use test_support::{TestServer, TEST_TEMPLATE};

const MEMORY_MIB: u32 = 512;
const DISK_MIB: u32 = 1024;
const WRITTEN_MIB: u64 = 100;

use test_support::bench::{exec_ok, ms, write_random};
use test_support::percentile as pct;

fn report(name: &str, samples: &mut [f64], unit: &str) {
    let (p50, p90) = (pct(samples, 0.5), pct(samples, 0.9));
    let max = samples.iter().cloned().fold(f64::NAN, f64::max);
    println!(
        "{name:<52} n={:<3} p50={p50:>9.1}{unit} p90={p90:>9.1}{unit} max={max:>9.1}{unit}",
        samples.len()
    );
}

fn request() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        resources: ResourcesRequest {
            vcpus: None,
            memory_mib: Some(MEMORY_MIB),
            disk_mib: Some(DISK_MIB),
        },
        ..Default::default()
    }
}

/// What the stored snapshot sandbox `id` is suspended in uploaded.
async fn stored(st: &space_control::AppState, id: &SandboxId) -> StoredSnapshot {
    let row = st
        .db
        .sandbox_any_tenant(id)
        .await
        .expect("db")
        .expect("row");
    let snap = row.suspended_snapshot.expect("suspended");
    st.db
        .stored_snapshot(&snap)
        .await
        .expect("db")
        .and_then(|s| s.manifest)
        .expect("committed")
}

#[derive(Default)]
struct Uploads {
    total_mib: Vec<f64>,
    memory_mib: Vec<f64>,
    disk_mib: Vec<f64>,
    ratio_pct: Vec<f64>,
}

impl Uploads {
    fn add(&mut self, s: &StoredSnapshot) {
        let size = |name: &str| {
            s.artifacts
                .iter()
                .filter(|a| a.name == name)
                .map(|a| a.size)
                .sum::<u64>() as f64
                / (1 << 20) as f64
        };
        let total: f64 = s.artifacts.iter().map(|a| a.size).sum::<u64>() as f64 / (1 << 20) as f64;
        self.total_mib.push(total);
        self.memory_mib
            .push(size(space_node_proto::snapshot::artifacts::MEMORY));
        self.disk_mib
            .push(size(space_node_proto::snapshot::artifacts::DISK));
        self.ratio_pct
            .push(100.0 * total / (MEMORY_MIB as f64 + WRITTEN_MIB as f64));
    }

    fn report(&mut self, label: &str) {
        report(
            &format!("{label}: uploaded, all artifacts"),
            &mut self.total_mib,
            " MiB",
        );
        report(
            &format!("{label}: uploaded, memory"),
            &mut self.memory_mib,
            " MiB",
        );
        report(
            &format!("{label}: uploaded, disk delta"),
            &mut self.disk_mib,
            " MiB",
        );
        report(
            &format!("{label}: uploaded / (RAM {MEMORY_MIB} + written {WRITTEN_MIB} MiB)"),
            &mut self.ratio_pct,
            " %",
        );
    }
}

async fn across_nodes(samples: usize) {
    let cluster = Cluster::start_with_objects(1, 2).await;
    let c = cluster.clients[0].clone();
    let st = cluster.replicas[0].state().clone();
    c.set_node_cordoned("node-b", true).await.expect("cordon");
    let sb = c.create_sandbox(&request()).await.expect("create");
    c.set_node_cordoned("node-b", false)
        .await
        .expect("uncordon");
    write_random(&c, &sb.id, WRITTEN_MIB).await;
    let (mut suspend, mut resume) = (Vec::new(), Vec::new());
    let mut uploads = Uploads::default();
    let mut on = sb.node.clone();
    for i in 0..samples {
        let t = Instant::now();
        let s = c.suspend_sandbox(&sb.id).await.expect("suspend");
        suspend.push(ms(t.elapsed()));
        assert_eq!(s.state, SandboxState::Suspended);
        uploads.add(&stored(&st, &sb.id).await);
        // The resume must land on the other node.
        let other = if on == "node-a" { "node-b" } else { "node-a" };
        c.set_node_cordoned(&on, true).await.expect("cordon");
        c.set_node_cordoned(other, false).await.expect("uncordon");
        let t = Instant::now();
        let r = c.resume_sandbox(&sb.id).await.expect("resume");
        exec_ok(&c, &sb.id).await;
        resume.push(ms(t.elapsed()));
        assert_eq!(r.node, other, "sample {i}");
        on = other.to_owned();
    }
    println!("\n-- across nodes: 2 node processes, S3 (Garage), PostgreSQL --");
    report(
        "suspend (pause, checkpoint, upload, commit, free)",
        &mut suspend,
        " ms",
    );
    report("resume on the other node to exec-ready", &mut resume, " ms");
    uploads.report("suspend");
    cluster.stop().await;
}

async fn one_machine(samples: usize) {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let st = ts.server().state().clone();
    let sb = c.create_sandbox(&request()).await.expect("create");
    write_random(c, &sb.id, WRITTEN_MIB).await;
    let (mut suspend, mut resume, mut pause, mut unpause) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut uploads = Uploads::default();
    for _ in 0..samples {
        // Alternating, sample by sample: the same machine state for both.
        let t = Instant::now();
        c.suspend_sandbox(&sb.id).await.expect("suspend");
        suspend.push(ms(t.elapsed()));
        uploads.add(&stored(&st, &sb.id).await);
        let t = Instant::now();
        c.resume_sandbox(&sb.id).await.expect("resume");
        exec_ok(c, &sb.id).await;
        resume.push(ms(t.elapsed()));

        let t = Instant::now();
        c.pause_sandbox(&sb.id).await.expect("pause");
        pause.push(ms(t.elapsed()));
        let t = Instant::now();
        c.resume_sandbox(&sb.id).await.expect("resume");
        exec_ok(c, &sb.id).await;
        unpause.push(ms(t.elapsed()));
    }
    println!("\n-- one machine: the local store (DATA_DIR/objects) --");
    report("suspend to the local store", &mut suspend, " ms");
    report(
        "resume from the local store to exec-ready",
        &mut resume,
        " ms",
    );
    report("pause (memory stays resident)", &mut pause, " ms");
    report("resume after pause to exec-ready", &mut unpause, " ms");
    uploads.report("local suspend");
    ts.stop().await;
}

/// A persistent checkpoint kept in object storage (`snapshot_storage: object_store`: taken
/// on the node, uploaded while the sandbox runs on) against one kept on the node only: the
/// call's latency and the guest's pause. The pause is also what a stored checkpoint of
/// `on_node_loss: restore` costs the guest now; before, that one went the suspend path and
/// paused the guest for the whole upload (the suspend figures above).
async fn stored_snapshots(samples: usize) {
    use space_core::sandbox::{CreateSnapshotRequest, SnapshotStorage};
    let ts = TestServer::start().await;
    let c = &ts.client;
    let stored_sb = c
        .create_sandbox(&CreateSandboxRequest {
            snapshot_storage: SnapshotStorage::ObjectStore,
            ..request()
        })
        .await
        .expect("create");
    let node_sb = c.create_sandbox(&request()).await.expect("create");
    write_random(c, &stored_sb.id, WRITTEN_MIB).await;
    write_random(c, &node_sb.id, WRITTEN_MIB).await;
    let req = CreateSnapshotRequest {
        kind: space_core::SnapshotKind::Checkpoint,
        label: None,
        persistent: true,
    };
    let (mut stored_ms, mut stored_pause, mut node_ms, mut node_pause) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        for (id, total, pause, stored) in [
            (&stored_sb.id, &mut stored_ms, &mut stored_pause, true),
            (&node_sb.id, &mut node_ms, &mut node_pause, false),
        ] {
            let t = Instant::now();
            let taken = c.create_snapshot(id, &req).await.expect("snapshot");
            total.push(ms(t.elapsed()));
            assert_eq!(taken.snapshot.stored, stored);
            pause.push(taken.guest_pause_ms.unwrap_or(0) as f64);
            c.delete_tenant_snapshot(&taken.snapshot.id)
                .await
                .expect("delete");
        }
    }
    println!(
        "
-- persistent checkpoints, one machine (the local store) --"
    );
    report("in object storage too: the call", &mut stored_ms, " ms");
    report(
        "in object storage too: guest paused",
        &mut stored_pause,
        " ms",
    );
    report("on the node only: the call", &mut node_ms, " ms");
    report("on the node only: guest paused", &mut node_pause, " ms");
    ts.stop().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    test_support::init_logging();
    let samples: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("samples: a number"))
        .unwrap_or(10);
    println!(
        "sandbox: {MEMORY_MIB} MiB RAM, {DISK_MIB} MiB disk, {WRITTEN_MIB} MiB of random data written; {samples} samples each"
    );
    across_nodes(samples).await;
    one_machine(samples).await;
    stored_snapshots(samples).await;
}

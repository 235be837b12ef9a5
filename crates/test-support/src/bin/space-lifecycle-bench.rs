//! Benchmark of issue 3's figures on real VMs: create latency from the warm pool, from the
//! memory image (pool miss) and by cold boot; disk snapshot on 1 GiB and 8 GiB disks;
//! guest-visible pause of a checkpoint; resume after pause; fork into 10; host memory of 20
//! idle sandboxes restored from an image versus 20 booted; crash recovery.
//!
//! Run with `sudo ./scripts/bench-lifecycle` (builds, then runs this binary). Prints
//! percentiles; every figure is measured, none is configured.

use std::time::{Duration, Instant};

use futures::StreamExt;
use space_core::process::ProcessSpec;
use space_core::sandbox::{CreateSandboxRequest, ResourcesRequest};
use space_core::{SandboxId, SandboxState, SnapshotTrigger};
use space_node::{Node, PauseCause, VmOrigin};
use test_support::{TestServer, TEST_TEMPLATE};

const CREATES: usize = 100;
const CONCURRENCY: usize = 4;
const MISS_CREATES: usize = 20;
const COLD_CREATES: usize = 8;
const SNAPSHOTS: usize = 20;
const CHECKPOINTS: usize = 10;
const RESUMES: usize = 20;
const FORK_CHILDREN: usize = 10;
const IDLE_VMS: usize = 20;
const CRASHES: usize = 5;

use test_support::bench::{exec_ok, ms};
use test_support::percentile as pct;

fn report(name: &str, samples: &mut [f64], unit: &str, target: &str) {
    let (p50, p90) = (pct(samples, 0.5), pct(samples, 0.9));
    let max = samples.iter().cloned().fold(f64::NAN, f64::max);
    println!(
        "{name:<44} n={:<4} p50={p50:>8.1}{unit} p90={p90:>8.1}{unit} max={max:>8.1}{unit}   target {target}",
        samples.len()
    );
}

fn request(memory_mib: Option<u32>, disk_mib: Option<u32>) -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        resources: ResourcesRequest {
            vcpus: None,
            memory_mib,
            disk_mib,
        },
        ..Default::default()
    }
}

async fn server(adjust: impl FnOnce(&mut space_control::ServerConfig)) -> TestServer {
    TestServer::start_with(|c| {
        // Nodes-only operations (fork) make sandboxes the database does not know.
        c.run_reconciler = false;
        adjust(c);
    })
    .await
}

/// Sum of the proportional set size of the VMM processes: shared pages count once.
fn pss_mib(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .sum::<f64>()
        / 1024.0
}

/// Space used in the store's file system, after a sync: btrfs frees deleted files' extents
/// only when the transaction commits, so an unsynced figure counts files already gone.
fn store_used_mib(ts: &TestServer) -> f64 {
    let root = ts.server().local_node().store().root().to_owned();
    if let Ok(dir) = std::fs::File::open(&root) {
        let _ = nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir));
    }
    let s = nix::sys::statvfs::statvfs(&root).expect("statvfs");
    ((s.blocks() - s.blocks_free()) as f64 * s.fragment_size() as f64) / (1 << 20) as f64
}

async fn wait_pool(node: &Node, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if node.pool_status().iter().map(|p| p.ready).sum::<usize>() >= want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("pool did not reach {want} members");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    println!(
        "SPACE lifecycle benchmark ({}; accel {})",
        TEST_TEMPLATE,
        space_vmm::detect_accel()
    );
    // Parts to run: `creates`, `ops`, `memory` (default: all).
    let parts: Vec<String> = std::env::args().skip(1).collect();
    let run = |p: &str| parts.is_empty() || parts.iter().any(|a| a == p);
    if run("creates") {
        create_from_pool().await;
        let miss_p50 = create_pool_miss().await;
        let cold_p50 = create_cold().await;
        println!(
            "{:<44} {:.1}x  (cold p50 {cold_p50:.0} ms / pool-miss p50 {miss_p50:.0} ms)   target >= 10x",
            "cold boot / memory image restore",
            cold_p50 / miss_p50
        );
    }
    if run("ops") {
        operations().await;
    }
    if run("memory") {
        memory_of_idle_sandboxes().await;
    }
    // Not in the default set: it runs two nodes side by side.
    if parts.iter().any(|a| a == "jail") {
        side_by_side(Comparison::Jail).await;
    }
    if parts.iter().any(|a| a == "node-manager") {
        node_manager_round_trip();
        side_by_side(Comparison::NodeManager).await;
    }
}

const JAIL_POOL: usize = 6;
const JAIL_ROUNDS: usize = 8;
const JAIL_SAMPLES: usize = 40;
const JAIL_CHECKPOINTS: usize = 10;
const JAIL_FORKS: usize = 6;

/// A 512 MiB sandbox with 64 MiB of its memory in use (for checkpoints, resumes, forks).
async fn busy_sandbox(ts: &TestServer) -> SandboxId {
    let sb = ts
        .client
        .create_sandbox(&request(Some(512), None))
        .await
        .expect("create");
    ts.client
        .run(
            &sb.id,
            &ProcessSpec::shell("dd if=/dev/urandom of=/dev/shm/m bs=1M count=64 2>/dev/null"),
        )
        .await
        .expect("use memory");
    sb.id
}

/// Milliseconds of one default create; the sandbox is then proved exec-ready and deleted
/// (not timed).
async fn timed_create(ts: &TestServer) -> f64 {
    let t = Instant::now();
    let sb = ts
        .client
        .create_sandbox(&request(None, None))
        .await
        .expect("create");
    let took = ms(t.elapsed());
    exec_ok(&ts.client, &sb.id).await;
    ts.client
        .delete_sandbox(sb.id.as_str())
        .await
        .expect("delete");
    took
}

/// Two nodes set up alike but for one thing, measured side by side.
#[derive(Clone, Copy)]
enum Comparison {
    /// VMMs unjailed vs jailed (privileged work in the node's process, for both).
    Jail,
    /// Privileged work in the node's process vs through a `space node-manager` process
    /// (VMMs jailed, for both).
    NodeManager,
}

impl Comparison {
    fn labels(self) -> [&'static str; 2] {
        match self {
            Comparison::Jail => ["unjailed", "jailed"],
            Comparison::NodeManager => ["in-process", "node manager"],
        }
    }

    /// Side `i`'s configuration.
    fn adjust(self, i: usize, c: &mut space_control::ServerConfig) {
        let via_node_manager = matches!(self, Comparison::NodeManager) && i == 1;
        if !via_node_manager {
            test_support::node_manager::stop_for_data_dir(&c.node.data_dir);
            c.node.node_manager = None;
        }
        c.node.vmm_jail = !matches!(self, Comparison::Jail) || i == 1;
    }
}

/// Two nodes of `cmp` (in the order of its labels) with `pool` warm members per shape,
/// each with its memory image built.
async fn jail_pair(pool: usize, cmp: Comparison) -> (Vec<TestServer>, Vec<Node>) {
    let mut sides = Vec::new();
    for i in 0..2 {
        let ts = server(|c| {
            cmp.adjust(i, c);
            c.node.pool_size = pool;
        })
        .await;
        // The first create builds the memory image.
        timed_create(&ts).await;
        sides.push(ts);
    }
    let nodes = sides
        .iter()
        .map(|ts| ts.server().local_node().clone())
        .collect();
    (sides, nodes)
}

/// What the VMM jail (or the node manager's process boundary) costs: the same operations on
/// the two nodes of `cmp`, run at the same time and alternated operation by operation, so
/// drift of the host hits both alike.
async fn side_by_side(cmp: Comparison) {
    let (sides, nodes) = jail_pair(JAIL_POOL, cmp).await;
    let mut figures: Vec<(&str, [Vec<f64>; 2])> = Vec::new();

    // Creates from a full pool: wait for both pools, then alternate creates.
    let mut pool = [Vec::new(), Vec::new()];
    for _ in 0..JAIL_ROUNDS {
        for n in &nodes {
            wait_pool(n, JAIL_POOL).await;
        }
        for _ in 0..JAIL_POOL {
            for (i, ts) in sides.iter().enumerate() {
                pool[i].push(timed_create(ts).await);
            }
        }
    }
    figures.push(("create from the pool", pool));
    for ts in sides {
        ts.stop().await;
    }
    // Creates that miss the pool restore from the memory image: nodes without a pool.
    let (sides, nodes) = jail_pair(0, cmp).await;
    let mut image = [Vec::new(), Vec::new()];
    for _ in 0..JAIL_SAMPLES {
        for (i, ts) in sides.iter().enumerate() {
            image[i].push(timed_create(ts).await);
        }
    }
    figures.push(("create from the memory image", image));
    let mut sandboxes = Vec::new();
    for ts in &sides {
        sandboxes.push(busy_sandbox(ts).await);
    }
    let mut resume = [Vec::new(), Vec::new()];
    for _ in 0..JAIL_SAMPLES {
        for (i, n) in nodes.iter().enumerate() {
            n.pause_sandbox(&sandboxes[i], PauseCause::User)
                .await
                .expect("pause");
            let t = Instant::now();
            n.resume_sandbox(&sandboxes[i]).await.expect("resume");
            resume[i].push(ms(t.elapsed()));
        }
    }
    figures.push(("resume after pause", resume));
    let mut checkpoint = [Vec::new(), Vec::new()];
    for _ in 0..JAIL_CHECKPOINTS {
        for (i, n) in nodes.iter().enumerate() {
            let t = Instant::now();
            let c = n
                .checkpoint(&sandboxes[i], None, SnapshotTrigger::Manual, None)
                .await
                .expect("checkpoint");
            checkpoint[i].push(ms(t.elapsed()));
            n.delete_snapshot(&sandboxes[i], &c.info.id)
                .await
                .expect("delete snapshot");
        }
    }
    figures.push(("checkpoint 512 MiB (whole operation)", checkpoint));
    let mut fork = [Vec::new(), Vec::new()];
    for _ in 0..JAIL_FORKS {
        for (i, n) in nodes.iter().enumerate() {
            let children: Vec<SandboxId> =
                (0..FORK_CHILDREN).map(|_| SandboxId::generate()).collect();
            let t = Instant::now();
            n.fork(&sandboxes[i], &children, None).await.expect("fork");
            fork[i].push(ms(t.elapsed()));
            for c in &children {
                let _ = n.delete_sandbox(c).await;
            }
        }
    }
    figures.push(("fork into 10", fork));

    let [a, b] = cmp.labels();
    println!("{a} vs {b}, alternated in one run (ms)");
    for (name, [mut off, mut on]) in figures {
        let (off50, off90) = (pct(&mut off, 0.5), pct(&mut off, 0.9));
        let (on50, on90) = (pct(&mut on, 0.5), pct(&mut on, 0.9));
        println!(
            "{name:<38} n={:<3} {a} p50={off50:>7.1} p90={off90:>7.1}   {b} p50={on50:>7.1} p90={on90:>7.1}   p50 {:+.1} %  p90 {:+.1} %   target <= +10 %",
            on.len(),
            (on50 / off50 - 1.0) * 100.0,
            (on90 / off90 - 1.0) * 100.0,
        );
    }
    for ts in sides {
        ts.stop().await;
    }
}

/// 100 creates at concurrency 4 with the default pool; each create is followed by an exec
/// (to prove it is exec-ready) and a delete, neither of them timed.
async fn create_from_pool() {
    // The production default (tests run without a pool).
    let ts = server(|c| c.node.pool_size = space_node::config::DEFAULT_POOL_SIZE).await;
    let node = ts.server().local_node().clone();
    // The first create builds the template's memory image; the pool then fills.
    let first = ts
        .client
        .create_sandbox(&request(None, None))
        .await
        .expect("first");
    ts.client
        .delete_sandbox(first.id.as_str())
        .await
        .expect("delete");
    let target = space_node::config::DEFAULT_POOL_SIZE;
    wait_pool(&node, target).await;
    let started = Instant::now();
    let queue = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers = (0..CONCURRENCY).map(|_| {
        let (ts, queue, node) = (&ts, queue.clone(), node.clone());
        async move {
            let mut out = Vec::new();
            while queue.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < CREATES {
                let t = Instant::now();
                let sb = ts
                    .client
                    .create_sandbox(&request(None, None))
                    .await
                    .expect("create");
                let latency = t.elapsed();
                let pooled = matches!(
                    node.sandbox(&sb.id).map(|r| r.origin),
                    Some(VmOrigin::TemplateImage { pooled: true })
                );
                exec_ok(&ts.client, &sb.id).await;
                ts.client
                    .delete_sandbox(sb.id.as_str())
                    .await
                    .expect("delete");
                out.push((ms(latency), pooled));
            }
            out
        }
    });
    let results: Vec<(f64, bool)> = futures::stream::iter(workers)
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .flatten()
        .collect();
    let hits = results.iter().filter(|r| r.1).count();
    let mut all: Vec<f64> = results.iter().map(|r| r.0).collect();
    let mut hit_lat: Vec<f64> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
    println!(
        "create -> exec-ready, {CREATES} creates at concurrency {CONCURRENCY}, pool of {target}: {hits} pool hits, {} misses, {:.1} s",
        results.len() - hits,
        started.elapsed().as_secs_f64()
    );
    report("  all creates", &mut all, " ms", "p50 <= 60, p90 <= 89");
    report("  pool hits only", &mut hit_lat, " ms", "-");
    ts.stop().await;
}

/// Creates restored from the memory image with no pool.
async fn create_pool_miss() -> f64 {
    let ts = server(|c| c.node.pool_size = 0).await;
    // The first create builds the memory image.
    timed_create(&ts).await;
    let mut lat = Vec::new();
    for _ in 0..MISS_CREATES {
        lat.push(timed_create(&ts).await);
    }
    let p50 = pct(&mut lat, 0.5);
    report(
        "create, pool miss (restore from image)",
        &mut lat,
        " ms",
        "p50 <= 250",
    );
    ts.stop().await;
    p50
}

/// Creates by cold boot (memory images off).
async fn create_cold() -> f64 {
    let ts = server(|c| {
        c.node.pool_size = 0;
        c.node.memory_images = false;
    })
    .await;
    let mut lat = Vec::new();
    for _ in 0..COLD_CREATES {
        let t = Instant::now();
        let sb = ts
            .client
            .create_sandbox(&request(None, None))
            .await
            .expect("create");
        lat.push(ms(t.elapsed()));
        ts.client
            .delete_sandbox(sb.id.as_str())
            .await
            .expect("delete");
    }
    let p50 = pct(&mut lat, 0.5);
    report("create, cold boot", &mut lat, " ms", "-");
    ts.stop().await;
    p50
}

async fn operations() {
    let ts = server(|_| {}).await;
    let node = ts.server().local_node().clone();

    // Disk snapshots of a 1 GiB and an 8 GiB disk, each with a counter running.
    let mut p50s = Vec::new();
    for gib in [1u32, 8] {
        let sb = ts
            .client
            .create_sandbox(&request(Some(512), Some(gib * 1024)))
            .await
            .expect("create");
        ts.client
            .run(
                &sb.id,
                &ProcessSpec::shell(
                    "dd if=/dev/urandom of=/home/user/f bs=1M count=32 2>/dev/null; sync",
                ),
            )
            .await
            .expect("fill");
        let mut lat = Vec::new();
        for _ in 0..SNAPSHOTS {
            let t = Instant::now();
            node.snapshot_disk(&sb.id, None, SnapshotTrigger::Manual, None)
                .await
                .expect("snapshot");
            lat.push(ms(t.elapsed()));
        }
        p50s.push(pct(&mut lat, 0.5));
        report(
            &format!("disk snapshot, {gib} GiB disk (VM not paused)"),
            &mut lat,
            " ms",
            "p50 <= 50",
        );
        ts.client
            .delete_sandbox(sb.id.as_str())
            .await
            .expect("delete");
    }
    println!(
        "{:<44} {:.2}x   target <= 1.5x",
        "disk snapshot 8 GiB / 1 GiB (p50)",
        p50s[1] / p50s[0]
    );

    // Checkpoints of a 512 MiB sandbox with some memory in use.
    let sb_id = busy_sandbox(&ts).await;
    let (mut pause, mut total, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..CHECKPOINTS {
        let t = Instant::now();
        match node
            .checkpoint(&sb_id, None, SnapshotTrigger::Manual, None)
            .await
        {
            Ok(c) => {
                total.push(ms(t.elapsed()));
                pause.push(c.guest_pause.map(ms).unwrap_or(f64::NAN));
                node.delete_snapshot(&sb_id, &c.info.id)
                    .await
                    .expect("delete snapshot");
            }
            Err(e) => failed.push(e.to_string()),
        }
    }
    if !failed.is_empty() {
        println!(
            "  {} of {CHECKPOINTS} checkpoints failed: {failed:?}",
            failed.len()
        );
    }
    report(
        "checkpoint 512 MiB, guest-visible pause",
        &mut pause,
        " ms",
        "p50 <= 300",
    );
    report(
        "checkpoint 512 MiB, whole operation",
        &mut total,
        " ms",
        "-",
    );

    // Pause / resume.
    let mut lat = Vec::new();
    for _ in 0..RESUMES {
        node.pause_sandbox(&sb_id, PauseCause::User)
            .await
            .expect("pause");
        let t = Instant::now();
        node.resume_sandbox(&sb_id).await.expect("resume");
        lat.push(ms(t.elapsed()));
    }
    report(
        "resume after pause (to exec-ready)",
        &mut lat,
        " ms",
        "p50 <= 50",
    );

    // Fork into 10.
    let before = store_used_mib(&ts);
    let children: Vec<SandboxId> = (0..FORK_CHILDREN).map(|_| SandboxId::generate()).collect();
    let t = Instant::now();
    let forked = node.fork(&sb_id, &children, None).await.expect("fork");
    let took = t.elapsed();
    let running = forked
        .iter()
        .filter(|r| r.state == SandboxState::Running)
        .count();
    let after = store_used_mib(&ts);
    // What the children hold that nobody shares: their disks' extents not shared with the
    // parent's (FIEMAP), i.e. what they wrote since the fork.
    let store = node.store();
    let exclusive: u64 = children
        .iter()
        .filter_map(|c| {
            space_storage::exclusive_bytes(
                &store.sandbox_dir(c).join(space_storage::SANDBOX_DISK_FILE),
            )
            .ok()
        })
        .sum();
    println!(
        "{:<44} {:.0} ms, {running}/{FORK_CHILDREN} running, extra disk {:+.1} MiB (store, synced), children's own extents {:.1} MiB   target <= 3000 ms, ~0",
        "fork of a running 512 MiB sandbox into 10",
        ms(took),
        after - before,
        exclusive as f64 / (1 << 20) as f64
    );
    for c in &children {
        let _ = node.delete_sandbox(c).await;
    }

    // Crash recovery: kill the VMM, time until it runs again (restored from a checkpoint).
    node.checkpoint(&sb_id, None, SnapshotTrigger::Manual, None)
        .await
        .expect("checkpoint");
    let mut lat = Vec::new();
    for _ in 0..CRASHES {
        let pid = node.sandbox(&sb_id).and_then(|r| r.vmm_pid).expect("pid");
        let t = Instant::now();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        loop {
            let r = node.sandbox(&sb_id).expect("record");
            if r.state == SandboxState::Running && r.vmm_pid.is_some_and(|p| p != pid) {
                break;
            }
            if r.state == SandboxState::Failed || t.elapsed() > Duration::from_secs(60) {
                panic!("crash restore failed: {r:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        exec_ok(&ts.client, &sb_id).await;
        lat.push(ms(t.elapsed()));
    }
    report(
        "crash recovery: VMM kill -> exec-ready",
        &mut lat,
        " ms",
        "<= 2000",
    );
    ts.stop().await;
}

/// Host memory (sum of PSS) of idle sandboxes restored from one image versus booted.
async fn memory_of_idle_sandboxes() {
    let mut results = Vec::new();
    for images in [true, false] {
        let ts = server(|c| {
            c.node.pool_size = 0;
            c.node.memory_images = images;
            // 20 one-vCPU sandboxes exceed the default 8x overcommit of a 2-core host.
            c.node.capacity = Some(space_core::NodeCapacity {
                vcpus: 64,
                memory_mib: 16 * 1024,
                disk_mib: 256 * 1024,
            });
        })
        .await;
        let node = ts.server().local_node().clone();
        let mut pids = Vec::new();
        for _ in 0..IDLE_VMS {
            let sb = ts
                .client
                .create_sandbox(&request(Some(512), None))
                .await
                .expect("create");
            pids.push(node.sandbox(&sb.id).and_then(|r| r.vmm_pid).expect("pid"));
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let mib = pss_mib(&pids);
        println!(
            "{:<44} {mib:.0} MiB total, {:.0} MiB each",
            format!(
                "{IDLE_VMS} idle sandboxes, {}",
                if images {
                    "restored from image"
                } else {
                    "cold-booted"
                }
            ),
            mib / IDLE_VMS as f64
        );
        results.push(mib);
        ts.stop().await;
    }
    println!(
        "{:<44} {:.2}   target <= 0.5",
        "memory restored / booted",
        results[0] / results[1]
    );
}

/// One request to `space node-manager` and its answer, on a pooled connection, against the
/// same operation done in-process (listing the node's network namespaces, a readdir).
fn node_manager_round_trip() {
    use space_node_manager::{LocalNodeManager, NodeManager, RemoteNodeManager};
    const ROUND_TRIPS: usize = 2000;
    let data_dir = test_support::new_data_dir();
    let socket = test_support::node_manager::for_data_dir(&data_dir);
    let remote = RemoteNodeManager::connect(&socket, &data_dir).expect("connect");
    let local =
        LocalNodeManager::qemu(&data_dir.join("run"), true, space_vmm::FileOwner::current());
    let prefix = space_node::network::netns_prefix(&data_dir.join("run"));
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..ROUND_TRIPS {
        for (i, nm) in [&local as &dyn NodeManager, &remote]
            .into_iter()
            .enumerate()
        {
            let t = Instant::now();
            std::hint::black_box(nm.vm_networks(&prefix));
            times[i].push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let [mut local_us, mut remote_us] = times;
    report(
        "node manager: vm_networks in-process",
        &mut local_us,
        "us",
        "-",
    );
    report(
        "node manager: vm_networks round trip",
        &mut remote_us,
        "us",
        "-",
    );
    test_support::cleanup_data_dir(&data_dir);
}

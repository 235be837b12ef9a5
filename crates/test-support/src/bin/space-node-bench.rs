//! Issue 14's figures: the node protocol against the in-process node, side by side in one
//! run on real VMs. The same node is reached two ways — directly (`space_node::Node` as a
//! `NodeApi`, the single-machine default) and through a node agent over mutual TLS on
//! loopback (`RemoteNode`, what a control plane on another machine uses) — and every sample
//! alternates between the two, so load and pool refills fall on both alike.
//!
//! - create: a sandbox from a ready warm-pool member (waited for, untimed), until its daemon
//!   answers; the delete that follows is untimed;
//! - exec: `true` started and its output stream read to the exit event;
//! - write: a 10 MiB file uploaded (MiB/s).
//!
//! Run with `sudo ./scripts/bench-node [samples]`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use space_cli::stats::summarize;
use space_core::process::{OutputEvent, ProcessSpec};
use space_core::{SandboxId, TenantId};
use space_guest_client::GuestClient;
use space_node_proto::api::NodeApi;
use space_node_proto::{CreateSandbox, SandboxSettings};
use test_support::node_agent::{upload_body, AgentFixture};
use test_support::{TestServer, TEST_TEMPLATE};

const POOL: usize = 2;
const WRITE_BYTES: usize = 10 * 1024 * 1024;

fn create_request() -> CreateSandbox {
    CreateSandbox {
        id: SandboxId::generate(),
        template: TEST_TEMPLATE.into(),
        template_digest: None,
        resources: Default::default(),
        settings: SandboxSettings::new(TenantId::generate()),
    }
}

async fn wait_pool(node: &dyn NodeApi) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let ready: usize = node
            .pool_status()
            .await
            .map(|p| p.iter().map(|s| s.ready).sum())
            .unwrap_or(0);
        if ready >= POOL {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("the pool did not fill");
}

async fn create(node: &dyn NodeApi) -> f64 {
    let req = create_request();
    let id = req.id.clone();
    let started = Instant::now();
    node.create_sandbox(req).await.expect("create");
    let took = started.elapsed().as_secs_f64() * 1000.0;
    node.delete(&id).await.expect("delete");
    took
}

async fn exec(guest: &GuestClient) -> f64 {
    let started = Instant::now();
    let info = guest
        .start_process(&ProcessSpec::shell("true"))
        .await
        .expect("start");
    let mut events = guest.output(info.id, None).await.expect("output");
    while let Some(ev) = events.next().await {
        if matches!(ev.expect("event"), OutputEvent::Exit { .. }) {
            break;
        }
    }
    started.elapsed().as_secs_f64() * 1000.0
}

async fn write(guest: &GuestClient, data: &Bytes, side: &str) -> f64 {
    let started = Instant::now();
    guest
        .write_file(
            "/home/user/bench.bin",
            None,
            None,
            &BTreeMap::new(),
            upload_body(data),
        )
        .await
        .unwrap_or_else(|e| panic!("write ({side}): {e}"));
    WRITE_BYTES as f64 / (1024.0 * 1024.0) / started.elapsed().as_secs_f64()
}

fn line(what: &str, unit: &str, local: &[f64], remote: &[f64], higher_is_better: bool) {
    let (Some(l), Some(r)) = (summarize(local), summarize(remote)) else {
        return;
    };
    let delta = |a: f64, b: f64| {
        if higher_is_better {
            format!("{:+.1} %", (b / a - 1.0) * 100.0)
        } else {
            format!("{:+.2} {unit}", b - a)
        }
    };
    println!(
        "{what:<10} n={:<4} in-process p50 {:>8.2} p90 {:>8.2} | node agent p50 {:>8.2} p90 {:>8.2} {unit} | remote-local p50 {} p90 {}",
        l.n,
        l.p50,
        l.p90,
        r.p50,
        r.p90,
        delta(l.p50, r.p50),
        delta(l.p90, r.p90),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    test_support::init_logging();
    let ts = TestServer::start_with(|c| {
        c.run_reconciler = false;
        c.node.pool_size = POOL;
    })
    .await;
    let node = ts.server().local_node().clone();
    let local: Arc<dyn NodeApi> = Arc::new(node.clone());
    let agent = AgentFixture::serve(local.clone(), "local").await;
    let remote = agent.client();
    println!(
        "SPACE node protocol benchmark ({TEST_TEMPLATE}; {samples} samples per side, alternating; agent on loopback, mutual TLS)"
    );

    // The first create builds the template's memory image, then the pool fills.
    let first = create(local.as_ref()).await;
    eprintln!("first create (builds the memory image): {first:.0} ms");
    let (mut c_local, mut c_remote) = (Vec::new(), Vec::new());
    for i in 0..samples {
        for remote_side in [i % 2 == 1, i % 2 == 0] {
            wait_pool(local.as_ref()).await;
            if remote_side {
                c_remote.push(create(&remote).await);
            } else {
                c_local.push(create(local.as_ref()).await);
            }
        }
    }
    line("create", "ms", &c_local, &c_remote, false);

    let req = create_request();
    let id = req.id.clone();
    local.create_sandbox(req).await.expect("create");
    let g_local = local.guest(&id).await.expect("local guest");
    let g_remote = remote.guest(&id).await.expect("remote guest");

    // Warm both paths (connections, first process).
    exec(&g_local).await;
    exec(&g_remote).await;
    let (mut e_local, mut e_remote) = (Vec::new(), Vec::new());
    for _ in 0..samples * 5 {
        e_local.push(exec(&g_local).await);
        e_remote.push(exec(&g_remote).await);
    }
    line("exec", "ms", &e_local, &e_remote, false);

    let data: Bytes = (0..WRITE_BYTES)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    write(&g_local, &data, "in-process").await;
    write(&g_remote, &data, "node agent").await;
    let (mut w_local, mut w_remote) = (Vec::new(), Vec::new());
    for i in 0..samples {
        if i % 2 == 0 {
            w_local.push(write(&g_local, &data, "in-process").await);
            w_remote.push(write(&g_remote, &data, "node agent").await);
        } else {
            w_remote.push(write(&g_remote, &data, "node agent").await);
            w_local.push(write(&g_local, &data, "in-process").await);
        }
    }
    line("write", "MiB/s", &w_local, &w_remote, true);

    local.delete(&id).await.expect("delete");
    drop((g_local, g_remote, remote));
    agent.stop().await;
    ts.stop().await;
}

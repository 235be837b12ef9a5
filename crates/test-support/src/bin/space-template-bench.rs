//! Issue 16's figures: a template built from a ~200 MiB image (pull + verify + unpack in the
//! jail + ext4), from a registry (TLS, basic auth) and from an OCI layout on disk, side by
//! side; the same image built again (cached: config fetched, no layer); and the first create
//! of a fresh template (its memory image built on the way) against the next create; and a
//! build through the API (`POST /v1/templates`, pulled by the node and warmed: memory image
//! and a pool member made right after it), with the first create after that; and build steps
//! on top of that template (a Dockerfile's `COPY`, `ENV`, `WORKDIR` and three `RUN`s, in a
//! builder sandbox), cold and then taken whole from the step cache. Last, on a cluster with
//! an object store: a burst of ten creates of a template a node has never had (one
//! download, one memory image) against the next burst of ten on that node.
//!
//! Each sample is a fresh store, so every cold build pulls and unpacks everything. Run with
//! `sudo ./scripts/bench-templates [samples] [burst]` (default 5; `burst`: only the burst). Prints percentiles; every figure is
//! measured.

use std::path::Path;
use std::time::Instant;

use space_core::sandbox::CreateSandboxRequest;
use test_support::images::{busybox_layer, noise, Image, Layer};
use test_support::registry::TestRegistry;
use test_support::{percentile as pct, TestServer};

/// Payload layers and their size.
const LAYERS: usize = 4;
const LAYER_MIB: usize = 50;

fn report(name: &str, samples: &mut [f64]) {
    let (p50, p90) = (pct(samples, 0.5), pct(samples, 0.9));
    println!(
        "{name:<58} n={:<3} p50={p50:>9.0} ms p90={p90:>9.0} ms",
        samples.len()
    );
}

fn image() -> Image {
    let mut layers = vec![busybox_layer(&["sh", "cat", "ls", "true"]).finish()];
    for l in 0..LAYERS {
        let mut layer = Layer::new();
        for f in 0..(LAYER_MIB / 5) {
            layer = layer.file(
                &format!("opt/payload{l}/f{f}.bin"),
                &noise(5 << 20, (l * 1000 + f) as u64 + 1),
                0o644,
                0,
            );
        }
        layers.push(layer.finish());
    }
    Image {
        layers,
        config: serde_json::json!({"Env": ["PATH=/bin"]}),
    }
}

fn build(data_dir: &Path, name: &str, from: &str, extra: &[&str]) -> f64 {
    let t = Instant::now();
    let (ok, out) = test_support::images::build_template(data_dir, name, from, extra);
    assert!(ok, "build failed: {out}");
    t.elapsed().as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    // `space-template-bench N burst`: only the burst figures.
    if std::env::args().nth(2).as_deref() == Some("burst") {
        burst(samples).await;
        return;
    }
    let image = image();
    let total: usize = image.layers.iter().map(Vec::len).sum();
    println!(
        "image: {} layers, {} MiB uncompressed; {samples} samples, each on a fresh store",
        image.layers.len(),
        total >> 20
    );
    let registry = TestRegistry::start().await;
    registry.push("bench/big", "1", &image).await;
    let reference = format!("{}/bench/big:1", registry.host);
    let dir = tempfile::tempdir().expect("dir");
    let layout = dir.path().join("layout");
    image.write_layout(&layout, "1");
    let auth = registry.auth_file.to_str().expect("path").to_owned();
    let ca = registry.ca.to_str().expect("path").to_owned();
    let creds = [
        "--registry-auth",
        auth.as_str(),
        "--registry-ca",
        ca.as_str(),
    ];

    let (mut from_registry, mut from_layout, mut cached) = (Vec::new(), Vec::new(), Vec::new());
    let (mut first_create, mut next_create) = (Vec::new(), Vec::new());
    let (mut api_build, mut api_warm, mut api_first) = (Vec::new(), Vec::new(), Vec::new());
    let (mut steps_cold, mut steps_cached) = (Vec::new(), Vec::new());
    let ca_pem = std::fs::read_to_string(&registry.ca).expect("registry CA");
    for _ in 0..samples {
        let data_dir = test_support::new_data_dir();
        let config = test_support::test_server_config(&data_dir);
        from_registry.push(build(&data_dir, "big", &reference, &creds));
        cached.push(build(&data_dir, "big-again", &reference, &creds));
        from_layout.push(build(
            &data_dir,
            "big-layout",
            &format!("oci:{}:1", layout.display()),
            // Another default user: another template, so it is unpacked, not found cached.
            &["--user", "root"],
        ));
        let server = TestServer::start_on(data_dir, config).await;
        let req = CreateSandboxRequest {
            template: "big".into(),
            ..Default::default()
        };
        let t = Instant::now();
        let a = server.client.create_sandbox(&req).await.expect("create");
        first_create.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let b = server.client.create_sandbox(&req).await.expect("create");
        next_create.push(t.elapsed().as_secs_f64() * 1000.0);
        for id in [a.id, b.id] {
            let _ = server.client.delete_sandbox(id.as_str()).await;
        }
        let (data_dir, _) = server.stop_keep_vms().await;

        // Through the API, on a server with a warm pool of one per shape (production's is
        // 32): another default user makes it another template, so it is unpacked.
        let mut config = test_support::test_server_config(&data_dir);
        config.node.pool_size = 1;
        config.node.registry_ca_pem = Some(ca_pem.clone());
        let server = TestServer::start_on(data_dir, config).await;
        let c = &server.client;
        let t = Instant::now();
        let req = serde_json::json!({
            "name": "big-api", "from_image": reference, "user": "0",
            "registry_auth": {"username": test_support::registry::USER, "password": test_support::registry::PASSWORD},
        });
        follow_to_ready(c, &req).await;
        api_build.push(t.elapsed().as_secs_f64() * 1000.0);
        test_support::wait_until(
            std::time::Duration::from_secs(300),
            "the pool member",
            || async {
                c.pool().await.ok().filter(|p| {
                    p.pools
                        .iter()
                        .any(|s| s.template == "big-api" && s.ready >= 1)
                })
            },
        )
        .await;
        api_warm.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let a = c
            .create_sandbox(&CreateSandboxRequest {
                template: "big-api".into(),
                ..Default::default()
            })
            .await
            .expect("create");
        api_first.push(t.elapsed().as_secs_f64() * 1000.0);
        let _ = c.delete_sandbox(a.id.as_str()).await;

        // Build steps on that template, as a Dockerfile has them.
        let files = tar_of(&[("app/main.sh", b"echo main\n")]);
        let sha = hex_sha256(&files);
        c.put_build_files(&sha, files).await.expect("upload");
        let steps = serde_json::json!([
            {"env": {"APP": "bench"}},
            {"workdir": "/srv/app"},
            {"copy": {"files": sha, "dest": "."}},
            {"run": "cat app/main.sh > built.txt"},
            {"run": "dd if=/dev/zero of=/srv/app/blob bs=1M count=10 2>/dev/null"},
            {"run": "ls -l /srv/app > listing.txt"},
        ]);
        for (name, into) in [
            ("steps", &mut steps_cold),
            ("steps-again", &mut steps_cached),
        ] {
            let t = Instant::now();
            let req = serde_json::json!({"name": name, "from_template": "big-api", "steps": steps});
            follow_to_ready(c, &req).await;
            into.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        server.stop().await;
    }
    report(
        "build from the registry (pull, unpack, ext4)",
        &mut from_registry,
    );
    report(
        "build from an OCI layout on disk (copy, unpack, ext4)",
        &mut from_layout,
    );
    report("build again, cached (manifest + config only)", &mut cached);
    report(
        "first create after the build (memory image built)",
        &mut first_create,
    );
    report("next create (from the memory image)", &mut next_create);
    report(
        "API build, followed to ready (pull, unpack, memory image)",
        &mut api_build,
    );
    report("API build until its pool member is ready", &mut api_warm);
    report(
        "first create after an API build (warm pool)",
        &mut api_first,
    );
    report(
        "steps build: COPY, ENV, WORKDIR, 3 RUN (builder, warm-up)",
        &mut steps_cold,
    );
    report(
        "the same steps again (step cache, warm-up)",
        &mut steps_cached,
    );
    burst(samples).await;
}

/// Ten creates at once on a node that lacks the template, then ten more there: each sample
/// a new node (a node agent in its own network namespace) that has never had it.
async fn burst(samples: usize) {
    const BURST: usize = 10;
    let mut cluster = test_support::cluster::Cluster::start_with_objects(1, 1).await;
    let c = cluster.clients[0].clone();
    let st = cluster.replicas[0].state().clone();
    let template = st
        .nodes
        .template(test_support::TEST_TEMPLATE)
        .await
        .expect("template");
    let objects = space_objects::Objects::open(&cluster.object_store().expect("object store"))
        .expect("objects");
    let manifest =
        space_objects::ObjectKey::join(&["templates", &template.digest, "template.json"])
            .expect("key");
    test_support::wait_until(
        std::time::Duration::from_secs(180),
        "node-a to publish the template",
        || async { objects.size(&manifest).await.ok()?.map(|_| ()) },
    )
    .await;
    let (mut cold, mut cold_each, mut warm, mut warm_each) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut previous = "node-a".to_owned();
    for s in 0..samples {
        let name = format!("burst-{s}");
        cluster.add_node_without_template(&name).await;
        cluster
            .wait_nodes(s + 2, |n| {
                n.name != name || n.state == space_core::cluster::NodeState::Ready
            })
            .await;
        c.set_node_cordoned(&previous, true).await.expect("cordon");
        for (total, each) in [(&mut cold, &mut cold_each), (&mut warm, &mut warm_each)] {
            let t = Instant::now();
            let made = futures::future::join_all((0..BURST).map(|_| {
                let c = c.clone();
                async move {
                    let t = Instant::now();
                    let sb = c
                        .create_sandbox(&CreateSandboxRequest {
                            template: test_support::TEST_TEMPLATE.into(),
                            ..Default::default()
                        })
                        .await
                        .expect("create");
                    (sb, t.elapsed().as_secs_f64() * 1000.0)
                }
            }))
            .await;
            total.push(t.elapsed().as_secs_f64() * 1000.0);
            for (sb, ms) in made {
                assert_eq!(sb.node, name);
                each.push(ms);
                let _ = c.delete_sandbox(sb.id.as_str()).await;
            }
        }
        previous = name;
    }
    println!("\n-- a burst of {BURST} creates, on a node without the template (object store) --");
    report(
        "10 creates, template not on the node: whole burst",
        &mut cold,
    );
    report("  each create of that burst", &mut cold_each);
    report(
        "10 creates, template and memory image there: burst",
        &mut warm,
    );
    report("  each create of that burst", &mut warm_each);
    cluster.stop().await;
}

/// Starts build `req` and follows it until it is ready (panics if it fails).
async fn follow_to_ready(c: &space_cli::client::SpaceClient, req: &serde_json::Value) {
    let mut events = c.build_template_followed(req).await.expect("build");
    while let Some(ev) = futures::StreamExt::next(&mut events).await {
        match ev.expect("event") {
            space_core::template::TemplateBuildEvent::Ready { .. } => return,
            space_core::template::TemplateBuildEvent::Failed { error } => {
                panic!("the build failed: {error:?}")
            }
            _ => {}
        }
    }
    panic!("the build stream ended early");
}

/// A tar archive of `files` (path, contents), as the CLI packs a `COPY`'s.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, path, *data).expect("tar");
    }
    b.into_inner().expect("tar")
}

fn hex_sha256(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

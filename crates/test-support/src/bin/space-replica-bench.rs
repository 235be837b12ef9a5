//! What a stateless control plane pays per operation (issue 14): the shared state a
//! replica keeps in the database instead of its memory, measured on SQLite (the
//! single-machine default, where these stay in-process) and on PostgreSQL (a cluster),
//! each operation repeated and summarised as percentiles.
//!
//! - `request`: one API request's rate check (an API key's bucket: memory on SQLite, one
//!   conditional upsert on PostgreSQL);
//! - `admission`: a tenant's admission lock taken and given back around the usage count a
//!   create checks (a mutex on SQLite, an advisory lock on PostgreSQL);
//! - `quota hold`: a snapshot's bytes held and given back (a row, both);
//! - `liveness`: whether another replica is alive (a row read, both).
//!
//! Run with `sudo ./scripts/bench-replicas [samples]` (it starts a PostgreSQL of its own).

use std::time::{Duration, Instant};

use space_cli::stats::summarize;
use space_control::db::{Db, QuotaHoldKind, ReplicaId, SandboxFilter};
use space_control::quotas::Quotas;
use space_core::quota::TenantQuota;

async fn measure<F, Fut>(samples: usize, mut op: F) -> Vec<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // A few untimed rounds: connections opened, statements prepared.
    for _ in 0..10 {
        op().await;
    }
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        op().await;
        out.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    out
}

fn row(backend: &str, what: &str, samples: &[f64]) {
    if let Some(s) = summarize(samples) {
        println!(
            "| {what} | {backend} | {} | {:.3} | {:.3} | {:.3} |",
            s.n, s.p50, s.p90, s.p99
        );
    }
}

async fn bench(backend: &str, url: &str, samples: usize) -> anyhow::Result<()> {
    let db = Db::connect(url).await?;
    let tenant = db
        .create_tenant(&format!("bench-{}", std::process::id()))
        .await?
        .id;
    let me = ReplicaId::generate();
    db.register_replica(&me, "bench").await?;
    let other = ReplicaId::generate();
    db.register_replica(&other, "bench-other").await?;
    let quotas = Quotas::new(db.clone(), me.clone(), TenantQuota::embedded_default());
    let key = format!("key-bench-{}", std::process::id());

    let request = measure(samples, || async {
        // A rate high enough never to refuse: the cost of the check, not of a refusal.
        let _ = quotas
            .take_request(&key, 1_000_000, 1_000_000)
            .await
            .expect("take");
    })
    .await;
    row(backend, "request (rate check)", &request);

    let admission = measure(samples, || async {
        let lock = quotas.admission(&tenant).await.expect("lock");
        let _ = db
            .sandboxes(&tenant, SandboxFilter::Live)
            .await
            .expect("usage");
        drop(lock);
    })
    .await;
    row(backend, "admission (lock, usage, unlock)", &admission);

    let hold = measure(samples, || async {
        let id = db
            .hold_quota(&tenant, QuotaHoldKind::SnapshotBytes, 1 << 20, &me)
            .await
            .expect("hold");
        db.release_quota_hold(&id).await.expect("release");
    })
    .await;
    row(backend, "quota hold (take, give back)", &hold);

    let liveness = measure(samples, || async {
        let _ = db
            .replica_alive(&other, Duration::from_secs(10))
            .await
            .expect("alive");
    })
    .await;
    row(backend, "liveness (another replica)", &liveness);
    db.remove_replica(&me).await?;
    db.remove_replica(&other).await?;
    db.close().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let samples: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(500);
    println!("| operation | database | n | p50 ms | p90 ms | p99 ms |");
    println!("|---|---|---|---|---|---|");
    let dir = tempfile::tempdir()?;
    bench(
        "SQLite",
        &space_control::db::default_sqlite_url(dir.path()),
        samples,
    )
    .await?;
    match std::env::var("SPACE_BENCH_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => bench("PostgreSQL", &url, samples).await?,
        _ => eprintln!("SPACE_BENCH_POSTGRES_URL is not set: PostgreSQL not measured"),
    }
    Ok(())
}

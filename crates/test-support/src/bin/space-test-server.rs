//! A control plane + node in its own process, for tests that kill it with SIGKILL in the
//! middle of an operation (`tests/kill9.rs`). Usage: `space-test-server DATA_DIR`; prints
//! `URL <url>` and `KEY <api key>` on stdout once it serves, then runs until killed.
//! `space-test-server DATA_DIR --replica CA_DIR DATABASE_URL` is a cluster replica instead
//! (`tests/cluster.rs`; no node of its own); it prints `URL` and `CLUSTER <addr>`.

use std::io::Write;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .init();
    let data_dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("usage: space-test-server DATA_DIR"))?;
    let rest: Vec<String> = std::env::args().skip(2).collect();
    let config = match rest.as_slice() {
        [] => test_support::test_server_config(&data_dir),
        [flag, ca_dir, db_url] if flag == "--replica" => {
            test_support::cluster::replica_config(&data_dir, ca_dir.as_ref(), db_url)
        }
        _ => anyhow::bail!("usage: space-test-server DATA_DIR [--replica CA_DIR DATABASE_URL]"),
    };
    let server = space_control::Server::start(config).await?;
    if let Some(addr) = server.cluster_addr() {
        let mut out = std::io::stdout().lock();
        writeln!(out, "URL {}", server.url())?;
        writeln!(out, "CLUSTER {addr}")?;
        out.flush()?;
        drop(out);
        std::future::pending::<()>().await;
    }
    let key = match server.first_api_key() {
        Some(k) => k.to_owned(),
        None => std::fs::read_to_string(server.api_key_file())?
            .trim()
            .to_owned(),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "URL {}", server.url())?;
    writeln!(out, "KEY {key}")?;
    out.flush()?;
    drop(out);
    std::future::pending::<()>().await;
    Ok(())
}

//! A node of a test cluster in its own process (`tests/cluster.rs` runs each in a network
//! namespace of its own): joins if it has not, then serves its agent and heartbeats, like
//! `space node run`, with a test node's configuration (the suite's template, no pool).
//!
//! Usage: `space-test-node DATA_DIR CONTROL_PLANE TOKEN NAME ADVERTISE`; prints `READY`
//! once it serves, and runs until SIGTERM (graceful) or SIGKILL.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use space_node_proto::api::NodeApi;
use space_node_proto::cluster::JoinToken;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data_dir, control_plane, token, name, advertise] = args.as_slice() else {
        anyhow::bail!("usage: space-test-node DATA_DIR CONTROL_PLANE TOKEN NAME ADVERTISE");
    };
    let data_dir = std::path::PathBuf::from(data_dir);
    let identity = data_dir.join("node-identity");
    let joined = match space_node_agent::membership::load(&identity) {
        Ok(j) => j,
        Err(space_node_agent::membership::MembershipError::NotJoined(_)) => {
            let token = JoinToken::parse(token).map_err(anyhow::Error::msg)?;
            space_node_agent::membership::join(&identity, control_plane, &token, name, advertise)
                .await
                .context("joining")?
        }
        Err(e) => return Err(e.into()),
    };
    // `SPACE_TEST_NO_TEMPLATE=1`: a node that must fetch the suite's template.
    let mut cfg = if std::env::var_os("SPACE_TEST_NO_TEMPLATE").is_some_and(|v| v == "1") {
        test_support::test_server_config_without_template(&data_dir).node
    } else {
        test_support::test_server_config(&data_dir).node
    };
    cfg.node_name = joined.state.name.clone();
    cfg.placeholder_key = Some(joined.placeholder_key_file());
    cfg.publish_templates = true;
    // The cluster's shared object store, when the test gives one.
    if let Some(path) = std::env::var_os("SPACE_TEST_OBJECT_STORE").filter(|p| !p.is_empty()) {
        cfg.object_store = Some(
            space_objects::ObjectStoreConfig::load(std::path::Path::new(&path))
                .context("the object store")?,
        );
    }
    let node = space_node::Node::start(cfg)
        .await
        .context("starting the node")?;
    let api: Arc<dyn NodeApi> = Arc::new(node.clone());
    let listen = advertise.parse().context("ADVERTISE is IP:port")?;
    let agent =
        space_node_agent::NodeAgent::start(api, joined, listen, Duration::from_millis(500)).await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY")?;
    out.flush()?;
    drop(out);
    space_control::server::wait_for_signal().await?;
    agent.shutdown(Duration::from_secs(5)).await;
    node.shutdown().await;
    Ok(())
}

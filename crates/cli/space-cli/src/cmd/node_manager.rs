//! `space node-manager`: the node's only root process, serving the sandbox manager's
//! privileged operations on a Unix socket until SIGINT/SIGTERM (see `space_node_manager`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use space_node_manager::server::{self, ServerConfig};

use crate::Global;

/// Default socket of the node manager.
pub const DEFAULT_SOCKET: &str = "/run/space/node-manager.sock";

/// Options of `space node-manager`.
#[derive(Args, Debug)]
pub struct NodeManagerArgs {
    /// The socket to serve (mode 0600, owned by the sandbox manager's uid).
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The only user allowed to connect: the sandbox manager's (name or uid).
    #[arg(long, default_value = "root")]
    client: String,
    /// Size of the store's btrfs image when the data directory is not on btrfs, bytes.
    #[arg(long, default_value_t = space_node::config::DEFAULT_STORE_SIZE)]
    store_size: u64,
    /// Run VMMs unjailed, as root (only to measure what the jail costs).
    #[arg(long)]
    no_vmm_jail: bool,
}

/// Runs the node manager.
pub async fn run(g: &Global, a: NodeManagerArgs) -> anyhow::Result<u8> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "space node-manager must run as root: it mounts the store, makes network namespaces and jails VMMs"
    );
    let client_uid = match a.client.parse::<u32>() {
        Ok(uid) => uid,
        Err(_) => nix::unistd::User::from_name(&a.client)
            .context("look up the client user")?
            .with_context(|| format!("no user {:?}", a.client))?
            .uid
            .as_raw(),
    };
    let cfg = ServerConfig {
        socket: a.socket,
        data_dir: g.data_dir.clone(),
        loop_size: a.store_size,
        client_uid,
        jail: !a.no_vmm_jail,
    };
    let runtime = tokio::runtime::Handle::current();
    let server = tokio::task::spawn_blocking(move || server::start(cfg, runtime))
        .await
        .context("node manager start")??;
    println!("SPACE node manager serving {}", server.socket().display());
    space_control::server::wait_for_signal().await?;
    tracing::info!("node manager stopping (VMMs keep running)");
    drop(server);
    Ok(0)
}

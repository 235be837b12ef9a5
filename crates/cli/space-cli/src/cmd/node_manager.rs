//! `space node-manager`: the node's only root process, serving the sandbox manager's
//! privileged operations on a Unix socket until SIGINT/SIGTERM (see `space_node_manager`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use space_node_manager::server::{self, ServerConfig};
use space_node_manager::FileOwner;

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
    let client = client(&a.client)?;
    let cfg = ServerConfig {
        socket: a.socket,
        data_dir: g.data_dir.clone(),
        loop_size: a.store_size,
        client,
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

/// The sandbox manager's uid and primary gid, from a user name or uid (a uid without a
/// passwd entry gets the gid of the same number).
fn client(user: &str) -> anyhow::Result<FileOwner> {
    let by_uid = user.parse::<u32>().ok();
    let entry = match by_uid {
        Some(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .context("look up the client user")?,
        None => Some(
            nix::unistd::User::from_name(user)
                .context("look up the client user")?
                .with_context(|| format!("no user {user:?}"))?,
        ),
    };
    Ok(match (entry, by_uid) {
        (Some(u), _) => FileOwner {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        },
        (None, Some(uid)) => FileOwner { uid, gid: uid },
        (None, None) => anyhow::bail!("no user {user:?}"),
    })
}

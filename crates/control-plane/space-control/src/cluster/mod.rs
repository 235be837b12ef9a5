//! The control plane's side of a cluster of nodes: the cluster CA ([`authority`]), the
//! membership service nodes call ([`membership`], served by [`listener`] on its own TLS
//! port), and the liveness sweep that declares silent nodes lost and keeps this replica's
//! node set current.
//!
//! Every replica serves the membership service and none holds state of its own; the
//! leader (`crate::replica`) declares silent nodes lost, and every replica reloads its node
//! set. Membership is rows in the database and every decision is one conditional statement
//! there (see `db::nodes`), so a node heartbeating to one replica while the leader declares
//! it lost, or two replicas that both believe they lead for a moment, resolve in the
//! database: a node is declared lost once, its generation bumped once, and a fenced node's
//! heartbeats are refused by whichever replica gets them.

pub mod authority;
pub mod listener;
pub mod membership;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::db::{now_ms, Db};
use crate::nodes::Nodes;

/// Default of [`ClusterConfig::heartbeat_timeout`].
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(15);
/// Default of [`ClusterConfig::sweep_interval`].
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(2);
/// Default lifetime of a join token.
pub const DEFAULT_JOIN_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// Longest lifetime of a join token.
pub const MAX_JOIN_TOKEN_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How a replica runs as part of a cluster (instead of with its own in-process node).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The directory `space cluster init` made (the CA's certificate and key).
    pub ca_dir: PathBuf,
    /// Where nodes reach the membership service (`space node join --control-plane`).
    pub listen: SocketAddr,
    /// A node silent for this long is declared lost.
    pub heartbeat_timeout: Duration,
    /// How often this replica sweeps for lost nodes and reloads the node set.
    pub sweep_interval: Duration,
}

impl ClusterConfig {
    /// Defaults for everything but the CA directory and the listen address.
    pub fn new(ca_dir: impl Into<PathBuf>, listen: SocketAddr) -> ClusterConfig {
        ClusterConfig {
            ca_dir: ca_dir.into(),
            listen,
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
        }
    }
}

/// One sweep: as leader, declares lost the nodes silent for longer than `timeout`; then
/// reloads the node set (every replica). Returns the nodes this sweep declared lost.
pub async fn sweep(
    db: &Db,
    nodes: &Nodes,
    leader: bool,
    timeout: Duration,
) -> Result<Vec<String>, crate::db::DbError> {
    let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    let lost = if leader {
        db.mark_lost_nodes(now_ms().saturating_sub(timeout_ms))
            .await?
    } else {
        Vec::new()
    };
    for name in &lost {
        tracing::warn!(node = %name, ?timeout, "node missed its heartbeats: declared lost, with its sandboxes");
    }
    nodes.refresh(&db.nodes().await?);
    Ok(lost)
}

/// Sweeps every `config.sweep_interval` until `stop` turns true.
pub fn spawn_sweeper(
    db: Db,
    nodes: Nodes,
    replica: crate::replica::Replica,
    config: &ClusterConfig,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let timeout = config.heartbeat_timeout;
    crate::background::every(config.sweep_interval, stop, move || {
        let (db, nodes, replica) = (db.clone(), nodes.clone(), replica.clone());
        async move {
            let leader = replica.leads().await;
            if let Err(e) = sweep(&db, &nodes, leader, timeout).await {
                tracing::warn!(error = %e, "cluster sweep failed; retrying");
            }
        }
    })
}

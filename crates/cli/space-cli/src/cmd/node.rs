//! `space node`: a node of a cluster. `join` and `run` on the node's machine (`run`
//! serves its agent to the control plane and heartbeats); `list`, `token`, `cordon`,
//! `uncordon`, `drain` and `rm` are the operator's, over the API.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Subcommand;
use space_core::cluster::CreateJoinTokenRequest;
use space_node_proto::api::NodeApi;
use space_node_proto::cluster::JoinToken;

use super::server::NodeArgs;
use crate::{render, Global};

/// `space node …`.
#[derive(Subcommand, Debug)]
pub enum NodeCmd {
    /// Joins this machine to a cluster as a node (once): makes its key, has the control
    /// plane sign its certificate with a one-time token.
    Join {
        /// `host:port` of a control-plane replica's cluster listener (--cluster-listen).
        #[arg(long, value_name = "ADDR")]
        control_plane: String,
        /// The token of `space node token create` (or SPACE_JOIN_TOKEN).
        #[arg(long, env = "SPACE_JOIN_TOKEN", hide_env_values = true)]
        token: String,
        /// This node's name (lowercase letters, digits, '-').
        #[arg(long)]
        name: String,
        /// `host:port` where the control plane reaches this node's agent.
        #[arg(long, value_name = "ADDR")]
        advertise: String,
    },
    /// Runs this node: its sandboxes, its agent (mutual TLS, the control plane only) and
    /// its heartbeats, until SIGINT/SIGTERM.
    Run {
        /// Where the agent listens (default: the advertised address).
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Seconds between heartbeats.
        #[arg(long, default_value_t = 2)]
        heartbeat_secs: u64,
        #[command(flatten)]
        node: Box<NodeArgs>,
    },
    /// The cluster's nodes.
    List,
    /// Join tokens.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Closes a node to new sandboxes (its own keep running).
    Cordon {
        /// The node.
        name: String,
    },
    /// Opens a cordoned node again.
    Uncordon {
        /// The node.
        name: String,
    },
    /// Cordons a node and moves every sandbox it holds to the others (suspended to object
    /// storage, resumed elsewhere, as it was); exits 1 if any could not move.
    Drain {
        /// The node.
        name: String,
    },
    /// Removes a node that holds no sandbox from the cluster.
    Rm {
        /// The node.
        name: String,
    },
}

/// `space node token …`.
#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// A one-time token that joins one node (shown once).
    Create {
        /// How long it may be used, seconds.
        #[arg(long, default_value_t = space_control::cluster::DEFAULT_JOIN_TOKEN_TTL.as_secs())]
        ttl_secs: u64,
    },
}

/// Where a node keeps its cluster identity.
pub fn identity_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("node-identity")
}

/// Runs a `space node` command.
pub async fn run(g: &Global, c: NodeCmd) -> anyhow::Result<u8> {
    match c {
        NodeCmd::Join {
            control_plane,
            token,
            name,
            advertise,
        } => {
            let token = JoinToken::parse(&token).map_err(anyhow::Error::msg)?;
            let joined = space_node_agent::membership::join(
                &identity_dir(&g.data_dir),
                &control_plane,
                &token,
                &name,
                &advertise,
            )
            .await?;
            println!(
                "joined as node {} (generation {}); start it with: space node run",
                joined.state.name, joined.state.generation
            );
            Ok(0)
        }
        NodeCmd::Run {
            listen,
            heartbeat_secs,
            node,
        } => run_node(g, listen, Duration::from_secs(heartbeat_secs.max(1)), *node).await,
        NodeCmd::List => {
            let list = g.client()?.nodes().await?;
            if g.json {
                render::json(&list)?;
            } else {
                render::nodes(&list.nodes);
            }
            Ok(0)
        }
        NodeCmd::Token(TokenCmd::Create { ttl_secs }) => {
            let t = g
                .client()?
                .create_join_token(&CreateJoinTokenRequest {
                    ttl_secs: Some(ttl_secs),
                })
                .await?;
            if g.json {
                render::json(&t)?;
            } else {
                println!("{}", t.token);
                eprintln!(
                    "(one node, once, before {} ms since the epoch)",
                    t.expires_at_ms
                );
            }
            Ok(0)
        }
        NodeCmd::Cordon { name } => cordon(g, &name, true).await,
        NodeCmd::Uncordon { name } => cordon(g, &name, false).await,
        NodeCmd::Drain { name } => {
            let report = g.client()?.drain_node(&name).await?;
            if g.json {
                render::json(&report)?;
            } else {
                render::drain(&report);
            }
            Ok(u8::from(!report.failed.is_empty()))
        }
        NodeCmd::Rm { name } => {
            g.client()?.remove_node(&name).await?;
            Ok(0)
        }
    }
}

async fn cordon(g: &Global, name: &str, cordoned: bool) -> anyhow::Result<u8> {
    let info = g.client()?.set_node_cordoned(name, cordoned).await?;
    if g.json {
        render::json(&info)?;
    } else {
        render::nodes(std::slice::from_ref(&info));
    }
    Ok(0)
}

async fn run_node(
    g: &Global,
    listen: Option<SocketAddr>,
    heartbeat: Duration,
    args: NodeArgs,
) -> anyhow::Result<u8> {
    let joined = space_node_agent::membership::load(&identity_dir(&g.data_dir))?;
    let listen = match listen {
        Some(l) => l,
        None => joined.state.advertise.parse().with_context(|| {
            format!(
                "the advertised address {} is not IP:port: give --listen",
                joined.state.advertise
            )
        })?,
    };
    let mut cfg = space_node::NodeConfig::new(g.data_dir.clone());
    cfg.node_name = joined.state.name.clone();
    cfg.placeholder_key = Some(joined.placeholder_key_file());
    cfg.publish_templates = true;
    args.apply(&mut cfg)?;
    let node = space_node::Node::start(cfg)
        .await
        .context("starting the node")?;
    let api: Arc<dyn NodeApi> = Arc::new(node.clone());
    let name = joined.state.name.clone();
    let control_plane = joined.state.control_plane.clone();
    let agent = space_node_agent::NodeAgent::start(api, joined, listen, heartbeat).await?;
    println!(
        "node {name} serving its agent on {}; heartbeating to {control_plane}",
        agent.addr()
    );
    space_control::server::wait_for_signal().await?;
    tracing::info!("shutting down (sandboxes keep running)");
    agent.shutdown(space_control::server::SHUTDOWN_GRACE).await;
    node.shutdown().await;
    Ok(0)
}

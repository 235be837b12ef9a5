//! `space sandbox ...` and `space console`.

use clap::{Args, Subcommand};
use futures::StreamExt;
use space_core::sandbox::{
    CreateSandboxRequest, ForkRequest, OnNodeLoss, ResourcesRequest, SandboxInfo, SnapshotStorage,
    TimeoutAction,
};
use space_core::SandboxState;

use super::{parse_pairs, sandbox_id, snapshot_id};
use crate::{render, Global};

/// Sandbox commands.
#[derive(Subcommand, Debug)]
pub enum SandboxCmd {
    /// Create a sandbox; returns when it is running.
    Create(CreateArgs),
    /// List sandboxes.
    List {
        /// Only sandboxes with this label (KEY=VALUE, repeatable; all must match).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Only sandboxes in this state (creating, running, paused, stopped, failed, deleted...).
        #[arg(long)]
        state: Option<String>,
    },
    /// Show one sandbox.
    Get {
        /// Sandbox id.
        id: String,
    },
    /// Delete a sandbox.
    Rm {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Set the timeout: its timeout action (see `create --on-timeout`) happens SECS from
    /// now, and each time it runs again it gets SECS once more.
    Timeout {
        /// Sandbox id.
        id: String,
        /// Seconds from now.
        secs: u64,
    },
    /// Revoke every access token handed out for a sandbox (E2B envd and traffic tokens, and
    /// the signed URLs made with them); clients get new ones by connecting again.
    RevokeTokens {
        /// Sandbox id.
        id: String,
    },
    /// List the processes in a sandbox.
    Ps {
        /// Sandbox id.
        id: String,
    },
    /// Pause a running sandbox (vCPUs stop, memory stays resident).
    Pause {
        /// Sandbox id.
        id: String,
    },
    /// Resume a paused sandbox, or a suspended one (on whichever node has room).
    Resume {
        /// Sandbox id.
        id: String,
    },
    /// Suspend a sandbox to object storage: its full snapshot stored, its node's
    /// resources freed; `resume` brings it back on any node.
    Suspend {
        /// Sandbox id.
        id: String,
    },
    /// Stop a sandbox: the VM goes away, the disk is kept.
    Stop {
        /// Sandbox id.
        id: String,
    },
    /// Start a stopped sandbox (a cold boot on its disk).
    Start {
        /// Sandbox id.
        id: String,
    },
    /// Roll a sandbox back to one of its snapshots (see `space snapshot list`).
    Rollback {
        /// Sandbox id.
        id: String,
        /// Snapshot id: a disk snapshot brings the disk back, a checkpoint memory and
        /// processes too.
        snapshot: String,
    },
    /// Fork a sandbox into new sandboxes (from now, or from one of its checkpoints).
    Fork {
        /// Sandbox id.
        id: String,
        /// How many children (1-16).
        #[arg(long, short = 'n', default_value_t = 1)]
        count: u32,
        /// Fork from this checkpoint instead of from the sandbox as it is now.
        #[arg(long)]
        snapshot: Option<String>,
        /// Label for the children, added to the parent's (KEY=VALUE, repeatable).
        #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Delete the children automatically after this many seconds (default 3600).
        #[arg(long)]
        timeout: Option<u64>,
        /// Print only the children's ids.
        #[arg(long, short)]
        quiet: bool,
    },
    /// The lifecycle transitions of a sandbox, with their times.
    Events {
        /// Sandbox id.
        id: String,
        /// Keep printing new transitions until the sandbox is deleted.
        #[arg(long, short)]
        follow: bool,
    },
    /// Resource use over time (sampled every few seconds while the sandbox runs).
    Metrics {
        /// Sandbox id.
        id: String,
    },
}

/// `space sandbox create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Template name.
    #[arg(long, short, required_unless_present = "snapshot")]
    template: Option<String>,
    /// Create it from this snapshot (see `space snapshot list`) instead of a template: a
    /// checkpoint brings back memory and processes, a disk snapshot boots on a copy of its
    /// disk. Template and resources are the snapshot's.
    #[arg(long, conflicts_with_all = ["template", "vcpus", "memory_mib", "disk_mib"])]
    snapshot: Option<String>,
    /// Virtual CPUs.
    #[arg(long)]
    vcpus: Option<u32>,
    /// Memory, MiB.
    #[arg(long)]
    memory_mib: Option<u32>,
    /// Root disk, MiB.
    #[arg(long)]
    disk_mib: Option<u32>,
    /// Environment variable for every process (KEY=VALUE, repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Label (KEY=VALUE, repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Its timeout, seconds (default 3600): then --on-timeout happens.
    #[arg(long)]
    timeout: Option<u64>,
    /// What happens when the timeout passes: delete (default), pause (memory kept) or stop
    /// (disk kept).
    #[arg(long, value_name = "ACTION", value_parser = parse_timeout_action)]
    on_timeout: Option<TimeoutAction>,
    /// The next call that needs the guest resumes (or starts) it after its timeout paused
    /// (or stopped) it.
    #[arg(long)]
    auto_resume: bool,
    /// What happens if its node is lost: fail (default: it shows lost until the node
    /// returns) or restore (from its last checkpoint stored in object storage, on another
    /// node; needs a cluster with an object store).
    #[arg(long, value_name = "POLICY", value_parser = parse_name::<OnNodeLoss>)]
    on_node_loss: Option<OnNodeLoss>,
    /// With --on-node-loss restore: seconds between its stored checkpoints (default 300).
    #[arg(long, value_name = "SECS")]
    checkpoint_interval: Option<u64>,
    /// Where its persistent snapshots are kept: node (default) or object-store (also in
    /// object storage: sandboxes are made from them on any node, also once that one is gone).
    #[arg(long, value_name = "WHERE", value_parser = parse_name::<SnapshotStorage>)]
    snapshot_storage: Option<SnapshotStorage>,
    /// Project within the tenant (credentials scoped to it apply).
    #[arg(long)]
    project: Option<String>,
    /// Egress policy (default: the tenant's, else the node's).
    #[command(flatten)]
    egress: super::egress::PolicyArgs,
    /// Print only the id.
    #[arg(long, short)]
    quiet: bool,
}

/// `--on-timeout`: one of [`TimeoutAction`]'s names.
fn parse_timeout_action(s: &str) -> Result<TimeoutAction, String> {
    TimeoutAction::parse(s).ok_or_else(|| {
        let names: Vec<&str> = TimeoutAction::ALL.iter().map(|a| a.as_str()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// A policy's name as the API spells it (`object_store`), or with a dash (`object-store`).
fn parse_name<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.replace('-', "_")))
        .map_err(|_| format!("unknown value {s:?}"))
}

/// `space console`.
#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// Sandbox id.
    id: String,
    /// Bytes of the tail (at most 1 MiB).
    #[arg(long)]
    bytes: Option<usize>,
}

/// Runs a sandbox command.
pub async fn run(g: &Global, c: SandboxCmd) -> anyhow::Result<u8> {
    let client = g.client()?;
    match c {
        SandboxCmd::Create(a) => {
            let req = CreateSandboxRequest {
                template: a.template.unwrap_or_default(),
                snapshot: a.snapshot.as_deref().map(snapshot_id).transpose()?,
                resources: ResourcesRequest {
                    vcpus: a.vcpus,
                    memory_mib: a.memory_mib,
                    disk_mib: a.disk_mib,
                },
                env: parse_pairs(&a.env, "--env")?,
                labels: parse_pairs(&a.labels, "--label")?,
                timeout_secs: a.timeout,
                on_timeout: a.on_timeout.unwrap_or_default(),
                auto_resume: a.auto_resume,
                on_node_loss: a.on_node_loss.unwrap_or_default(),
                checkpoint_interval_secs: a.checkpoint_interval,
                snapshot_storage: a.snapshot_storage.unwrap_or_default(),
                project: a.project,
                egress: a.egress.policy()?,
                ..Default::default()
            };
            let info = client.create_sandbox(&req).await?;
            if g.json {
                render::json(&info)?;
            } else if a.quiet {
                println!("{}", info.id);
            } else {
                render::sandbox(&info);
            }
        }
        SandboxCmd::List { labels, state } => {
            let labels: Vec<(String, String)> =
                parse_pairs(&labels, "--label")?.into_iter().collect();
            let state = state
                .map(|s| {
                    SandboxState::parse(&s).ok_or_else(|| anyhow::anyhow!("unknown state {s:?}"))
                })
                .transpose()?;
            let labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let list = client.list_sandboxes_filtered(&labels, state).await?;
            if g.json {
                render::json(&list)?;
            } else if list.sandboxes.is_empty() {
                eprintln!("no sandboxes");
            } else {
                render::sandboxes(&list.sandboxes);
            }
        }
        SandboxCmd::Get { id } => {
            let info = client.sandbox(&sandbox_id(&id)?).await?;
            if g.json {
                render::json(&info)?;
            } else {
                render::sandbox(&info);
            }
        }
        SandboxCmd::Rm { ids } => {
            let mut failed = 0;
            for id in ids {
                match client.delete_sandbox(&sandbox_id(&id)?).await {
                    Ok(()) => println!("deleted {id}"),
                    Err(e) => {
                        crate::print_error(&e.into());
                        failed += 1;
                    }
                }
            }
            return Ok(u8::from(failed > 0));
        }
        SandboxCmd::RevokeTokens { id } => {
            let id = sandbox_id(&id)?;
            client.revoke_tokens(&id).await?;
            if g.json {
                render::json(&serde_json::json!({ "id": id, "tokens_revoked": true }))?;
            } else {
                println!("revoked the tokens of {id}");
            }
        }
        SandboxCmd::Timeout { id, secs } => {
            let info = client.set_timeout(&sandbox_id(&id)?, secs).await?;
            if g.json {
                render::json(&info)?;
            } else {
                println!(
                    "{} {} {}",
                    info.id,
                    info.on_timeout.as_str(),
                    render::expiry(&info)
                );
            }
        }
        SandboxCmd::Ps { id } => {
            let list = client.processes(&sandbox_id(&id)?).await?;
            if g.json {
                render::json(&list)?;
            } else {
                render::processes(&list);
            }
        }
        SandboxCmd::Pause { id } => show_state(g, client.pause_sandbox(&sandbox_id(&id)?).await?)?,
        SandboxCmd::Resume { id } => {
            show_state(g, client.resume_sandbox(&sandbox_id(&id)?).await?)?
        }
        SandboxCmd::Suspend { id } => {
            show_state(g, client.suspend_sandbox(&sandbox_id(&id)?).await?)?
        }
        SandboxCmd::Stop { id } => show_state(g, client.stop_sandbox(&sandbox_id(&id)?).await?)?,
        SandboxCmd::Start { id } => show_state(g, client.start_sandbox(&sandbox_id(&id)?).await?)?,
        SandboxCmd::Rollback { id, snapshot } => {
            let info = client
                .rollback(&sandbox_id(&id)?, &snapshot_id(&snapshot)?)
                .await?;
            show_state(g, info)?
        }
        SandboxCmd::Fork {
            id,
            count,
            snapshot,
            labels,
            timeout,
            quiet,
        } => {
            let req = ForkRequest {
                count: Some(count),
                snapshot: snapshot.as_deref().map(snapshot_id).transpose()?,
                labels: parse_pairs(&labels, "--label")?,
                timeout_secs: timeout,
            };
            let list = client.fork(&sandbox_id(&id)?, &req).await?;
            if g.json {
                render::json(&list)?;
            } else if quiet {
                for s in &list.sandboxes {
                    println!("{}", s.id);
                }
            } else {
                render::sandboxes(&list.sandboxes);
            }
        }
        SandboxCmd::Events { id, follow } => {
            let id = sandbox_id(&id)?;
            if follow {
                let mut events = client.follow_events(&id).await?;
                while let Some(entry) = events.next().await {
                    let entry = entry?;
                    if g.json {
                        println!("{}", serde_json::to_string(&entry)?);
                    } else {
                        println!("{}", render::event_line(&entry));
                    }
                }
            } else {
                let list = client.events(&id).await?;
                if g.json {
                    render::json(&list)?;
                } else if list.events.is_empty() {
                    eprintln!("no events");
                } else {
                    for e in &list.events {
                        println!("{}", render::event_line(e));
                    }
                }
            }
        }
        SandboxCmd::Metrics { id } => {
            let list = client.metrics(&sandbox_id(&id)?, None, None).await?;
            if g.json {
                render::json(&list)?;
            } else if list.metrics.is_empty() {
                eprintln!("no samples yet");
            } else {
                render::metrics(&list.metrics);
            }
        }
    }
    Ok(0)
}

/// After a lifecycle operation: the sandbox (`--json`), or its id and new state.
fn show_state(g: &Global, info: SandboxInfo) -> anyhow::Result<()> {
    if g.json {
        render::json(&info)?;
    } else {
        println!("{} {}", info.id, info.state);
    }
    Ok(())
}

/// `space console ID`.
pub async fn console(g: &Global, a: ConsoleArgs) -> anyhow::Result<u8> {
    let text = g.client()?.console(&sandbox_id(&a.id)?, a.bytes).await?;
    print!("{text}");
    Ok(0)
}

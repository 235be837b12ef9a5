//! `space sandbox ...` and `space console`.

use clap::{Args, Subcommand};
use space_core::sandbox::{CreateSandboxRequest, ResourcesRequest};
use space_core::SandboxState;

use super::{parse_pairs, sandbox_id};
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
        /// Only sandboxes in this state (creating, running, failed, deleting, deleted).
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
    /// Set the timeout: delete automatically SECS from now.
    Timeout {
        /// Sandbox id.
        id: String,
        /// Seconds from now.
        secs: u64,
    },
    /// List the processes in a sandbox.
    Ps {
        /// Sandbox id.
        id: String,
    },
}

/// `space sandbox create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Template name.
    #[arg(long, short)]
    template: String,
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
    /// Delete automatically after this many seconds (default 3600).
    #[arg(long)]
    timeout: Option<u64>,
    /// Print only the id.
    #[arg(long, short)]
    quiet: bool,
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
                template: a.template,
                resources: ResourcesRequest {
                    vcpus: a.vcpus,
                    memory_mib: a.memory_mib,
                    disk_mib: a.disk_mib,
                },
                env: parse_pairs(&a.env, "--env")?,
                labels: parse_pairs(&a.labels, "--label")?,
                timeout_secs: a.timeout,
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
        SandboxCmd::Timeout { id, secs } => {
            let info = client.set_timeout(&sandbox_id(&id)?, secs).await?;
            if g.json {
                render::json(&info)?;
            } else {
                println!(
                    "{} expires {}",
                    info.id,
                    render::relative(info.expires_at_ms)
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
    }
    Ok(0)
}

/// `space console ID`.
pub async fn console(g: &Global, a: ConsoleArgs) -> anyhow::Result<u8> {
    let text = g.client()?.console(&sandbox_id(&a.id)?, a.bytes).await?;
    print!("{text}");
    Ok(0)
}

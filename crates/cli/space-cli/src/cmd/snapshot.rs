//! `space snapshot ...`.

use clap::Subcommand;
use space_core::sandbox::CreateSnapshotRequest;
use space_core::SnapshotKind;

use super::{sandbox_id, snapshot_id};
use crate::{render, Global};

/// Snapshot commands.
#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// List a sandbox's snapshots (kind, time, size), oldest first; without a sandbox id,
    /// all of the tenant's (persistent ones of deleted sandboxes too), newest first.
    #[command(alias = "ls")]
    List {
        /// Sandbox id.
        id: Option<String>,
        /// Only snapshots with this label (all of the tenant's).
        #[arg(long, short)]
        label: Option<String>,
    },
    /// Show one of the tenant's snapshots (of any sandbox, deleted ones too).
    Get {
        /// Snapshot id.
        snapshot: String,
    },
    /// Take a snapshot now: a disk snapshot (the VM keeps running), or with --checkpoint
    /// memory and processes too.
    Create {
        /// Sandbox id.
        id: String,
        /// A full checkpoint (memory, device state and disk) instead of a disk snapshot.
        #[arg(long)]
        checkpoint: bool,
        /// Free text to recognise it by.
        #[arg(long, short)]
        label: Option<String>,
        /// Keep it until deleted, also after the sandbox is deleted (new sandboxes can be
        /// created from it: `space sandbox create --snapshot`).
        #[arg(long)]
        persistent: bool,
        /// Print only the snapshot id.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Delete snapshots: `rm SANDBOX SNAPSHOT...`, or `rm SNAPSHOT...` for the tenant's
    /// snapshots wherever they are (persistent ones of deleted sandboxes too).
    Rm {
        /// Sandbox id, or the first snapshot id.
        id: String,
        /// Snapshot ids.
        snapshots: Vec<String>,
    },
    /// Files added, removed or modified between two snapshots of a sandbox.
    Diff {
        /// Sandbox id.
        id: String,
        /// The older snapshot.
        from: String,
        /// The newer snapshot.
        to: String,
        /// Most changes to list (default 1000).
        #[arg(long)]
        limit: Option<usize>,
    },
}

/// Runs a snapshot command.
pub async fn run(g: &Global, c: SnapshotCmd) -> anyhow::Result<u8> {
    let client = g.client()?;
    match c {
        SnapshotCmd::List { id, label } => {
            let list = match (id, label) {
                (Some(id), None) => client.snapshots(&sandbox_id(&id)?).await?,
                (id, label) => {
                    let sandbox = id.as_deref().map(sandbox_id).transpose()?;
                    client
                        .tenant_snapshots(sandbox.as_ref(), label.as_deref())
                        .await?
                }
            };
            if g.json {
                render::json(&list)?;
            } else if list.snapshots.is_empty() {
                eprintln!("no snapshots");
            } else {
                render::snapshots(&list.snapshots);
            }
        }
        SnapshotCmd::Get { snapshot } => {
            let info = client.tenant_snapshot(&snapshot_id(&snapshot)?).await?;
            if g.json {
                render::json(&info)?;
            } else {
                render::snapshots(std::slice::from_ref(&info));
            }
        }
        SnapshotCmd::Create {
            id,
            checkpoint,
            label,
            persistent,
            quiet,
        } => {
            let req = CreateSnapshotRequest {
                kind: if checkpoint {
                    SnapshotKind::Checkpoint
                } else {
                    SnapshotKind::Disk
                },
                label,
                persistent,
            };
            let taken = client.create_snapshot(&sandbox_id(&id)?, &req).await?;
            if g.json {
                render::json(&taken)?;
            } else if quiet {
                println!("{}", taken.snapshot.id);
            } else {
                render::snapshots(std::slice::from_ref(&taken.snapshot));
                if let Some(ms) = taken.guest_pause_ms {
                    println!("guest paused for {ms} ms");
                }
            }
        }
        SnapshotCmd::Rm { id, snapshots } => {
            // A first argument that is a snapshot id names no sandbox.
            let (sandbox, snapshots) = match snapshot_id(&id) {
                Ok(_) => (None, [vec![id], snapshots].concat()),
                Err(_) if snapshots.is_empty() => {
                    anyhow::bail!("give the snapshots to delete")
                }
                Err(_) => (Some(sandbox_id(&id)?), snapshots),
            };
            let mut failed = 0;
            for snap in snapshots {
                let result = match (snapshot_id(&snap), &sandbox) {
                    (Ok(s), Some(id)) => client.delete_snapshot(id, &s).await.map_err(Into::into),
                    (Ok(s), None) => client.delete_tenant_snapshot(&s).await.map_err(Into::into),
                    (Err(e), _) => Err(e),
                };
                match result {
                    Ok(()) => println!("deleted {snap}"),
                    Err(e) => {
                        crate::print_error(&e);
                        failed += 1;
                    }
                }
            }
            return Ok(u8::from(failed > 0));
        }
        SnapshotCmd::Diff {
            id,
            from,
            to,
            limit,
        } => {
            let diff = client
                .diff_snapshots(
                    &sandbox_id(&id)?,
                    &snapshot_id(&from)?,
                    &snapshot_id(&to)?,
                    limit,
                )
                .await?;
            if g.json {
                render::json(&diff)?;
            } else if diff.changes.is_empty() {
                eprintln!("no changes");
            } else {
                render::diff(&diff);
            }
        }
    }
    Ok(0)
}

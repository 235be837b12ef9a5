//! `space snapshot ...`.

use clap::Subcommand;
use space_core::sandbox::CreateSnapshotRequest;
use space_core::SnapshotKind;

use super::{sandbox_id, snapshot_id};
use crate::{render, Global};

/// Snapshot commands.
#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// List a sandbox's snapshots (kind, time, size).
    #[command(alias = "ls")]
    List {
        /// Sandbox id.
        id: String,
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
        /// Print only the snapshot id.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Delete snapshots of a sandbox.
    Rm {
        /// Sandbox id.
        id: String,
        /// Snapshot ids.
        #[arg(required = true)]
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
        SnapshotCmd::List { id } => {
            let list = client.snapshots(&sandbox_id(&id)?).await?;
            if g.json {
                render::json(&list)?;
            } else if list.snapshots.is_empty() {
                eprintln!("no snapshots");
            } else {
                render::snapshots(&list.snapshots);
            }
        }
        SnapshotCmd::Create {
            id,
            checkpoint,
            label,
            quiet,
        } => {
            let req = CreateSnapshotRequest {
                kind: if checkpoint {
                    SnapshotKind::Checkpoint
                } else {
                    SnapshotKind::Disk
                },
                label,
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
            let id = sandbox_id(&id)?;
            let mut failed = 0;
            for snap in snapshots {
                let result = match snapshot_id(&snap) {
                    Ok(s) => client.delete_snapshot(&id, &s).await.map_err(Into::into),
                    Err(e) => Err(e),
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

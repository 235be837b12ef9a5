//! `space files ...`: copy files in and out of a sandbox (streamed, with a progress bar for
//! large files), list, stat, mkdir, mv, rm, watch. `-` as LOCAL means stdin/stdout.

use std::path::PathBuf;

use clap::Subcommand;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use space_core::files::watch::WatchRequest;
use space_core::files::{MkdirRequest, RenameRequest};
use tokio::io::AsyncWriteExt;

use super::sandbox_id;
use crate::{render, term, Global};

/// Files larger than this get a progress bar (when stderr is a terminal).
const PROGRESS_MIN_BYTES: u64 = 4 * 1024 * 1024;

/// File commands.
#[derive(Subcommand, Debug)]
pub enum FilesCmd {
    /// Upload LOCAL (or `-` for stdin) to REMOTE.
    Put {
        /// Sandbox id.
        id: String,
        /// Local file, or `-`.
        local: PathBuf,
        /// Path in the sandbox.
        remote: String,
        /// Octal permission bits, e.g. 0755.
        #[arg(long)]
        mode: Option<String>,
        /// User to act as.
        #[arg(long, short)]
        user: Option<String>,
    },
    /// Download REMOTE to LOCAL (or `-` for stdout).
    Get {
        /// Sandbox id.
        id: String,
        /// Path in the sandbox.
        remote: String,
        /// Local file, or `-`.
        local: PathBuf,
        /// User to act as.
        #[arg(long, short)]
        user: Option<String>,
    },
    /// List a directory.
    Ls {
        /// Sandbox id.
        id: String,
        /// Directory in the sandbox.
        remote: String,
        /// Levels to descend.
        #[arg(long, default_value_t = 1)]
        depth: u32,
        /// User to act as.
        #[arg(long, short)]
        user: Option<String>,
    },
    /// Remove a file (or a directory with -r).
    Rm {
        /// Sandbox id.
        id: String,
        /// Path in the sandbox.
        remote: String,
        /// Remove directories and their contents.
        #[arg(short, long)]
        recursive: bool,
        /// User to act as.
        #[arg(long, short)]
        user: Option<String>,
    },
    /// Show metadata of one entry.
    Stat {
        /// Sandbox id.
        id: String,
        /// Path in the sandbox.
        remote: String,
        /// User to act as.
        #[arg(long, short)]
        user: Option<String>,
    },
    /// Create a directory and its parents.
    Mkdir {
        /// Sandbox id.
        id: String,
        /// Directory to create.
        remote: String,
        /// Octal permission bits, e.g. 0700.
        #[arg(long)]
        mode: Option<String>,
        /// User to act as.
        #[arg(long, short)]
        user: Option<String>,
    },
    /// Rename (move) a file or directory.
    Mv {
        /// Sandbox id.
        id: String,
        /// Existing path.
        from: String,
        /// New path.
        to: String,
        /// User to act as.
        #[arg(long, short)]
        user: Option<String>,
    },
    /// Watch a directory: one line per change until it is removed (or Ctrl-C).
    Watch {
        /// Sandbox id.
        id: String,
        /// Directory in the sandbox.
        remote: String,
        /// Watch subdirectories too (new ones included).
        #[arg(short, long)]
        recursive: bool,
        /// User to act as.
        #[arg(long, short)]
        user: Option<String>,
    },
}

fn parse_mode(m: Option<&str>) -> anyhow::Result<Option<u32>> {
    m.map(|m| {
        u32::from_str_radix(m.trim_start_matches("0o"), 8)
            .map_err(|_| anyhow::anyhow!("mode must be octal, like 0644"))
    })
    .transpose()
}

fn bar(total: Option<u64>) -> ProgressBar {
    match total {
        Some(n) if n >= PROGRESS_MIN_BYTES && term::stderr_is_tty() => {
            let pb = ProgressBar::new(n);
            pb.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            pb
        }
        _ => ProgressBar::hidden(),
    }
}

/// Runs a files command.
pub async fn run(g: &Global, c: FilesCmd) -> anyhow::Result<u8> {
    let client = g.client()?;
    match c {
        FilesCmd::Put {
            id,
            local,
            remote,
            mode,
            user,
        } => {
            let id = sandbox_id(&id)?;
            let mode = parse_mode(mode.as_deref())?;
            let stat = if local.as_os_str() == "-" {
                let stream = tokio_util::io::ReaderStream::new(tokio::io::stdin());
                client
                    .write_file(
                        &id,
                        &remote,
                        user.as_deref(),
                        mode,
                        reqwest::Body::wrap_stream(stream),
                    )
                    .await?
            } else {
                let file = tokio::fs::File::open(&local)
                    .await
                    .map_err(|e| anyhow::anyhow!("{}: {e}", local.display()))?;
                let size = file.metadata().await?.len();
                let pb = bar(Some(size));
                let progress = pb.clone();
                let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024).inspect(
                    move |chunk| {
                        if let Ok(c) = chunk {
                            progress.inc(c.len() as u64);
                        }
                    },
                );
                let stat = client
                    .write_file(
                        &id,
                        &remote,
                        user.as_deref(),
                        mode,
                        reqwest::Body::wrap_stream(stream),
                    )
                    .await;
                pb.finish_and_clear();
                stat?
            };
            if g.json {
                render::json(&stat)?;
            } else {
                println!("{} ({})", stat.path, render::bytes(stat.size));
            }
        }
        FilesCmd::Get {
            id,
            remote,
            local,
            user,
        } => {
            let id = sandbox_id(&id)?;
            let (size, mut stream) = client.read_file(&id, &remote, user.as_deref()).await?;
            if local.as_os_str() == "-" {
                let mut out = tokio::io::stdout();
                while let Some(chunk) = stream.next().await {
                    out.write_all(&chunk?).await?;
                }
                out.flush().await?;
            } else {
                // Into a directory: keep the remote file name.
                let local = if local.is_dir() {
                    let name = remote
                        .rsplit('/')
                        .find(|c| !c.is_empty())
                        .unwrap_or("download");
                    local.join(name)
                } else {
                    local
                };
                // Write next to the target and rename, so a broken download leaves no half file.
                let tmp = local.with_file_name(format!(
                    ".{}.space-partial",
                    local
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| "download".into())
                ));
                let pb = bar(size);
                let result = async {
                    let mut f = tokio::fs::File::create(&tmp).await?;
                    let mut written = 0u64;
                    while let Some(chunk) = stream.next().await {
                        let chunk = chunk?;
                        f.write_all(&chunk).await?;
                        written += chunk.len() as u64;
                        pb.inc(chunk.len() as u64);
                    }
                    f.flush().await?;
                    f.sync_all().await?;
                    if let Some(expected) = size {
                        anyhow::ensure!(
                            written == expected,
                            "download ended early: {written} of {expected} bytes"
                        );
                    }
                    tokio::fs::rename(&tmp, &local).await?;
                    anyhow::Ok(written)
                }
                .await;
                pb.finish_and_clear();
                match result {
                    Ok(n) if !g.json => println!("{} ({})", local.display(), render::bytes(n)),
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tokio::fs::remove_file(&tmp).await;
                        return Err(e);
                    }
                }
            }
        }
        FilesCmd::Ls {
            id,
            remote,
            depth,
            user,
        } => {
            let list = client
                .list_files(&sandbox_id(&id)?, &remote, Some(depth), user.as_deref())
                .await?;
            if g.json {
                render::json(&list)?;
            } else {
                render::files(&list.entries, list.truncated);
            }
        }
        FilesCmd::Rm {
            id,
            remote,
            recursive,
            user,
        } => {
            client
                .remove_file(&sandbox_id(&id)?, &remote, recursive, user.as_deref())
                .await?;
        }
        FilesCmd::Stat { id, remote, user } => {
            let stat = client
                .stat(&sandbox_id(&id)?, &remote, user.as_deref())
                .await?;
            if g.json {
                render::json(&stat)?;
            } else {
                render::stat(&stat);
            }
        }
        FilesCmd::Mkdir {
            id,
            remote,
            mode,
            user,
        } => {
            let req = MkdirRequest {
                path: remote,
                mode: parse_mode(mode.as_deref())?,
                user,
            };
            let stat = client.mkdir(&sandbox_id(&id)?, &req).await?;
            if g.json {
                render::json(&stat)?;
            }
        }
        FilesCmd::Mv { id, from, to, user } => {
            client
                .rename(&sandbox_id(&id)?, &RenameRequest { from, to, user })
                .await?;
        }
        FilesCmd::Watch {
            id,
            remote,
            recursive,
            user,
        } => {
            let req = WatchRequest {
                path: remote,
                recursive,
                user,
            };
            let mut events = client.watch(&sandbox_id(&id)?, &req).await?;
            while let Some(ev) = events.next().await {
                let ev = ev?;
                if g.json {
                    println!("{}", serde_json::to_string(&ev)?);
                } else {
                    println!("{}", render::watch_line(&ev));
                }
            }
        }
    }
    Ok(0)
}

//! `space shell ID`: an interactive login shell on a pseudo-terminal of our size.
//!
//! Our terminal goes to raw mode (restored on exit); keystrokes are forwarded through one
//! streamed `/stdin` request, output comes from `/output` (resumed with `after=SEQ` if the
//! connection breaks), and SIGWINCH becomes `/resize`.

use std::io::Read;

use clap::Args;
use futures::StreamExt;
use space_cli::client::{shell_exit_code, SpaceClient};
use space_core::process::{OutputEvent, ProcessSpec};
use space_core::SandboxId;
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::sandbox_id;
use crate::{term, Global};

/// `space shell`.
#[derive(Args, Debug)]
pub struct ShellArgs {
    /// Sandbox id.
    id: String,
    /// User to log in as.
    #[arg(long, short)]
    user: Option<String>,
}

/// The login shell: bash if the template has it, else sh.
const SHELL_LINE: &str = "exec $(command -v bash || command -v sh) -l";

/// Runs `space shell`.
pub async fn run(g: &Global, a: ShellArgs) -> anyhow::Result<u8> {
    if !term::stdin_is_tty() {
        anyhow::bail!("space shell needs a terminal; use `space exec --stdin` for pipes");
    }
    let client = g.client()?;
    let id = sandbox_id(&a.id)?;
    let mut spec = ProcessSpec::shell(SHELL_LINE);
    spec.user = a.user;
    spec.stdin = true;
    spec.pty = Some(term::size());
    spec.env.insert(
        "TERM".into(),
        std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into()),
    );
    let info = client.start_process(&id, &spec).await?;

    let raw = term::RawMode::enter()?;
    spawn_input(client.clone(), id.clone(), info.id);
    spawn_resizer(client.clone(), id.clone(), info.id);
    let code = output(&client, &id, info.id).await;
    drop(raw);
    code
}

/// Copies pty output to our stdout until the shell exits.
async fn output(client: &SpaceClient, id: &SandboxId, pid: u64) -> anyhow::Result<u8> {
    let mut out = tokio::io::stdout();
    let mut last_seq = None;
    let mut failures = 0u32;
    loop {
        let mut events = match client.output(id, pid, last_seq).await {
            Ok(s) => s,
            Err(e) if failures < 10 => {
                failures += 1;
                tracing::debug!(error = %e, "reconnecting to the shell's output");
                tokio::time::sleep(std::time::Duration::from_millis(200 * u64::from(failures)))
                    .await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        while let Some(ev) = events.next().await {
            let Ok(ev) = ev else { break };
            failures = 0;
            last_seq = Some(ev.seq());
            match &ev {
                OutputEvent::Data { .. } => {
                    if let Some((_, bytes)) = ev.bytes() {
                        out.write_all(&bytes).await?;
                        out.flush().await?;
                    }
                }
                OutputEvent::Exit { status, .. } => {
                    return Ok((shell_exit_code(status) & 0xff) as u8)
                }
                OutputEvent::Started { .. } | OutputEvent::Lost { .. } => {}
            }
        }
    }
}

/// Reads our stdin on a thread (a blocking read; the process exits without joining it) and
/// streams it to the shell, restarting the request if it breaks.
fn spawn_input(client: SpaceClient, id: SandboxId, pid: u64) {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
        loop {
            let shared = rx.clone();
            let stream = futures::stream::unfold(shared, |rx| async move {
                let chunk = rx.lock().await.recv().await?;
                Some((Ok::<_, std::io::Error>(chunk), rx))
            });
            match client
                .write_stdin(&id, pid, reqwest::Body::wrap_stream(stream), false)
                .await
            {
                // Our stdin ended (the channel closed): nothing more to send.
                Ok(()) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "stdin request ended; restarting");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        }
    });
}

/// Forwards terminal size changes.
fn spawn_resizer(client: SpaceClient, id: SandboxId, pid: u64) {
    tokio::spawn(async move {
        let Ok(mut winch) = signal(SignalKind::window_change()) else {
            return;
        };
        while winch.recv().await.is_some() {
            let _ = client.resize(&id, pid, term::size()).await;
        }
    });
}

//! `space exec ID -- CMD ARGS...`: runs a command through `/exec`, streams its stdout and
//! stderr to ours, forwards our stdin with `--stdin`, and exits with the command's exit code
//! (128 + signal if it was killed).

use clap::Args;
use futures::StreamExt;
use space_cli::client::{shell_exit_code, EventStream, SpaceClient};
use space_core::process::{OutputEvent, OutputStream, ProcessSpec};
use space_core::SandboxId;
use tokio::io::AsyncWriteExt;

use super::{parse_pairs, sandbox_id};
use crate::Global;

/// How often a broken output stream is resumed before giving up.
const MAX_RECONNECTS: u32 = 10;

/// `space exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Sandbox id.
    id: String,
    /// User to run as.
    #[arg(long, short)]
    user: Option<String>,
    /// Working directory.
    #[arg(long)]
    cwd: Option<String>,
    /// Environment variable (KEY=VALUE, repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Kill the command after this many seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// Forward our stdin to the command (closed at EOF).
    #[arg(long)]
    stdin: bool,
    /// Run the words as one `sh -c` command line instead of a program and its arguments.
    #[arg(long)]
    sh: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs `space exec`.
pub async fn run(g: &Global, a: ExecArgs) -> anyhow::Result<u8> {
    let client = g.client()?;
    let id = sandbox_id(&a.id)?;
    let mut spec = if a.sh {
        ProcessSpec::shell(a.command.join(" "))
    } else {
        ProcessSpec::argv(a.command)
    };
    spec.env = parse_pairs(&a.env, "--env")?;
    spec.cwd = a.cwd;
    spec.user = a.user;
    spec.timeout_ms = a.timeout.map(|s| s.saturating_mul(1000));
    spec.stdin = a.stdin;
    let events = client.exec(&id, &spec).await?;
    let code = pump(&client, &id, events, a.stdin).await?;
    Ok(code)
}

/// Writes events to stdout/stderr until `exit`, resuming broken streams; starts the stdin
/// forwarder when `forward_stdin` and the process has started.
async fn pump(
    client: &SpaceClient,
    id: &SandboxId,
    mut events: EventStream,
    forward_stdin: bool,
) -> anyhow::Result<u8> {
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    let mut pid = None;
    let mut last_seq = None;
    let mut reconnects = 0;
    loop {
        let ev = match events.next().await {
            Some(Ok(ev)) => ev,
            Some(Err(e)) if pid.is_none() => return Err(e.into()),
            None if pid.is_none() => {
                anyhow::bail!("the output stream ended before the process started")
            }
            broken => {
                reconnects += 1;
                if reconnects > MAX_RECONNECTS {
                    match broken {
                        Some(Err(e)) => return Err(e.into()),
                        _ => {
                            anyhow::bail!("the output stream keeps ending before the process exits")
                        }
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(
                    200 * u64::from(reconnects),
                ))
                .await;
                if let Some(p) = pid {
                    if let Ok(stream) = client.output(id, p, last_seq).await {
                        events = stream;
                    }
                }
                continue;
            }
        };
        last_seq = Some(ev.seq());
        match &ev {
            OutputEvent::Started { id: p, .. } => {
                pid = Some(*p);
                if forward_stdin {
                    spawn_stdin_forwarder(client.clone(), id.clone(), *p);
                }
            }
            OutputEvent::Data { .. } => {
                if let Some((stream, bytes)) = ev.bytes() {
                    match stream {
                        OutputStream::Stdout | OutputStream::Pty => {
                            out.write_all(&bytes).await?;
                            out.flush().await?;
                        }
                        OutputStream::Stderr => {
                            err.write_all(&bytes).await?;
                            err.flush().await?;
                        }
                    }
                }
            }
            OutputEvent::Lost { bytes, .. } => {
                eprintln!("space: {bytes} bytes of output were lost")
            }
            OutputEvent::Exit { status, .. } => {
                if status.timed_out {
                    eprintln!("space: the command timed out");
                }
                return Ok((shell_exit_code(status) & 0xff) as u8);
            }
        }
    }
}

fn spawn_stdin_forwarder(client: SpaceClient, id: SandboxId, pid: u64) {
    tokio::spawn(async move {
        let stream = tokio_util::io::ReaderStream::new(tokio::io::stdin());
        if let Err(e) = client
            .write_stdin(&id, pid, reqwest::Body::wrap_stream(stream), true)
            .await
        {
            eprintln!("space: forwarding stdin failed: {e}");
        }
    });
}

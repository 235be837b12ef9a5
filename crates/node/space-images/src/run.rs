//! Running build tools: their output lines go to the progress callback as they come, and the
//! last lines go into the error if the tool fails.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use space_storage::cmd::describe;

use crate::error::ImageError;

/// How many output lines an error keeps.
const TAIL_LINES: usize = 30;
/// Longest output line passed on (longer ones are cut).
const MAX_LINE: usize = 500;

/// Runs `cmd`, passing each line it prints (stdout and stderr) to `on_line`; fails with the
/// last lines unless it exits 0.
pub(crate) fn run(cmd: &mut Command, on_line: &dyn Fn(&str)) -> Result<(), ImageError> {
    let line = describe(cmd);
    tracing::debug!(command = %line, "running");
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ImageError::Spawn { program, source })?;
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(forward(out, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(forward(err, tx.clone()));
    }
    drop(tx);
    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    for l in rx {
        on_line(&l);
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(l);
    }
    for r in readers {
        let _ = r.join();
    }
    let status = child
        .wait()
        .map_err(|e| ImageError::io("wait for", line.clone(), e))?;
    if !status.success() {
        return Err(ImageError::Command {
            command: line,
            status: status.to_string(),
            output: Vec::from(tail).join("\n"),
        });
    }
    Ok(())
}

/// Passes the lines of `stream` to `tx` (bounded: an endless line comes in pieces, long
/// ones cut), from a thread of its own.
pub(crate) fn forward(
    stream: impl std::io::Read + Send + 'static,
    tx: mpsc::Sender<String>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            // Bounded: an endless line is passed on in pieces.
            match reader.by_ref().take(64 * 1024).read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let mut s = String::from_utf8_lossy(&buf).trim_end().to_owned();
                    if s.len() > MAX_LINE {
                        let cut = (0..=MAX_LINE)
                            .rev()
                            .find(|i| s.is_char_boundary(*i))
                            .unwrap_or(0);
                        s.truncate(cut);
                    }
                    if !s.is_empty() && tx.send(s).is_err() {
                        break;
                    }
                }
            }
        }
    })
}

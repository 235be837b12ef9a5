//! A template's start command ([`TemplateStart`]): started in a fresh guest of the template,
//! then its ready check run every second until it passes.
//!
//! It runs where a guest of the template comes up from nothing: when the template's memory
//! image is made (so every sandbox restored from the image, and every pool member, has it
//! running and ready, as E2B's templates do) and when a sandbox boots cold (no image, or a
//! stopped sandbox started again). A sandbox restored from an image never runs it again.
//!
//! The command runs in the background, as the template's default user, in its working
//! directory, with its environment. It is ready when the ready check exits with 0; without
//! a check, once it has run [`SETTLE`] without failing. A start command that exits with 0
//! before that is ready too (a set-up script); one that exits otherwise, or a check that
//! does not pass within the bound, fails what was starting it: a template build
//! (`start_failed`), a memory image, a boot.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use space_core::build_steps::TemplateStart;
use space_core::process::{ExitStatus, OutputEvent, ProcessSpec};
use space_guest_client::GuestClient;
use tokio::sync::oneshot;

use space_core::template::{TemplateBuildError, TemplateBuildErrorCode, TemplateInfo};

use crate::guest_run::{failure, run_to_exit, LineSplitter, RunError};
use crate::template_builds::Log;
use crate::template_steps::node_failed;
use crate::{Node, NodeError};

/// Pause between ready checks.
const READY_RETRY: Duration = Duration::from_secs(1);
/// Longest one ready check may run.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a start command without a ready check must run without failing.
const SETTLE: Duration = Duration::from_secs(1);
/// The tag the start command's process has in listings.
pub const START_TAG: &str = "start";

/// Why a start command did not become ready.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartFailed(pub String);

impl Node {
    /// Template `made` with start command `start`: the same image under another digest
    /// (from the cache if a build made it before), its start command tried before anything
    /// names it. The try is the template's memory image (which every sandbox of it then
    /// starts from, the command running); without memory images, a builder sandbox.
    pub(crate) async fn with_start(
        &self,
        build_id: &str,
        made: &TemplateInfo,
        start: &TemplateStart,
        log: &Log,
    ) -> Result<TemplateInfo, TemplateBuildError> {
        let key = start.template_key(&made.digest);
        let template = match self.cached_step(&key)? {
            Some(cached) => cached,
            None => {
                let template = TemplateInfo {
                    name: String::new(),
                    digest: key,
                    built_at_ms: crate::sandbox_manager::now_ms(),
                    start: Some(start.clone()),
                    ..made.clone()
                };
                self.derive_template(made, template).await?
            }
        };
        let start_failed = |e: NodeError| match e {
            NodeError::TemplateStartFailed(m) => TemplateBuildError {
                code: TemplateBuildErrorCode::StartFailed,
                message: m,
            },
            other => node_failed(other),
        };
        if self.inner.cfg.memory_images {
            log("trying the start command in the template's memory image");
            let resources = template.default_resources;
            let key = crate::image::ImageKey::new(
                &template,
                &resources,
                self.inner.accel,
                self.inner.cfg.sandbox_network,
            );
            self.template_image(&key, &template, Some(log.clone()))
                .await
                .map_err(start_failed)?;
            return Ok(template);
        }
        let disk_mib = template.default_resources.disk_mib;
        let b = self
            .start_builder(build_id, &template, disk_mib, log)
            .await?;
        let tried = start_and_wait_ready(
            &b.guest,
            start,
            &BTreeMap::new(),
            template.workdir.as_deref(),
            log,
        )
        .await;
        if let Err(e) = self.delete_sandbox(&b.id).await {
            tracing::warn!(build = build_id, sandbox = %b.id, error = %e, "cannot delete a builder");
        }
        tried.map_err(|e| TemplateBuildError {
            code: TemplateBuildErrorCode::StartFailed,
            message: e.0,
        })?;
        Ok(template)
    }
}

/// Starts `start` in `guest` (with `env` on top of the guest's) and waits until it is ready.
/// Its output until then goes to `log`, prefixed.
pub(crate) async fn start_and_wait_ready(
    guest: &GuestClient,
    start: &TemplateStart,
    env: &BTreeMap<String, String>,
    workdir: Option<&str>,
    log: &Log,
) -> Result<(), StartFailed> {
    let started = Instant::now();
    let spec = |argv: Vec<String>, tag: Option<&str>, timeout: Option<Duration>| ProcessSpec {
        argv: Some(argv),
        env: env.clone(),
        cwd: workdir.map(str::to_owned),
        timeout_ms: timeout.map(|t| t.as_millis() as u64),
        tag: tag.map(str::to_owned),
        ..Default::default()
    };
    log(&format!("start: {}", describe(&start.command.argv())));
    let info = guest
        .start_process(&spec(start.command.argv(), Some(START_TAG), None))
        .await
        .map_err(|e| StartFailed(format!("the start command could not start: {e}")))?;
    // Its output is logged and its exit noticed while the checks run; once it is ready the
    // follower goes (the guest keeps the output for whoever asks).
    let (exit_tx, mut exit_rx) = oneshot::channel();
    let follower = {
        let (guest, log) = (guest.clone(), log.clone());
        tokio::spawn(async move {
            let status = follow(&guest, info.id, &log).await;
            let _ = exit_tx.send(status);
        })
    };
    let result = async {
        let Some(ready) = &start.ready else {
            return tokio::select! {
                exit = &mut exit_rx => exited(exit),
                () = tokio::time::sleep(SETTLE) => Ok(()),
            };
        };
        log(&format!("ready check: {}", describe(&ready.argv())));
        let deadline = started + start.ready_timeout();
        let mut last = String::from("not run");
        let mut attempts = 0u32;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(StartFailed(format!(
                    "the start command was not ready within {} s (the ready check {last})",
                    start.ready_timeout().as_secs()
                )));
            }
            let bound = remaining.min(CHECK_TIMEOUT);
            let check_spec = spec(ready.argv(), Some("ready-check"), Some(bound));
            let check = run_to_exit(guest, &check_spec, |_| {});
            tokio::select! {
                exit = &mut exit_rx => return exited(exit),
                status = check => {
                    let status = status.map_err(|e| match e {
                        RunError::Start(e) => StartFailed(format!("the ready check could not start: {e}")),
                        RunError::Output(e) => StartFailed(format!("the ready check's {e}")),
                    })?;
                    match failure(&status, bound.as_secs()) {
                        None => return Ok(()),
                        Some(why) => last = why,
                    }
                }
            }
            attempts += 1;
            // The first failure and then every tenth (`is_multiple_of` is newer than our MSRV).
            if attempts == 1 || attempts.rem_euclid(10) == 0 {
                log(&format!("  not ready yet (the ready check {last})"));
            }
            tokio::select! {
                exit = &mut exit_rx => return exited(exit),
                () = tokio::time::sleep(READY_RETRY) => {}
            }
        }
    }
    .await;
    follower.abort();
    if result.is_ok() {
        log(&format!(
            "start command ready after {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    result
}

/// The start command ended before it was found ready: ready if it exited with 0.
fn exited(
    exit: Result<Result<ExitStatus, String>, oneshot::error::RecvError>,
) -> Result<(), StartFailed> {
    match exit {
        Ok(Ok(status)) => match failure(&status, 0) {
            None => Ok(()),
            Some(why) => Err(StartFailed(format!("the start command {why}"))),
        },
        Ok(Err(e)) => Err(StartFailed(format!("the start command's output: {e}"))),
        Err(_) => Err(StartFailed("the start command's follower went away".into())),
    }
}

/// Logs the start command's output until it exits; its exit status.
async fn follow(
    guest: &GuestClient,
    id: space_core::process::ProcessId,
    log: &Log,
) -> Result<ExitStatus, String> {
    let mut events = guest.output(id, None).await.map_err(|e| e.to_string())?;
    let mut lines = LineSplitter::default();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| e.to_string())?;
        if let Some((_, bytes)) = event.bytes() {
            for line in lines.push(&bytes) {
                log(&format!("  start | {line}"));
            }
        } else if let OutputEvent::Exit { status, .. } = event {
            if let Some(rest) = lines.finish() {
                log(&format!("  start | {rest}"));
            }
            return Ok(status);
        }
    }
    Err("ended before the process exited".into())
}

/// A command as the log shows it (bounded).
fn describe(argv: &[String]) -> String {
    let text = match argv {
        [sh, c, line] if sh == "/bin/sh" && c == "-c" => line.clone(),
        _ => serde_json::to_string(argv).unwrap_or_default(),
    };
    space_core::text::prefix_at_char_boundary(&text, 300).to_owned()
}

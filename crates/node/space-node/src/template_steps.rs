//! A template build's steps (`RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`; see
//! `space_core::build_steps`), run in a builder sandbox on this node.
//!
//! The builder is an ordinary sandbox of the image built so far (its own VM, the node's
//! egress policy, a tenant of its own with no credentials), marked as the build's so the
//! control plane never sees it. Each step that changes the disk runs in it, then its disk is
//! snapshotted (file systems frozen for the instant) and installed by the node manager as an
//! unnamed template whose digest is the step's cache key: a later build with the same step
//! on the same base finds it and runs nothing. Only the first step not in the cache starts
//! a builder; the builder goes with the build, whatever its outcome.
//!
//! `COPY` reads archives uploaded beforehand from the node's `build-files/` directory,
//! checked against their SHA-256 as they are stored: put there directly
//! ([`Node::put_build_files`]), or fetched from the object store when a step needs one
//! (the control plane keeps them there when it has one, so any node of a cluster can build).

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use space_core::build_steps::{
    changes_disk, step_key, validate_files_hash, BuildStep, RunCommand, StepContext,
    MAX_BUILD_FILES_BYTES,
};
use space_core::process::ProcessSpec;
use space_core::sandbox::ResourcesRequest;
use space_core::template::{TemplateBuildError, TemplateBuildErrorCode, TemplateInfo};
use space_core::{SandboxId, SnapshotTrigger, TenantId};
use space_guest_client::GuestClient;
use space_node_proto::{CreateSandbox, SandboxSettings};
use tokio::io::AsyncWriteExt;

use crate::guest_run::{failure, run_to_exit, RunError};
use crate::sandbox_manager::{internal, now_ms};
use crate::template_builds::Log;
use crate::{Node, NodeError};

/// Disk a builder has beyond its base image, for what the steps install (the template's
/// image is this size, sparse; hashed once, when the build names it).
const BUILD_HEADROOM_MIB: u32 = 2048;
/// Longest a single `RUN` may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// How long an uploaded archive of files is kept after it was last uploaded or used.
const BUILD_FILES_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// A running builder.
pub(crate) struct Builder {
    pub(crate) id: SandboxId,
    pub(crate) guest: GuestClient,
}

fn failed(code: TemplateBuildErrorCode, message: impl Into<String>) -> TemplateBuildError {
    TemplateBuildError {
        code,
        message: message.into(),
    }
}

pub(crate) fn node_failed(e: impl std::fmt::Display) -> TemplateBuildError {
    failed(TemplateBuildErrorCode::NodeFailed, e.to_string())
}

/// What the log shows of a step.
fn describe(step: &BuildStep) -> String {
    let text = match step {
        BuildStep::Run(RunCommand::Shell(line)) => format!("RUN {line}"),
        BuildStep::Run(RunCommand::Exec(argv)) => {
            format!("RUN {}", serde_json::to_string(argv).unwrap_or_default())
        }
        BuildStep::Copy(c) => format!(
            "COPY {}{} {}",
            c.chown
                .as_deref()
                .map(|u| format!("--chown={u} "))
                .unwrap_or_default(),
            &c.files[..12.min(c.files.len())],
            c.dest
        ),
        BuildStep::Env(vars) => {
            format!("ENV {}", vars.keys().cloned().collect::<Vec<_>>().join(" "))
        }
        BuildStep::Workdir(dir) => format!("WORKDIR {dir}"),
        BuildStep::User(user) => format!("USER {user}"),
    };
    space_core::text::prefix_at_char_boundary(&text, 300).to_owned()
}

impl Node {
    /// Where uploaded `COPY` archives are kept.
    fn build_files_dir(&self) -> PathBuf {
        self.inner.cfg.data_dir.join("build-files")
    }

    /// Stores a `COPY` archive whose SHA-256 is `sha256` (hex), streamed from `body`; an
    /// archive stored before is kept (and the body not read). Refused if the bytes do not
    /// hash to `sha256` or pass [`MAX_BUILD_FILES_BYTES`]. Returns the archive's size.
    pub async fn put_build_files(
        &self,
        sha256: &str,
        mut body: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<u64, NodeError> {
        if !validate_files_hash(sha256) {
            return Err(NodeError::Invalid(
                "files are named by the hex SHA-256 of their archive".into(),
            ));
        }
        let dir = self.build_files_dir();
        let path = dir.join(sha256);
        if let Ok(md) = tokio::fs::metadata(&path).await {
            touch(&path);
            return Ok(md.len());
        }
        let sweep = dir.clone();
        let _ = tokio::task::spawn_blocking(move || forget_old_files(&sweep)).await;
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| internal("build files directory", e))?;
        let tmp = tempfile::NamedTempFile::new_in(&dir)
            .map_err(|e| internal("build files temporary file", e))?;
        let (std_file, tmp_path) = tmp.into_parts();
        let mut file = tokio::fs::File::from_std(std_file);
        let mut hash = Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| NodeError::Invalid(format!("reading the files: {e}")))?;
            size += chunk.len() as u64;
            if size > MAX_BUILD_FILES_BYTES {
                return Err(NodeError::Invalid(format!(
                    "an archive of files is at most {MAX_BUILD_FILES_BYTES} bytes"
                )));
            }
            hash.update(&chunk);
            file.write_all(&chunk)
                .await
                .map_err(|e| internal("writing build files", e))?;
        }
        let got = hex::encode(hash.finalize());
        if got != sha256 {
            return Err(NodeError::Invalid(format!(
                "the files hash to {got}, not {sha256}"
            )));
        }
        file.sync_all()
            .await
            .map_err(|e| internal("writing build files", e))?;
        tmp_path
            .persist(&path)
            .map_err(|e| internal("storing build files", e.error))?;
        Ok(size)
    }

    /// Whether the `COPY` archive `sha256` is here.
    pub fn has_build_files(&self, sha256: &str) -> bool {
        validate_files_hash(sha256) && self.build_files_dir().join(sha256).is_file()
    }

    /// Makes sure the `COPY` archive `sha256` is here: uploaded to this node, or fetched
    /// from the object store, where the control plane keeps them when it has one (one
    /// fetch per archive at a time; the archive is checked against its name).
    async fn ensure_build_files(&self, sha256: &str, log: &Log) -> Result<(), TemplateBuildError> {
        let not_found = || {
            failed(
                TemplateBuildErrorCode::FilesNotFound,
                format!(
                    "COPY's files {sha256} were not uploaded (PUT /v1/templates/files/{sha256})"
                ),
            )
        };
        if self.has_build_files(sha256) {
            return Ok(());
        }
        let Some(objects) = self.inner.objects.clone() else {
            return Err(not_found());
        };
        let key = space_objects::ObjectKey::build_files(sha256).map_err(|_| not_found())?;
        let fetch = async {
            if self.has_build_files(sha256) {
                return Ok(());
            }
            let size = match objects.stat(&key).await.map_err(node_failed)? {
                Some(s) if s.size <= MAX_BUILD_FILES_BYTES => s.size,
                Some(_) => {
                    return Err(failed(
                        TemplateBuildErrorCode::BadStep,
                        format!(
                            "COPY's files {sha256} are larger than {MAX_BUILD_FILES_BYTES} bytes"
                        ),
                    ))
                }
                None => return Err(not_found()),
            };
            log(&format!(
                "  fetching COPY's files {sha256} ({size} bytes) from the object store"
            ));
            let dir = self.build_files_dir();
            tokio::fs::create_dir_all(&dir).await.map_err(node_failed)?;
            let artifact = space_objects::Artifact {
                key: key.as_str().to_owned(),
                size,
                sha256: sha256.to_owned(),
            };
            objects
                .get_to_file(&artifact, &dir.join(sha256))
                .await
                .map_err(node_failed)
        };
        self.inner.published.fetching.run(key.as_str(), fetch).await
    }

    /// Runs `steps` on top of template `base`; returns the template they make (unnamed: the
    /// caller names it), from the cache where every step is.
    pub(crate) async fn run_build_steps(
        &self,
        build_id: &str,
        base: &TemplateInfo,
        steps: &[BuildStep],
        log: &Log,
    ) -> Result<TemplateInfo, TemplateBuildError> {
        for step in steps {
            if let BuildStep::Copy(c) = step {
                self.ensure_build_files(&c.files, log).await?;
            }
        }
        let mut builder: Option<Builder> = None;
        let outcome = self
            .run_steps_with(build_id, base, steps, log, &mut builder)
            .await;
        if let Some(b) = builder {
            if let Err(e) = self.delete_sandbox(&b.id).await {
                tracing::warn!(build = build_id, sandbox = %b.id, error = %e, "cannot delete a builder");
            }
        }
        outcome
    }

    async fn run_steps_with(
        &self,
        build_id: &str,
        base: &TemplateInfo,
        steps: &[BuildStep],
        log: &Log,
        builder: &mut Option<Builder>,
    ) -> Result<TemplateInfo, TemplateBuildError> {
        let mut cx = StepContext {
            env: base.env.clone(),
            workdir: base.workdir.clone(),
            // Steps run as root until a USER says otherwise, as in Docker; the template's
            // sandboxes keep the base's default user unless a USER step set one.
            user: "root".into(),
        };
        let disk_mib = base
            .image_size_mib
            .max(base.default_resources.disk_mib)
            .saturating_add(BUILD_HEADROOM_MIB)
            .max(
                self.inner
                    .template_builds
                    .builder_of(build_id)
                    .disk_mib
                    .unwrap_or(0),
            );
        let mut key = base.digest.clone();
        let mut current = base.clone();
        for (i, step) in steps.iter().enumerate() {
            log(&format!(
                "step {}/{}: {}",
                i + 1,
                steps.len(),
                describe(step)
            ));
            let next = step_key(&key, &cx, step);
            let before = cx.clone();
            cx.apply(step);
            key = next;
            if !changes_disk(step) {
                continue;
            }
            if let Some(cached) = self.cached_step(&key)? {
                log("  cached");
                current = cached;
                // A builder holds an older disk than the cache's: start again from it.
                if let Some(b) = builder.take() {
                    let _ = self.delete_sandbox(&b.id).await;
                }
                continue;
            }
            let b = self
                .ensure_builder(builder, build_id, &current, disk_mib, log)
                .await?;
            let started = std::time::Instant::now();
            self.run_step(b, step, &before, &cx, log).await?;
            current = self
                .commit_step(
                    build_id,
                    b,
                    base,
                    &current,
                    &key,
                    &cx,
                    disk_mib,
                    &steps[..=i],
                )
                .await?;
            log(&format!(
                "  done in {:.1} s",
                started.elapsed().as_secs_f64()
            ));
        }
        if current.digest == key {
            return Ok(current);
        }
        // Trailing ENV or USER steps: the image as it is, under the final key with the
        // final context (no builder needed: the disk does not change).
        if let Some(cached) = self.cached_step(&key)? {
            return Ok(cached);
        }
        let template = TemplateInfo {
            image_size_mib: current.image_size_mib,
            ..step_template(base, &current, &key, &cx, disk_mib, steps)
        };
        self.derive_template(&current, template).await
    }

    /// Installs `template` (unnamed), whose image is `from`'s as it is: a reflink, no VM.
    /// For what changes only a template's defaults: trailing `ENV`/`USER` steps, a start
    /// command.
    pub(crate) async fn derive_template(
        &self,
        from: &TemplateInfo,
        template: TemplateInfo,
    ) -> Result<TemplateInfo, TemplateBuildError> {
        let image = self.inner.store.templates().image_path(from);
        self.install_reflink_of(image, template, "derive").await
    }

    /// Installs `template` (unnamed) with a reflink of `image` as its image, through the
    /// node manager; `what` names the scratch directory (`step`, `derive`).
    async fn install_reflink_of(
        &self,
        image: PathBuf,
        template: TemplateInfo,
        what: &str,
    ) -> Result<TemplateInfo, TemplateBuildError> {
        let staged = self
            .scratch_dir(&template.digest, what)
            .map_err(node_failed)?;
        let (nm, store, dir) = (
            self.inner.nm.clone(),
            self.inner.store.clone(),
            staged.clone(),
        );
        let result = tokio::task::spawn_blocking(move || {
            space_storage::reflink(&image, &dir.join(space_storage::IMAGE_FILE))
                .map_err(|e| e.to_string())?;
            nm.install_template(&store, &dir, &template, false)
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(node_failed)?
        .map_err(|e| node_failed(format!("installing the template: {e}")));
        let _ = tokio::fs::remove_dir_all(&staged).await;
        result
    }

    pub(crate) fn cached_step(
        &self,
        key: &str,
    ) -> Result<Option<TemplateInfo>, TemplateBuildError> {
        let hit = self
            .inner
            .store
            .templates()
            .lookup_digest(key)
            .map_err(node_failed)?;
        if hit.is_some() {
            self.mark_template_used(key);
        }
        Ok(hit)
    }

    /// The running builder, started from `current` if there is none.
    async fn ensure_builder<'b>(
        &self,
        builder: &'b mut Option<Builder>,
        build_id: &str,
        current: &TemplateInfo,
        disk_mib: u32,
        log: &Log,
    ) -> Result<&'b Builder, TemplateBuildError> {
        if builder.is_none() {
            *builder = Some(self.start_builder(build_id, current, disk_mib, log).await?);
        }
        builder
            .as_ref()
            .ok_or_else(|| node_failed("the builder is gone"))
    }

    /// Starts a builder from template `from` (booted, not from a memory image or the pool:
    /// each step's template is used once).
    pub(crate) async fn start_builder(
        &self,
        build_id: &str,
        from: &TemplateInfo,
        disk_mib: u32,
        log: &Log,
    ) -> Result<Builder, TemplateBuildError> {
        log("  starting a builder sandbox");
        let id = SandboxId::generate();
        let req = CreateSandbox {
            id: id.clone(),
            template: if from.name.is_empty() {
                "build".into()
            } else {
                from.name.clone()
            },
            template_digest: Some(from.digest.clone()),
            resources: ResourcesRequest {
                disk_mib: Some(disk_mib),
                ..Default::default()
            },
            settings: SandboxSettings {
                egress: self.inner.template_builds.builder_of(build_id).egress,
                ..SandboxSettings::new(TenantId::generate())
            },
        };
        self.create_sandbox_for(req, Some(build_id))
            .await
            .map_err(|e| node_failed(format!("the builder sandbox did not start: {e}")))?;
        let guest = self
            .guest_waking(&id)
            .await
            .map_err(|e| node_failed(format!("the builder sandbox's daemon: {e}")))?;
        Ok(Builder { id, guest })
    }

    /// Runs one disk step in the builder. `before` is the context it runs in, `after` the
    /// one it leaves (a `WORKDIR`'s directory).
    async fn run_step(
        &self,
        b: &Builder,
        step: &BuildStep,
        before: &StepContext,
        after: &StepContext,
        log: &Log,
    ) -> Result<(), TemplateBuildError> {
        let step_failed = |m: String| failed(TemplateBuildErrorCode::StepFailed, m);
        match step {
            BuildStep::Run(cmd) => {
                let spec = ProcessSpec {
                    argv: Some(cmd.argv()),
                    env: before.env.clone(),
                    // Docker's default: `/`, not the user's home (which the image may lack).
                    cwd: Some(before.workdir.clone().unwrap_or_else(|| "/".into())),
                    user: Some(before.user.clone()),
                    timeout_ms: Some(STEP_TIMEOUT.as_millis() as u64),
                    tag: Some("template-build".into()),
                    ..Default::default()
                };
                let status = run_to_exit(&b.guest, &spec, |line| log(&format!("  | {line}")))
                    .await
                    .map_err(|e| match e {
                        RunError::Start(e) => step_failed(format!("RUN could not start: {e}")),
                        RunError::Output(e) => node_failed(format!("RUN's output: {e}")),
                    })?;
                match failure(&status, STEP_TIMEOUT.as_secs()) {
                    None => Ok(()),
                    Some(why) => Err(step_failed(format!("RUN {why}"))),
                }
            }
            BuildStep::Copy(c) => {
                let dest = before.resolve(&c.dest);
                let path = self.build_files_dir().join(&c.files);
                touch(&path);
                let file = tokio::fs::File::open(&path)
                    .await
                    .map_err(|e| node_failed(format!("COPY's files: {e}")))?;
                let body = tokio_util::io::ReaderStream::new(file).boxed();
                let user = c.chown.as_deref().unwrap_or("root");
                let done = b
                    .guest
                    .unpack_archive(&dest, Some(user), body)
                    .await
                    .map_err(|e| step_failed(format!("COPY into {dest}: {e}")))?;
                log(&format!(
                    "  copied {} entries ({} bytes) into {dest}",
                    done.entries, done.bytes
                ));
                Ok(())
            }
            BuildStep::Workdir(_) => {
                let Some(dir) = after.workdir.clone() else {
                    return Ok(());
                };
                b.guest
                    .mkdir(&space_core::files::MkdirRequest {
                        path: dir.clone(),
                        user: Some("root".into()),
                        mode: None,
                    })
                    .await
                    .map_err(|e| step_failed(format!("WORKDIR {dir}: {e}")))?;
                Ok(())
            }
            BuildStep::Env(_) | BuildStep::User(_) => Ok(()),
        }
    }

    /// The builder's disk as it is now, installed as the unnamed template `key` with the
    /// context `cx` as its defaults (`done`: the steps so far, for its default user).
    #[allow(clippy::too_many_arguments)]
    async fn commit_step(
        &self,
        build_id: &str,
        b: &Builder,
        base: &TemplateInfo,
        current: &TemplateInfo,
        key: &str,
        cx: &StepContext,
        disk_mib: u32,
        done: &[BuildStep],
    ) -> Result<TemplateInfo, TemplateBuildError> {
        let template = step_template(base, current, key, cx, disk_mib, done);
        let snap = self
            .snapshot_disk(
                &b.id,
                Some(format!("template build {build_id}")),
                SnapshotTrigger::Manual,
                None,
            )
            .await
            .map_err(|e| node_failed(format!("snapshotting the builder: {e}")))?;
        let installed = async {
            let (_, paths) = self
                .inner
                .store
                .snapshot(&b.id, &snap.id)
                .map_err(node_failed)?
                .ok_or_else(|| node_failed("the builder's snapshot is gone"))?;
            // A builder is the node's own, never sealed at rest: its disk is a reflink.
            let space_storage::SnapshotDisk::Image(disk) = paths.disk else {
                return Err(node_failed("the builder's snapshot disk is sealed"));
            };
            self.install_reflink_of(disk, template, "step").await
        }
        .await;
        if let Err(e) = self.delete_snapshot(&b.id, &snap.id).await {
            tracing::warn!(build = build_id, error = %e, "cannot delete a builder's snapshot");
        }
        installed
    }
}

/// The unnamed template the steps `done` make on `base` (`current` the one before the last)
/// on a builder disk of `disk_mib`, under cache key `key` with context `cx` as its defaults. A start command is never
/// inherited: a build's own is added after its steps.
fn step_template(
    base: &TemplateInfo,
    current: &TemplateInfo,
    key: &str,
    cx: &StepContext,
    disk_mib: u32,
    done: &[BuildStep],
) -> TemplateInfo {
    let default_user = if done.iter().any(|s| matches!(s, BuildStep::User(_))) {
        cx.user.clone()
    } else {
        base.default_user.clone()
    };
    TemplateInfo {
        name: String::new(),
        digest: key.to_owned(),
        // Hashed only if the build names it (see `TemplateStore::install_unnamed`).
        image_sha256: String::new(),
        image_size_mib: disk_mib,
        kernel_digest: current.kernel_digest.clone(),
        default_resources: space_core::Resources {
            disk_mib: base.default_resources.disk_mib.max(disk_mib),
            ..base.default_resources
        },
        default_user,
        description: format!("{} with build steps", base.description),
        built_at_ms: now_ms(),
        image: base.image.clone(),
        env: cx.env.clone(),
        workdir: cx.workdir.clone(),
        image_command: base.image_command.clone(),
        start: None,
    }
}

/// Marks an archive as used now (its modification time), so the sweep keeps it.
fn touch(path: &std::path::Path) {
    let now = std::fs::FileTimes::new().set_modified(std::time::SystemTime::now());
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_times(now);
    }
}

/// Removes archives nobody uploaded or used for [`BUILD_FILES_KEEP`] (the directory would
/// otherwise grow with every changed build context). A step's cache outlives its archive:
/// a build that needs it again uploads it again.
fn forget_old_files(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > BUILD_FILES_KEEP);
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_described_briefly() {
        let d = describe(&BuildStep::Run(RunCommand::Shell("x".repeat(1000))));
        assert!(d.len() <= 300 && d.starts_with("RUN xx"));
        assert_eq!(describe(&BuildStep::User("app".into())), "USER app");
    }
}

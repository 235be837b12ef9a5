//! Template builds on this node, from registry images or templates it has, with steps
//! (see [`crate::template_steps`]) or without, started by the control plane and followed
//! by it.
//!
//! A build is split by privilege: this process (the sandbox manager, unprivileged) pulls
//! the image into a directory of the store's `incoming/` (see `space_images::oci::staged`);
//! the node manager (root) reads that directory as this process, unpacks it in the jailed
//! unpacker and installs the template. Then the template is published (on a cluster's
//! node) and warmed: its memory image made and its warm pool filled, so the first sandbox
//! of it starts as fast as the hundredth.
//!
//! Builds run without their caller (a client that goes away does not stop one) and are
//! kept in memory with their newest [`MAX_LINES`] log lines; the newest [`MAX_FINISHED`]
//! finished ones are remembered. A node that restarts forgets its builds; what a finished
//! build made stays in the store.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use space_core::template::{
    canonical_template_name, split_template_owner, validate_build_id, validate_default_user,
    TemplateBuildError, TemplateBuildErrorCode, TemplateBuildLine, TemplateBuildState,
    TemplateBuildStatus, TemplateInfo,
};
use space_images::oci::registry::{RegistryLogin, RegistryOpts};
use space_images::oci::{ImageBuildOpts, ImageSource};
use space_node_manager::protocol::{RefusalCode, TemplateBuild};
use space_node_manager::NodeManagerError;
use space_node_proto::template::{check_builder_disk_mib, BuildTemplate, MAX_IMAGE_REFERENCE};

use crate::sandbox_manager::{internal, now_ms};
use crate::{Node, NodeError};

/// Log lines a build keeps (older ones are dropped, and counted).
pub const MAX_LINES: usize = 2000;
/// Longest log line kept.
const MAX_LINE_BYTES: usize = 2048;
/// Finished builds remembered.
const MAX_FINISHED: usize = 64;
/// Builds running at once (each takes an unpacker uid range, disk bandwidth and a CPU);
/// more wait their turn.
const CONCURRENT_BUILDS: usize = 2;
/// Builds of one tenant's templates under way (running or waiting) on a node at once: a
/// tenant cannot queue the node's build slots away from everyone else. The operator's
/// (shared templates) are not bounded.
pub const MAX_BUILDS_PER_TENANT: usize = 2;
/// Most names one build may give.
const MAX_NAMES: usize = 16;

/// The node's builds.
pub(crate) struct TemplateBuilds {
    builds: Mutex<BTreeMap<String, Arc<Mutex<BuildRecord>>>>,
    slots: Arc<tokio::sync::Semaphore>,
    /// Held shared by every running build, exclusively by a removal from the template
    /// cache (see [`crate::template_cache`]): a build may need any cached step until it ends.
    pub(crate) running: Arc<tokio::sync::RwLock<()>>,
}

impl Default for TemplateBuilds {
    fn default() -> Self {
        TemplateBuilds {
            builds: Mutex::new(BTreeMap::new()),
            slots: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_BUILDS)),
            running: Arc::new(tokio::sync::RwLock::new(())),
        }
    }
}

/// One build: its status without the log, and the log.
struct BuildRecord {
    status: TemplateBuildStatus,
    lines: VecDeque<TemplateBuildLine>,
    /// What its builder sandboxes get.
    builder: BuilderSpec,
}

/// What a build's builder sandboxes get beyond the image built so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct BuilderSpec {
    /// What they may reach (`None`: the node's default).
    pub(crate) egress: Option<space_core::egress::EgressPolicy>,
    /// Their disk at least (`None`: the image's and some headroom).
    pub(crate) disk_mib: Option<u32>,
}

impl BuildRecord {
    fn log(&mut self, line: &str) {
        if self.lines.len() == MAX_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(TemplateBuildLine {
            index: self.status.next_log_index,
            ts_ms: now_ms(),
            line: space_core::text::prefix_at_char_boundary(line, MAX_LINE_BYTES).to_owned(),
        });
        self.status.next_log_index += 1;
    }

    fn view(&self, logs_from: u64) -> TemplateBuildStatus {
        TemplateBuildStatus {
            logs: self
                .lines
                .iter()
                .filter(|l| l.index >= logs_from)
                .cloned()
                .collect(),
            ..self.status.clone()
        }
    }
}

pub(crate) type Log = Arc<dyn Fn(&str) + Send + Sync>;

impl TemplateBuilds {
    /// What build `build_id` gives its builder sandboxes (the defaults for no such build).
    pub(crate) fn builder_of(&self, build_id: &str) -> BuilderSpec {
        let all = self.builds.lock().unwrap_or_else(|p| p.into_inner());
        let Some(record) = all.get(build_id) else {
            return BuilderSpec::default();
        };
        let record = record.lock().unwrap_or_else(|p| p.into_inner());
        record.builder.clone()
    }
}

impl Node {
    /// Starts build `req` (see the module doc) and returns its first status.
    pub fn start_template_build(
        &self,
        req: BuildTemplate,
    ) -> Result<TemplateBuildStatus, NodeError> {
        if !validate_build_id(&req.build_id) {
            return Err(NodeError::Invalid("invalid build id".into()));
        }
        let mut names = vec![canonical(&req.name)?];
        for n in &req.also_named {
            let n = canonical(n)?;
            if !names.contains(&n) {
                names.push(n);
            }
        }
        if names.len() > MAX_NAMES {
            return Err(NodeError::Invalid(format!(
                "a build gives at most {MAX_NAMES} names"
            )));
        }
        match (&req.from_template, req.from_image.is_empty()) {
            (None, true) | (Some(_), false) => {
                return Err(NodeError::Invalid(
                    "a build starts from an image or from a template: exactly one".into(),
                ))
            }
            (Some(t), true) => {
                canonical(t)?;
            }
            (None, false) => {}
        }
        space_core::build_steps::validate_steps(&req.steps)
            .map_err(|e| NodeError::Invalid(e.to_string()))?;
        if let Some(start) = &req.start {
            start.validate().map_err(NodeError::Invalid)?;
        }
        if let Some(mib) = req.builder_disk_mib {
            check_builder_disk_mib(mib).map_err(NodeError::Invalid)?;
        }
        if req.from_image.len() > MAX_IMAGE_REFERENCE {
            return Err(NodeError::Invalid(format!(
                "the image reference is longer than {MAX_IMAGE_REFERENCE} bytes"
            )));
        }
        if let Some(user) = &req.user {
            if !validate_default_user(user) {
                return Err(NodeError::Invalid("invalid default user".into()));
            }
        }
        let builds = &self.inner.template_builds;
        let record = {
            let mut all = builds.builds.lock().unwrap_or_else(|p| p.into_inner());
            if all.contains_key(&req.build_id) {
                return Err(NodeError::Invalid(format!(
                    "build {} exists already",
                    req.build_id
                )));
            }
            if let (Some(owner), _) = split_template_owner(&names[0]) {
                let under_way = all
                    .values()
                    .filter(|r| {
                        let r = r.lock().unwrap_or_else(|p| p.into_inner());
                        r.status.finished_at_ms.is_none()
                            && split_template_owner(&r.status.name).0 == Some(owner)
                    })
                    .count();
                if under_way >= MAX_BUILDS_PER_TENANT {
                    return Err(NodeError::TooManyBuilds(format!(
                        "{under_way} template builds of this tenant are under way; at most {MAX_BUILDS_PER_TENANT} at once"
                    )));
                }
            }
            forget_oldest_finished(&mut all);
            let record = Arc::new(Mutex::new(BuildRecord {
                status: TemplateBuildStatus {
                    build_id: req.build_id.clone(),
                    name: names[0].clone(),
                    from_image: match &req.from_template {
                        Some(t) => format!("template:{t}"),
                        None => req.from_image.clone(),
                    },
                    state: TemplateBuildState::Building,
                    logs: Vec::new(),
                    next_log_index: 0,
                    template: None,
                    error: None,
                    started_at_ms: now_ms(),
                    finished_at_ms: None,
                },
                lines: VecDeque::new(),
                builder: BuilderSpec {
                    egress: req.egress.clone(),
                    disk_mib: req.builder_disk_mib,
                },
            }));
            all.insert(req.build_id.clone(), record.clone());
            record
        };
        let log: Log = {
            let record = record.clone();
            Arc::new(move |line: &str| record.lock().unwrap_or_else(|p| p.into_inner()).log(line))
        };
        let first = record.lock().unwrap_or_else(|p| p.into_inner()).view(0);
        let node = self.clone();
        let slots = builds.slots.clone();
        let running = builds.running.clone();
        tokio::spawn(async move {
            let _slot = match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    log("waiting for another build on this node to finish");
                    match slots.acquire_owned().await {
                        Ok(slot) => slot,
                        Err(_) => return,
                    }
                }
            };
            let _running = running.read_owned().await;
            let outcome = node.build_template(&req, &names, log.clone()).await;
            let mut rec = record.lock().unwrap_or_else(|p| p.into_inner());
            match outcome {
                Ok(template) => {
                    rec.status.state = TemplateBuildState::Ready;
                    rec.status.template = Some(template);
                }
                Err(error) => {
                    tracing::warn!(build = %req.build_id, code = ?error.code, error = %error.message, "template build failed");
                    rec.log(&format!("build failed: {}", error.message));
                    rec.status.state = TemplateBuildState::Failed;
                    rec.status.error = Some(error);
                }
            }
            rec.status.finished_at_ms = Some(now_ms());
        });
        Ok(first)
    }

    /// Build `id`, with its log lines from index `logs_from`.
    pub fn template_build(
        &self,
        id: &str,
        logs_from: u64,
    ) -> Result<TemplateBuildStatus, NodeError> {
        let all = self
            .inner
            .template_builds
            .builds
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let record = all
            .get(id)
            .ok_or_else(|| NodeError::BuildNotFound(id.chars().take(64).collect()))?;
        let view = record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .view(logs_from);
        Ok(view)
    }

    /// Removes template name `name` (see [`space_node_proto::api::NodeApi::delete_template`]).
    pub async fn delete_template(&self, name: &str) -> Result<bool, NodeError> {
        let name = canonical(name)?;
        let digest = self.inner.store.templates().name_digest(&name)?;
        let nm = self.inner.nm.clone();
        let store = self.inner.store.clone();
        let owned = name.clone();
        let removed = tokio::task::spawn_blocking(move || nm.remove_template_name(&store, &owned))
            .await
            .map_err(|e| internal("template removal task", e))??;
        if let Some(digest) = digest {
            let still_there = self
                .inner
                .store
                .templates()
                .lookup_digest(&digest)?
                .is_some();
            if !still_there {
                self.forget_template(&digest).await;
            }
        }
        let unpublished = if self.inner.objects.is_some() {
            self.unpublish_template_name(&name).await?
        } else {
            false
        };
        Ok(removed || unpublished)
    }

    /// Makes what the first sandbox of `tpl` with its default resources needs: the memory
    /// image, and the warm pool's members (filled in the background).
    pub async fn warm_template(&self, tpl: &TemplateInfo) -> Result<(), NodeError> {
        self.warm_template_logged(tpl, None).await
    }

    /// [`Node::warm_template`], the start command's progress into `log`.
    async fn warm_template_logged(
        &self,
        tpl: &TemplateInfo,
        log: Option<Log>,
    ) -> Result<(), NodeError> {
        if !self.inner.cfg.memory_images {
            return Ok(());
        }
        let resources = tpl.default_resources;
        let key = crate::image::ImageKey::new(
            tpl,
            &resources,
            self.inner.accel,
            self.inner.cfg.sandbox_network,
        );
        self.template_image(&key, tpl, log).await?;
        self.inner.pool.want(&key, tpl, &resources);
        Ok(())
    }

    /// Warms the templates the configuration names (`warm_templates`), in the background.
    pub(crate) fn start_warming(&self) {
        if !self.inner.cfg.memory_images || self.inner.cfg.warm_templates.is_empty() {
            return;
        }
        let node = self.clone();
        let task = tokio::spawn(async move {
            for name in &node.inner.cfg.warm_templates {
                let Ok(tpl) = node.template(name) else {
                    tracing::info!(template = %name, "not warming a template this node lacks");
                    continue;
                };
                let started = std::time::Instant::now();
                match node.warm_template(&tpl).await {
                    Ok(()) => {
                        tracing::info!(template = %name, ms = started.elapsed().as_millis() as u64, "template warm")
                    }
                    Err(e) => {
                        tracing::warn!(template = %name, error = %e, "could not warm a template")
                    }
                }
            }
        });
        self.inner
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task.abort_handle());
    }

    /// The build itself: the base (pulled here, unpacked and installed by the node manager;
    /// or a template the node has), the steps, then names, publication and warmth.
    async fn build_template(
        &self,
        req: &BuildTemplate,
        names: &[String],
        log: Log,
    ) -> Result<TemplateInfo, TemplateBuildError> {
        let node_failed = |e: &dyn std::fmt::Display| TemplateBuildError {
            code: TemplateBuildErrorCode::NodeFailed,
            message: e.to_string(),
        };
        let base = match &req.from_template {
            Some(name) => {
                log(&format!("building {} from template {name}", names[0]));
                self.template(name).map_err(|e| TemplateBuildError {
                    code: TemplateBuildErrorCode::BadReference,
                    message: e.to_string(),
                })?
            }
            // Named by the image build itself when nothing follows it.
            None => self.build_image_base(req, names, &log).await?,
        };
        // An image without steps or start command is the template, named by its own
        // build; anything else is made here (unnamed) and named once it has all passed.
        let image_only = req.steps.is_empty() && req.from_template.is_none() && req.start.is_none();
        let (template, named) = if image_only {
            (base, 1)
        } else {
            let made = self
                .run_build_steps(&req.build_id, &base, &req.steps, &log)
                .await?;
            let made = match &req.start {
                Some(start) => self.with_start(&req.build_id, &made, start, &log).await?,
                None => made,
            };
            (made, 0)
        };
        for other in &names[named..] {
            let (nm, store, name, digest) = (
                self.inner.nm.clone(),
                self.inner.store.clone(),
                other.clone(),
                template.digest.clone(),
            );
            tokio::task::spawn_blocking(move || nm.name_template(&store, &name, &digest))
                .await
                .map_err(|e| node_failed(&e))?
                .map_err(|e| manager_failure(&e))?;
            log(&format!("named {other}"));
        }
        let template = TemplateInfo {
            name: names[0].clone(),
            ..template
        };
        if self.inner.cfg.publish_templates && self.inner.objects.is_some() {
            log("publishing to the object store");
            self.publish_templates()
                .await
                .map_err(|e| node_failed(&e))?;
            for name in names {
                self.publish_template_name(name, &template.digest)
                    .await
                    .map_err(|e| node_failed(&e))?;
            }
        }
        if self.inner.cfg.memory_images {
            log("preparing the memory image and the warm pool");
            // A template that cannot be warmed is still built: its first create will say
            // what is wrong with it. (A start command was tried before it was named.)
            if let Err(e) = self
                .warm_template_logged(&template, Some(log.clone()))
                .await
            {
                log(&format!("warning: could not prepare the memory image: {e}"));
            }
        }
        log(&format!(
            "template {} ready ({} MiB)",
            names[0], template.image_size_mib
        ));
        Ok(template)
    }

    /// A build's base image: pulled here, unpacked and installed by the node manager; named
    /// `names[0]` unless steps or a start command follow (then only its digest finds it).
    async fn build_image_base(
        &self,
        req: &BuildTemplate,
        names: &[String],
        log: &Log,
    ) -> Result<TemplateInfo, TemplateBuildError> {
        let failed =
            |code: TemplateBuildErrorCode, message: String| TemplateBuildError { code, message };
        let node_failed =
            |e: &dyn std::fmt::Display| failed(TemplateBuildErrorCode::NodeFailed, e.to_string());
        let source = registry_source(&req.from_image)?;
        let kernel_digest = self.newest_kernel().map_err(|e| node_failed(&e))?;
        let dir = self
            .scratch_dir(&req.build_id, "build")
            .map_err(|e| node_failed(&e))?;
        let staged = dir.join("image");
        let opts = ImageBuildOpts {
            registry: RegistryOpts {
                ca_pem: self
                    .inner
                    .cfg
                    .registry_ca_pem
                    .as_ref()
                    .map(|p| p.as_bytes().to_vec()),
                plain_http: self.inner.cfg.registry_plain_http.clone(),
                login: req.registry_login.as_ref().map(|l| RegistryLogin {
                    username: l.username.clone(),
                    password: l.password.0.clone(),
                }),
                ..Default::default()
            },
            user: req.user.clone(),
            ..Default::default()
        };
        let built = async {
            log(&format!("building {} from {}", names[0], req.from_image));
            space_images::oci::stage_image(&self.inner.store, &source, &staged, &opts, log.clone())
                .await
                .map_err(|e| failed(e.build_error_code(), e.to_string()))?;
            let nm = self.inner.nm.clone();
            let store = self.inner.store.clone();
            let build = TemplateBuild {
                name: (req.steps.is_empty() && req.start.is_none()).then(|| names[0].clone()),
                user: req.user.clone(),
                kernel_digest,
            };
            let (staged, progress) = (staged.clone(), log.clone());
            tokio::task::spawn_blocking(move || {
                nm.build_template(&store, &staged, &build, &*progress)
            })
            .await
            .map_err(|e| node_failed(&e))?
            .map_err(|e| manager_failure(&e))
        }
        .await;
        let scratch = dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(scratch)).await;
        built
    }

    /// The kernel bundle new templates boot with: the newest in the store.
    fn newest_kernel(&self) -> Result<String, NodeError> {
        self.inner
            .store
            .kernels()
            .list()?
            .into_iter()
            .max_by_key(|k| k.built_at_ms)
            .map(|k| k.digest)
            .ok_or_else(|| {
                NodeError::Invalid(
                    "this node has no kernel bundle yet (`space template build base` makes one)"
                        .into(),
                )
            })
    }
}

fn canonical(name: &str) -> Result<String, NodeError> {
    canonical_template_name(name).ok_or_else(|| {
        NodeError::Invalid(format!(
            "invalid template name {:?}: NAME or NAME:TAG, NAME of [a-z0-9_-] (at most 63), TAG of [A-Za-z0-9_.-] (at most 128)",
            name.chars().take(80).collect::<String>()
        ))
    })
}

/// `reference` as a registry image: a build started over the network never reads the
/// node's own files (an OCI layout or archive path), which only the operator's CLI may.
fn registry_source(reference: &str) -> Result<ImageSource, TemplateBuildError> {
    let bad = |reason: String| TemplateBuildError {
        code: TemplateBuildErrorCode::BadReference,
        message: format!("image reference {reference:?}: {reason}"),
    };
    match ImageSource::parse(reference) {
        Ok(source @ ImageSource::Registry(_)) => Ok(source),
        Ok(_) => Err(bad(
            "only registry images can be built through the API; local layouts and archives are the CLI's (`space template build --from`)".into(),
        )),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// A node manager's failure as a build error: a refused image is the image's fault.
fn manager_failure(e: &NodeManagerError) -> TemplateBuildError {
    let code = match e {
        NodeManagerError::Refused(r) if r.code == RefusalCode::BadImage => {
            TemplateBuildErrorCode::BadImage
        }
        NodeManagerError::Image(space_images::ImageError::Oci(o)) => o.build_error_code(),
        _ => TemplateBuildErrorCode::NodeFailed,
    };
    TemplateBuildError {
        code,
        message: e.to_string(),
    }
}

fn forget_oldest_finished(all: &mut BTreeMap<String, Arc<Mutex<BuildRecord>>>) {
    let mut finished: Vec<(i64, String)> = all
        .iter()
        .filter_map(|(id, r)| {
            let r = r.lock().unwrap_or_else(|p| p.into_inner());
            r.status.finished_at_ms.map(|t| (t, id.clone()))
        })
        .collect();
    if finished.len() < MAX_FINISHED {
        return;
    }
    finished.sort();
    for (_, id) in finished.iter().take(finished.len() + 1 - MAX_FINISHED) {
        all.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> BuildRecord {
        BuildRecord {
            status: TemplateBuildStatus {
                build_id: "b".into(),
                name: "n".into(),
                from_image: "r/x".into(),
                state: TemplateBuildState::Building,
                logs: Vec::new(),
                next_log_index: 0,
                template: None,
                error: None,
                started_at_ms: 0,
                finished_at_ms: None,
            },
            lines: VecDeque::new(),
            builder: BuilderSpec::default(),
        }
    }

    #[test]
    fn a_build_log_is_bounded_and_read_from_an_offset() {
        let mut r = record();
        for i in 0..MAX_LINES + 10 {
            r.log(&format!("line {i}"));
        }
        r.log(&"é".repeat(MAX_LINE_BYTES));
        let all = r.view(0);
        assert_eq!(all.logs.len(), MAX_LINES);
        assert_eq!(all.logs[0].index, 11, "the oldest lines were dropped");
        assert_eq!(all.next_log_index, MAX_LINES as u64 + 11);
        assert!(all.logs.last().unwrap().line.len() <= MAX_LINE_BYTES);
        let tail = r.view(all.next_log_index - 2);
        assert_eq!(tail.logs.len(), 2);
        assert!(r.view(all.next_log_index).logs.is_empty());
    }

    #[test]
    fn only_registry_images_are_built_through_the_api() {
        assert!(registry_source("registry.example:5000/team/python:3.12").is_ok());
        for local in ["oci:/srv/layout", "docker-archive:/tmp/x.tar", "/etc"] {
            let e = registry_source(local).unwrap_err();
            assert_eq!(e.code, TemplateBuildErrorCode::BadReference, "{local}");
        }
    }

    #[test]
    fn the_oldest_finished_builds_are_forgotten() {
        let mut all = BTreeMap::new();
        for i in 0..MAX_FINISHED + 3 {
            let mut r = record();
            r.status.finished_at_ms = Some(i as i64);
            all.insert(format!("b{i:03}"), Arc::new(Mutex::new(r)));
        }
        all.insert("running".into(), Arc::new(Mutex::new(record())));
        forget_oldest_finished(&mut all);
        assert_eq!(all.len(), MAX_FINISHED);
        assert!(all.contains_key("running"));
        assert!(!all.contains_key("b000"));
    }
}

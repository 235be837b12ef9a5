//! Templates as objects: list, get, build (from a registry image or a template, with build
//! steps such as a Dockerfile's), delete; the template cache of every node.
//!
//! Shared templates are the operator's to build and delete (a tenant could otherwise
//! replace `base` under everyone); every tenant builds and deletes its own (see
//! [`template_scope`]). A build runs on one node, which
//! keeps its log; its id finds it from any replica (every node is asked: there are few, and
//! a build's node is not desired state worth a row). A deletion is refused while sandboxes
//! or snapshots need the template, unless forced.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use space_core::template::{
    canonical_template_name, validate_build_id, CachedTemplate, TemplateBuildEvent,
    TemplateBuildState, TemplateBuildStatus, TemplateCachePrune, TemplateCachePruneRequest,
    TemplateInfo,
};
use space_core::ErrorCode;
use space_node_proto::template::{BuildTemplate, CacheRemoval, RegistryLogin, MAX_IMAGE_REFERENCE};
use space_node_proto::wire::SecretString;
use space_node_proto::NodeCallError;

use crate::api::error::ApiError;
use crate::service::{build_files, template_scope, Caller};
use crate::AppState;

/// How often a followed build is polled.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);
/// How long a followed build may go unanswered by its node before the stream ends with an
/// error (the build itself goes on).
const FOLLOW_GIVE_UP: Duration = Duration::from_secs(30);

/// `POST /v1/templates`: build a template from a registry image.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateBuildRequest {
    /// The template's name: `NAME` or `NAME:TAG`.
    pub name: String,
    /// A registry image: `HOST/REPO:TAG`, `HOST/REPO@sha256:…` (a bare `REPO` is Docker
    /// Hub's). Exactly one of `from_image` and `from_template`.
    #[serde(default)]
    pub from_image: Option<String>,
    /// A template to build on instead of an image.
    #[serde(default)]
    pub from_template: Option<String>,
    /// What is done on top, in order: `{"run": "LINE"}` or `{"run": [ARGV]}`,
    /// `{"copy": {"files": SHA256, "dest": DIR, "chown": USER}}` (an archive uploaded with
    /// `PUT /v1/templates/files/{sha256}`), `{"env": {NAME: VALUE}}`, `{"workdir": DIR}`,
    /// `{"user": USER}`. Each `run` runs in a builder sandbox; an unchanged step on an
    /// unchanged base is taken from the cache.
    #[serde(default)]
    pub steps: Vec<space_core::build_steps::BuildStep>,
    /// A process the template's sandboxes have running from the start: `{"command": LINE
    /// or [ARGV], "ready": LINE or [ARGV], "ready_timeout_secs": N}`. It is started, and
    /// the ready check run every second until it exits with 0, before the template's memory
    /// image is saved: every sandbox starts with it running and ready. A command that fails
    /// fails the build (`start_failed`).
    #[serde(default)]
    pub start: Option<space_core::build_steps::TemplateStart>,
    /// More tags for the same build: `python` with tags `["3.12"]` is also `python:3.12`.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The account commands run as by default, instead of the image's `USER`.
    #[serde(default)]
    pub user: Option<String>,
    /// The disk of the sandboxes `run` steps run in, MiB, at least (default: the image's
    /// and 2 GiB); for steps that install more. The templates they make are this large.
    #[serde(default)]
    pub builder_disk_mib: Option<u32>,
    /// Credentials for a private registry (used for this pull only, never stored or logged).
    #[serde(default)]
    pub registry_auth: Option<RegistryAuth>,
    /// The name or id of the caller's credential to log in to the image's registry with
    /// (its rule must list the registry in `registries`). Without this or `registry_auth`,
    /// the caller's one credential that lists the registry is used, if there is one.
    #[serde(default)]
    pub registry_credential: Option<String>,
}

/// A registry user name and password.
#[derive(Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryAuth {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Most tags one build may add.
const MAX_TAGS: usize = 15;

/// Most templates (names, tags included) a tenant may have of its own.
pub const MAX_TENANT_TEMPLATES: usize = 100;

/// Every template `caller` may use (see [`template_scope`]), by name (each node's, once: a
/// cluster's nodes share them).
pub async fn list(st: &AppState, caller: &Caller) -> Result<Vec<TemplateInfo>, ApiError> {
    let mut templates: Vec<TemplateInfo> = Vec::new();
    for node in st.nodes.all() {
        for t in node.templates().await? {
            if template_scope::visible(caller, &t.name)
                && !templates.iter().any(|have| have.name == t.name)
            {
                templates.push(t);
            }
        }
    }
    templates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(templates)
}

/// The template `name` means to `caller`: its own, else the shared one.
pub async fn get(st: &AppState, caller: &Caller, name: &str) -> Result<TemplateInfo, ApiError> {
    for full in template_scope::candidates(caller, name)? {
        match st.nodes.template(&full).await {
            Ok(t) => return Ok(t),
            Err(NodeCallError::TemplateNotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(template_scope::not_found(name))
}

/// Starts a build on a node; returns its first status.
pub async fn start_build(
    st: &AppState,
    caller: &Caller,
    req: TemplateBuildRequest,
) -> Result<TemplateBuildStatus, ApiError> {
    start_build_as(st, caller, req, new_build_id()).await
}

/// A fresh build id (`tb-…`).
pub fn new_build_id() -> String {
    format!(
        "tb-{}",
        space_core::SandboxId::generate()
            .as_str()
            .trim_start_matches(space_core::SandboxId::PREFIX)
    )
}

/// [`start_build`] under the id `build_id` (one handed out before the build was asked
/// for, as E2B's protocol does).
pub async fn start_build_as(
    st: &AppState,
    caller: &Caller,
    req: TemplateBuildRequest,
    build_id: String,
) -> Result<TemplateBuildStatus, ApiError> {
    if !validate_build_id(&build_id) {
        return Err(ApiError::invalid("invalid build id"));
    }
    let name = template_scope::own(caller, &req.name)?;
    if req.tags.len() > MAX_TAGS {
        return Err(ApiError::invalid(format!(
            "at most {MAX_TAGS} tags per build"
        )));
    }
    let base = name.split(':').next().unwrap_or(&name).to_owned();
    let also_named = req
        .tags
        .iter()
        .map(|tag| template_scope::own(caller, &format!("{base}:{tag}")))
        .collect::<Result<Vec<_>, _>>()?;
    if !caller.is_operator() {
        check_tenant_room(st, caller, &name, &also_named).await?;
    }
    let (from_image, from_template) = match (req.from_image, req.from_template) {
        (Some(image), None) => (image, None),
        (None, Some(template)) => (String::new(), Some(get(st, caller, &template).await?.name)),
        _ => {
            return Err(ApiError::invalid(
                "a build starts from_image or from_template: exactly one of them",
            ))
        }
    };
    let registry_login = if from_template.is_none() {
        let registry = check_image_reference(&from_image)?;
        registry_login(
            st,
            caller,
            &registry,
            req.registry_auth,
            req.registry_credential,
        )
        .await?
    } else if req.registry_auth.is_some() || req.registry_credential.is_some() {
        return Err(ApiError::invalid(
            "registry_auth and registry_credential are for a build from_image",
        ));
    } else {
        None
    };
    space_core::build_steps::validate_steps(&req.steps)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if let Some(mib) = req.builder_disk_mib {
        space_node_proto::template::check_builder_disk_mib(mib).map_err(ApiError::invalid)?;
    }
    if let Some(start) = &req.start {
        start.validate().map_err(ApiError::invalid)?;
    }
    if !caller.is_operator() {
        check_files_owned(st, caller, &req.steps).await?;
    }
    // A tenant's builders reach what its sandboxes may; the operator's, the node's default.
    let egress = if caller.is_operator() {
        None
    } else {
        st.db.tenant_egress_policy(&caller.id).await?
    };
    let build = BuildTemplate {
        egress,
        builder_disk_mib: req.builder_disk_mib,
        build_id,
        name,
        also_named,
        from_image,
        from_template,
        steps: req.steps,
        start: req.start,
        user: req.user,
        registry_login,
    };
    let node = st.nodes.for_builds()?;
    tracing::info!(build = %build.build_id, name = %build.name, image = %build.from_image, template = ?build.from_template, steps = build.steps.len(), node = node.name(), "template build started");
    Ok(node.start_template_build(build).await?)
}

/// Refuses (`quota_exceeded`) a tenant's build that would give it more than
/// [`MAX_TENANT_TEMPLATES`] templates of its own.
async fn check_tenant_room(
    st: &AppState,
    caller: &Caller,
    name: &str,
    also_named: &[String],
) -> Result<(), ApiError> {
    let have: Vec<String> = list(st, caller)
        .await?
        .into_iter()
        .filter(template_scope::is_owned)
        .map(|t| t.name)
        .collect();
    let new = std::iter::once(name)
        .chain(also_named.iter().map(String::as_str))
        .filter(|n| !have.iter().any(|h| h == n))
        .count();
    if have.len() + new > MAX_TENANT_TEMPLATES {
        return Err(ApiError::new(
            ErrorCode::QuotaExceeded,
            format!(
                "a tenant has at most {MAX_TENANT_TEMPLATES} templates (names and tags) of its own; it has {}: delete some first",
                have.len()
            ),
        ));
    }
    Ok(())
}

/// Refuses (`400`) a tenant's build whose `COPY` names files the tenant did not upload
/// (see [`build_files`]: content is shared, who uploaded it is not).
async fn check_files_owned(
    st: &AppState,
    caller: &Caller,
    steps: &[space_core::build_steps::BuildStep],
) -> Result<(), ApiError> {
    for step in steps {
        if let space_core::build_steps::BuildStep::Copy(c) = step {
            if !build_files::uploaded_by(st, caller, &c.files).await? {
                return Err(ApiError::invalid(format!(
                    "COPY's files {} were not uploaded by this tenant (PUT /v1/templates/files/{})",
                    c.files, c.files
                )));
            }
        }
    }
    Ok(())
}

/// The login for a pull from `registry`: the one given with the request, or one from the
/// caller's credentials (named, or the one that lists the registry).
async fn registry_login(
    st: &AppState,
    caller: &Caller,
    registry: &str,
    given: Option<RegistryAuth>,
    credential: Option<String>,
) -> Result<Option<RegistryLogin>, ApiError> {
    if let Some(auth) = given {
        if credential.is_some() {
            return Err(ApiError::invalid(
                "registry_auth and registry_credential: at most one of them",
            ));
        }
        return Ok(Some(RegistryLogin {
            username: auth.username,
            password: SecretString(auth.password),
        }));
    }
    let stored =
        crate::service::credentials::registry_login(st, caller, registry, credential.as_deref())
            .await?;
    Ok(stored.map(|c| RegistryLogin {
        username: c.username,
        password: SecretString(c.password.expose().to_owned()),
    }))
}

/// Checks a build's image reference; returns its registry (`docker.io` for a bare name).
fn check_image_reference(reference: &str) -> Result<String, ApiError> {
    if reference.trim().is_empty() || reference.len() > MAX_IMAGE_REFERENCE {
        return Err(ApiError::invalid(format!(
            "from_image must be an image reference of 1 to {MAX_IMAGE_REFERENCE} bytes"
        )));
    }
    let local = ["oci:", "oci-archive:", "docker-archive:", "/", ".", "~"];
    if local.iter().any(|p| reference.starts_with(p)) {
        return Err(ApiError::invalid(
            "from_image must name a registry image; local layouts and archives are built with the CLI on the node (`space template build NAME --from oci:DIR`)",
        ));
    }
    let reference = reference.strip_prefix("docker://").unwrap_or(reference);
    let parsed: oci_spec::distribution::Reference = reference
        .parse()
        .map_err(|e| ApiError::invalid(format!("from_image is not an image reference: {e}")))?;
    Ok(parsed.registry().to_owned())
}

/// Build `id` with its log lines from `logs_from`, from whichever node runs it.
pub async fn build_status(
    st: &AppState,
    caller: &Caller,
    id: &str,
    logs_from: u64,
) -> Result<TemplateBuildStatus, ApiError> {
    let status = find_build(st, id, logs_from).await?;
    // Another tenant's build is as unknown as one that does not exist.
    if !template_scope::visible(caller, &status.name) {
        return Err(build_not_found(id));
    }
    Ok(status)
}

/// Build `id`, whoever's it is.
async fn find_build(
    st: &AppState,
    id: &str,
    logs_from: u64,
) -> Result<TemplateBuildStatus, ApiError> {
    if !validate_build_id(id) {
        return Err(build_not_found(id));
    }
    for node in st.nodes.all() {
        match node.template_build(id, logs_from).await {
            Ok(status) => return Ok(status),
            Err(NodeCallError::Refused { body }) if body.code == ErrorCode::NotFound => {}
            Err(e) => tracing::warn!(node = node.name(), error = %e, "build lookup failed"),
        }
    }
    Err(build_not_found(id))
}

/// Follows build `first` (one the caller started) until it ends: its log lines, then `ready` or `failed`.
pub fn follow_build(
    st: AppState,
    first: TemplateBuildStatus,
) -> BoxStream<'static, TemplateBuildEvent> {
    struct Follow {
        st: AppState,
        id: String,
        next: u64,
        pending: std::collections::VecDeque<TemplateBuildEvent>,
        done: bool,
        last_answer: tokio::time::Instant,
    }
    let mut pending = std::collections::VecDeque::new();
    pending.push_back(TemplateBuildEvent::Started {
        build_id: first.build_id.clone(),
        name: first.name.clone(),
    });
    let follow = Follow {
        st,
        id: first.build_id,
        next: 0,
        pending,
        done: false,
        last_answer: tokio::time::Instant::now(),
    };
    futures::stream::unfold(follow, |mut f| async move {
        loop {
            if let Some(ev) = f.pending.pop_front() {
                return Some((ev, f));
            }
            if f.done {
                return None;
            }
            match find_build(&f.st, &f.id, f.next).await {
                Ok(status) => {
                    f.last_answer = tokio::time::Instant::now();
                    for line in status.logs {
                        f.next = line.index + 1;
                        f.pending.push_back(TemplateBuildEvent::Log(line));
                    }
                    f.next = f.next.max(status.next_log_index);
                    match status.state {
                        TemplateBuildState::Building => {}
                        TemplateBuildState::Ready => {
                            f.done = true;
                            if let Some(template) = status.template {
                                f.pending.push_back(TemplateBuildEvent::Ready {
                                    template: Box::new(template),
                                });
                            }
                        }
                        TemplateBuildState::Failed => {
                            f.done = true;
                            if let Some(error) = status.error {
                                f.pending.push_back(TemplateBuildEvent::Failed { error });
                            }
                        }
                    }
                }
                Err(e) if f.last_answer.elapsed() > FOLLOW_GIVE_UP => {
                    f.done = true;
                    f.pending.push_back(TemplateBuildEvent::Failed {
                        error: space_core::template::TemplateBuildError {
                            code: space_core::template::TemplateBuildErrorCode::NodeFailed,
                            message: format!("lost track of the build: {}", e.body.message),
                        },
                    });
                }
                Err(_) => {}
            }
            if f.pending.is_empty() && !f.done {
                tokio::time::sleep(FOLLOW_INTERVAL).await;
            }
        }
    })
    .boxed()
}

/// Deletes template name `name` (the caller's own, see [`template_scope::own`]) on every
/// node (and from the object store's names). Unless
/// `force`, refused (`409 conflict`) while sandboxes that are not deleted, or snapshots,
/// were made from the template it names.
pub async fn delete(
    st: &AppState,
    caller: &Caller,
    given: &str,
    force: bool,
) -> Result<(), ApiError> {
    let name = template_scope::own(caller, given)?;
    let template = match st.nodes.template(&name).await {
        Ok(t) => t,
        Err(NodeCallError::TemplateNotFound { .. }) => {
            // A tenant naming a shared template is told whose it is.
            let shared = canonical_template_name(given).filter(|n| *n != name);
            if let Some(shared) = shared {
                if st.nodes.template(&shared).await.is_ok() {
                    return Err(ApiError::new(
                        ErrorCode::Forbidden,
                        format!("template {shared} is shared: only the operator may delete it"),
                    ));
                }
            }
            return Err(template_scope::not_found(&name));
        }
        Err(e) => return Err(e.into()),
    };
    if !force {
        // The operator's check is of everyone's use; a tenant's, of its own.
        let whose = (!caller.is_operator()).then_some(&caller.id);
        let users = users_of(st, &template.digest, whose).await?;
        if users.any() {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "template {name} is in use by {} sandbox(es), {} stored snapshot(s) and {} persistent snapshot(s); delete them first, or delete with force=true (they keep their disks; a suspended sandbox or stored snapshot then needs the template from the object store)",
                    users.sandboxes, users.stored_snapshots, users.persistent_snapshots
                ),
            ));
        }
    }
    let mut removed = false;
    for node in st.nodes.all() {
        removed |= node.delete_template(&name).await?;
    }
    if !removed {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("template '{name}' not found"),
        ));
    }
    tracing::info!(name, digest = %template.digest, force, "template deleted");
    Ok(())
}

/// What still needs a template.
#[derive(Debug, Default)]
struct Users {
    sandboxes: i64,
    stored_snapshots: i64,
    persistent_snapshots: usize,
}

impl Users {
    fn any(&self) -> bool {
        self.sandboxes > 0 || self.stored_snapshots > 0 || self.persistent_snapshots > 0
    }
}

/// What was made from template `digest`: by every tenant, or by `tenant` only (a tenant's
/// own template is its alone, but content is addressed: another tenant's identical template
/// has the same digest, and what that tenant made from it is none of this one's business,
/// nor does deleting this tenant's name take it away).
async fn users_of(
    st: &AppState,
    digest: &str,
    tenant: Option<&space_core::TenantId>,
) -> Result<Users, ApiError> {
    let mut users = Users {
        sandboxes: st.db.count_using_template(digest, tenant).await?,
        stored_snapshots: st.db.count_stored_using_template(digest, tenant).await?,
        persistent_snapshots: 0,
    };
    for node in st.nodes.all() {
        users.persistent_snapshots += node
            .persistent_snapshots()
            .await?
            .iter()
            .filter(|(_, origin)| {
                origin.template_digest == digest
                    && tenant.is_none_or(|t| origin.tenant.as_ref() == Some(t))
            })
            .count();
    }
    Ok(users)
}

fn build_not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!(
            "template build {:?} not found (a node forgets its builds when it restarts)",
            id.chars().take(64).collect::<String>()
        ),
    )
}

/// Every node's template cache (templates no name points at: build steps, what a rebuilt
/// name meant before, templates fetched by digest), oldest use first.
pub async fn cache(st: &AppState, caller: &Caller) -> Result<Vec<CachedTemplate>, ApiError> {
    caller.require_operator()?;
    let mut cached = Vec::new();
    for node in st.nodes.all() {
        cached.extend(node.cached_templates().await?);
    }
    cached.sort_by(|a, b| {
        (a.last_used_ms, &a.node, &a.digest).cmp(&(b.last_used_ms, &b.node, &b.digest))
    });
    Ok(cached)
}

/// How long a cached template may go unused before a prune that does not say removes it.
const DEFAULT_UNUSED_FOR: Duration = Duration::from_secs(24 * 3600);

/// Removes from every node's cache the templates no node needed for `unused_for_secs`,
/// except those sandboxes or snapshots were made from (a suspended sandbox, a stored or
/// persistent snapshot may need its template again). A node where a build runs is skipped
/// (the build may need any step), one that cannot be asked is left alone; both are named in
/// the answer. The object store's copies stay: they are fetched again when needed.
pub async fn prune(
    st: &AppState,
    caller: &Caller,
    req: TemplateCachePruneRequest,
) -> Result<TemplateCachePrune, ApiError> {
    caller.require_operator()?;
    let unused_for = req
        .unused_for_secs
        .map_or(DEFAULT_UNUSED_FOR, Duration::from_secs);
    let unused_for_ms = i64::try_from(unused_for.as_millis()).unwrap_or(i64::MAX);
    let cutoff_ms = crate::db::now_ms().saturating_sub(unused_for_ms);
    let mut out = TemplateCachePrune {
        dry_run: req.dry_run,
        unreachable_nodes: st.nodes.lost(),
        ..TemplateCachePrune::default()
    };
    // A digest's users are the same on every node: ask once.
    let mut in_use: std::collections::HashMap<String, bool> = Default::default();
    for node in st.nodes.all() {
        let cached = match node.cached_templates().await {
            Ok(cached) => cached,
            Err(e) => {
                tracing::warn!(node = node.name(), error = %e, "template cache unavailable; not pruning there");
                out.unreachable_nodes.push(node.name().to_owned());
                continue;
            }
        };
        for template in cached.into_iter().filter(|t| t.last_used_ms < cutoff_ms) {
            let used = match in_use.get(&template.digest) {
                Some(used) => *used,
                None => {
                    let used = users_of(st, &template.digest, None).await?.any();
                    in_use.insert(template.digest.clone(), used);
                    used
                }
            };
            if used {
                out.in_use.push(template);
                continue;
            }
            if req.dry_run {
                out.freed_mib += u64::from(template.image_size_mib);
                out.removed.push(template);
                continue;
            }
            match node
                .remove_cached_template(&template.digest, cutoff_ms)
                .await
            {
                Ok(CacheRemoval::Removed) => {
                    out.freed_mib += u64::from(template.image_size_mib);
                    out.removed.push(template);
                }
                Ok(CacheRemoval::BuildRunning) => {
                    out.busy_nodes.push(node.name().to_owned());
                    break;
                }
                // Needed or named since it was listed: kept, as it should be.
                Ok(CacheRemoval::NotCached | CacheRemoval::UsedSince) => {}
                Err(e) => {
                    tracing::warn!(node = node.name(), digest = %template.digest, error = %e, "cannot prune a cached template");
                    out.unreachable_nodes.push(node.name().to_owned());
                    break;
                }
            }
        }
    }
    tracing::info!(
        removed = out.removed.len(),
        freed_mib = out.freed_mib,
        kept_in_use = out.in_use.len(),
        dry_run = out.dry_run,
        "template cache pruned"
    );
    Ok(out)
}

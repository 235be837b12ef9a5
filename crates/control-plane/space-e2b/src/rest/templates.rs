//! E2B's template builds (`Template.build`, `Template.buildInBackground`,
//! `Template.getBuildStatus`, `Template.exists` in both SDKs) on SPACE's own (`POST
//! /v1/templates` with steps and a start command).
//!
//! E2B's protocol takes four kinds of request where SPACE's takes one:
//! 1. `POST /v3/templates` asks for a build: a template id (SPACE's template name without
//!    its tag) and a build id are handed out, and the request kept
//!    ([`crate::build_store`]).
//! 2. `GET /templates/{id}/files/{hash}`, per `COPY`: whether its files are here, else a
//!    signed URL the SDK PUTs a tar of them to (without its API key: E2B's are presigned
//!    object store URLs). Uploads are kept a week, by tenant and the SDK's hash.
//! 3. `POST /v2/templates/{id}/builds/{buildID}` starts it: E2B's steps become SPACE's
//!    ([`translate`]), each `COPY`'s upload is rewritten into the archive SPACE's `COPY`
//!    takes ([`crate::template_files`]) and stored on the node, and SPACE's build starts
//!    under the build id handed out.
//! 4. `GET /templates/{id}/builds/{buildID}/status?logsOffset=N` is SPACE's build status
//!    in E2B's shape.
//!
//! E2B's builds run as `user` in `/home/user` until a step says otherwise; so do these. The
//! start and ready commands are SPACE's template start command (E2B's default ready check,
//! `sleep 20`, when only a start command is given). A team's builds make its own templates,
//! which only it sees (`space_control::service::template_scope`); the operator's key builds
//! shared ones, as SPACE's own builds do.
//!
//! What is asked for and uploaded is kept in the object store when there is one, so a
//! build's requests may reach any replica ([`crate::build_store`]).

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use space_control::api::extract::ApiJson;
use space_control::service::templates::{self as native, RegistryAuth, TemplateBuildRequest};
use space_control::service::Caller;
use space_core::build_steps::{BuildStep, CopyStep, RunCommand, TemplateStart};
use space_core::template::{canonical_template_name, TemplateBuildState, TemplateBuildStatus};

use super::error::{RestError, RestResult};
use crate::build_store::{internal, now_ms, AskedBuild};
use crate::state::E2bState;
use crate::template_files;
use crate::timestamp::rfc3339;

/// How long an upload URL is valid.
const UPLOAD_URL_TTL_MS: i64 = 60 * 60 * 1000;
/// E2B's ready check when a start command comes without one.
const E2B_DEFAULT_READY: &str = "sleep 20";
/// Where E2B's builds start.
const E2B_BUILD_USER: &str = "user";
const E2B_BUILD_WORKDIR: &str = "/home/user";

/// `POST /v3/templates` (and `/v2/templates`, whose name is `alias`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestBuild {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    /// Recorded by E2B as the template's sandboxes' size; SPACE's templates keep the
    /// node's defaults (`docs/e2b-compat.md`).
    #[serde(default)]
    #[allow(dead_code)]
    cpu_count: Option<u32>,
    #[serde(default)]
    #[allow(dead_code)]
    memory_mb: Option<u32>,
}

/// What `POST /v3/templates` answers.
#[derive(Debug, Serialize)]
pub struct RequestedBuild {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    aliases: Vec<String>,
    names: Vec<String>,
    tags: Vec<String>,
}

/// `POST /v3/templates`: hands out a template id and a build id.
pub async fn request_build(
    State(st): State<E2bState>,
    caller: Caller,
    ApiJson(req): ApiJson<RequestBuild>,
) -> RestResult<(StatusCode, Json<RequestedBuild>)> {
    let raw = req
        .name
        .or(req.alias)
        .ok_or_else(|| RestError::bad_request("a build needs the template's name"))?;
    let name = canonical_template_name(&raw).ok_or_else(|| {
        RestError::bad_request(format!(
            "invalid template name {:?}: NAME or NAME:TAG, NAME of [a-z0-9_-]",
            excerpt(&raw, 128)
        ))
    })?;
    let base = name.split(':').next().unwrap_or(&name).to_owned();
    let mut names = vec![name.clone()];
    for tag in &req.tags {
        let n = canonical_template_name(&format!("{base}:{tag}")).ok_or_else(|| {
            RestError::bad_request(format!("invalid tag {:?}", excerpt(tag, 128)))
        })?;
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let asked = AskedBuild {
        build_id: native::new_build_id(),
        tenant: caller.id.to_string(),
        template_id: base.clone(),
        names: names.clone(),
        asked_at_ms: now_ms(),
        started: false,
    };
    st.template_builds.sweep().await;
    st.template_builds.save(&asked).await?;
    let tags = names
        .iter()
        .filter_map(|n| n.split_once(':').map(|(_, t)| t.to_owned()))
        .collect();
    Ok((
        StatusCode::ACCEPTED,
        Json(RequestedBuild {
            template_id: base.clone(),
            build_id: asked.build_id,
            public: false,
            aliases: vec![base],
            names,
            tags,
        }),
    ))
}

/// What `GET /templates/{id}/files/{hash}` answers.
#[derive(Debug, Serialize)]
pub struct FilesLink {
    present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
}

fn check_hash(hash: &str) -> RestResult<()> {
    if space_core::build_steps::validate_files_hash(hash) {
        Ok(())
    } else {
        Err(RestError::bad_request(
            "files are named by the lowercase hex SHA-256 the SDK computes",
        ))
    }
}

/// `GET /templates/{templateID}/files/{hash}`: whether a `COPY`'s files are uploaded, else
/// where to PUT them.
pub async fn files_link(
    State(st): State<E2bState>,
    caller: Caller,
    headers: HeaderMap,
    Path((_template_id, hash)): Path<(String, String)>,
) -> RestResult<(StatusCode, Json<FilesLink>)> {
    check_hash(&hash)?;
    let tenant = caller.id.to_string();
    if st.template_builds.has_upload(&tenant, &hash).await? {
        return Ok((
            StatusCode::CREATED,
            Json(FilesLink {
                present: true,
                url: None,
            }),
        ));
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.len() <= 255 && !h.contains(['/', '?', '#', '@']))
        .ok_or_else(|| RestError::bad_request("the request names no host"))?;
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    let expires = now_ms() + UPLOAD_URL_TTL_MS;
    let signature = st.tokens.upload_signature(&tenant, &hash, expires);
    Ok((
        StatusCode::CREATED,
        Json(FilesLink {
            present: false,
            url: Some(format!(
                "{scheme}://{host}/templates/files/upload/{tenant}/{hash}?expires={expires}&signature={signature}"
            )),
        }),
    ))
}

/// The query of an upload URL.
#[derive(Debug, Deserialize)]
pub struct UploadQuery {
    expires: i64,
    signature: String,
}

/// `PUT /templates/files/upload/{tenant}/{hash}?expires=&signature=`: a `COPY`'s files,
/// as the signed URL of [`files_link`] allows (no API key).
pub async fn upload_files(
    State(st): State<E2bState>,
    Path((tenant, hash)): Path<(String, String)>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> RestResult<StatusCode> {
    check_hash(&hash)?;
    if tenant.parse::<space_core::TenantId>().is_err()
        || !st
            .tokens
            .verify_upload(&tenant, &hash, q.expires, &q.signature, now_ms())
    {
        return Err(RestError::new(403, "the upload URL is invalid or expired"));
    }
    st.template_builds.put_upload(&tenant, &hash, body).await?;
    Ok(StatusCode::OK)
}

/// One step as the SDKs send it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bStep {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    files_hash: Option<String>,
    /// Rebuild this layer (SPACE's step cache is by content: ignored).
    #[serde(default)]
    #[allow(dead_code)]
    force: Option<bool>,
}

/// `fromImageRegistry`.
#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bRegistry {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

impl std::fmt::Debug for E2bRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bRegistry")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// `POST /v2/templates/{id}/builds/{buildID}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartBuild {
    #[serde(default)]
    from_image: Option<String>,
    #[serde(default)]
    from_template: Option<String>,
    #[serde(default)]
    from_image_registry: Option<E2bRegistry>,
    #[serde(default)]
    #[allow(dead_code)]
    force: Option<bool>,
    #[serde(default)]
    steps: Vec<E2bStep>,
    #[serde(default)]
    start_cmd: Option<String>,
    #[serde(default)]
    ready_cmd: Option<String>,
}

/// A step translated: SPACE's, or a `COPY` whose files are still E2B's upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Planned {
    /// Ready as it is.
    Step(BuildStep),
    /// A `COPY` of upload `hash`: `src` (a path or glob in the context) to `dest`.
    Copy {
        hash: String,
        src: String,
        dest: String,
        owner: String,
        mode: Option<u32>,
    },
}

/// E2B's steps as SPACE's, starting as `user` (E2B's builds do; `from_template` builds as
/// the template's default user).
pub fn translate(steps: &[E2bStep], start_user: &str) -> Result<Vec<Planned>, String> {
    let mut out = Vec::new();
    let mut user = start_user.to_owned();
    for (i, s) in steps.iter().enumerate() {
        let n = i + 1;
        let arg = |k: usize| s.args.get(k).map(String::as_str).unwrap_or_default();
        match s.kind.to_ascii_uppercase().as_str() {
            "RUN" => {
                if arg(0).trim().is_empty() {
                    return Err(format!("step {n}: RUN needs a command"));
                }
                let run = BuildStep::Run(RunCommand::Shell(arg(0).to_owned()));
                let as_user = arg(1);
                if as_user.is_empty() || as_user == user {
                    out.push(Planned::Step(run));
                } else {
                    // A RUN as another user: only this step; the build's user stays.
                    out.push(Planned::Step(BuildStep::User(as_user.to_owned())));
                    out.push(Planned::Step(run));
                    out.push(Planned::Step(BuildStep::User(user.clone())));
                }
            }
            "COPY" => {
                let hash = s
                    .files_hash
                    .clone()
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| format!("step {n}: COPY without filesHash"))?;
                if arg(0).is_empty() || arg(1).is_empty() {
                    return Err(format!("step {n}: COPY needs a source and a destination"));
                }
                let owner = match arg(2) {
                    "" => user.clone(),
                    o => o.split(':').next().unwrap_or(o).to_owned(),
                };
                let mode =
                    template_files::parse_mode(arg(3)).map_err(|e| format!("step {n}: {e}"))?;
                out.push(Planned::Copy {
                    hash,
                    src: arg(0).to_owned(),
                    dest: arg(1).to_owned(),
                    owner,
                    mode,
                });
            }
            "ENV" => {
                if s.args.is_empty() || s.args.len() % 2 != 0 {
                    return Err(format!("step {n}: ENV takes name and value pairs"));
                }
                let vars: BTreeMap<String, String> = s
                    .args
                    .chunks(2)
                    .map(|kv| (kv[0].clone(), kv[1].clone()))
                    .collect();
                out.push(Planned::Step(BuildStep::Env(vars)));
            }
            "WORKDIR" => out.push(Planned::Step(BuildStep::Workdir(arg(0).to_owned()))),
            "USER" => {
                user = arg(0).to_owned();
                out.push(Planned::Step(BuildStep::User(user.clone())));
            }
            other => {
                return Err(format!(
                    "step {n}: {} steps are not supported by SPACE",
                    excerpt(other, 128)
                ))
            }
        }
    }
    Ok(out)
}

/// `POST /v2/templates/{templateID}/builds/{buildID}`: starts the build asked for.
pub async fn start_build(
    State(st): State<E2bState>,
    caller: Caller,
    Path((template_id, build_id)): Path<(String, String)>,
    ApiJson(req): ApiJson<StartBuild>,
) -> RestResult<StatusCode> {
    let tenant = caller.id.to_string();
    let mut asked = st
        .template_builds
        .load(&build_id)
        .await?
        .filter(|a| a.tenant == tenant && a.template_id == template_id)
        .ok_or_else(|| {
            RestError::not_found(format!("build {} not found", excerpt(&build_id, 128)))
        })?;
    if asked.started {
        return Err(RestError::new(409, "this build was started already"));
    }
    let (from_image, from_template, mut steps, start_user) =
        match (req.from_image, req.from_template) {
            (Some(image), None) => (
                Some(image),
                None,
                vec![
                    BuildStep::User(E2B_BUILD_USER.into()),
                    BuildStep::Workdir(E2B_BUILD_WORKDIR.into()),
                ],
                E2B_BUILD_USER.to_owned(),
            ),
            (None, Some(template)) => {
                // On as the template's user, in its directory, as E2B's builds go on from
                // a template's.
                let tpl = native::get(&st.app, &caller, &template).await?;
                let workdir = tpl.workdir.unwrap_or_else(|| E2B_BUILD_WORKDIR.into());
                (
                    None,
                    Some(template),
                    vec![
                        BuildStep::User(tpl.default_user.clone()),
                        BuildStep::Workdir(workdir),
                    ],
                    tpl.default_user,
                )
            }
            _ => {
                return Err(RestError::bad_request(
                    "a build starts fromImage or fromTemplate: exactly one of them",
                ))
            }
        };
    let registry_auth = match req.from_image_registry {
        None => None,
        Some(r) if r.kind == "registry" => Some(RegistryAuth {
            username: r.username.unwrap_or_default(),
            password: r.password.unwrap_or_default(),
        }),
        Some(r) => {
            return Err(RestError::bad_request(format!(
                "{} registries are not supported by SPACE (a registry with a user name and password is)",
                excerpt(&r.kind, 128)
            )))
        }
    };
    for planned in translate(&req.steps, &start_user).map_err(RestError::bad_request)? {
        steps.push(match planned {
            Planned::Step(s) => s,
            Planned::Copy {
                hash,
                src,
                dest,
                owner,
                mode,
            } => {
                let (sha256, dest_dir) = store_copy(&st, &caller, &hash, &src, &dest, mode).await?;
                BuildStep::Copy(CopyStep {
                    files: sha256,
                    dest: dest_dir,
                    chown: Some(owner),
                })
            }
        });
    }
    let start = req
        .start_cmd
        .filter(|c| !c.trim().is_empty())
        .map(|command| TemplateStart {
            command: RunCommand::Shell(command),
            ready: Some(RunCommand::Shell(
                req.ready_cmd
                    .filter(|c| !c.trim().is_empty())
                    .unwrap_or_else(|| E2B_DEFAULT_READY.to_owned()),
            )),
            ready_timeout_secs: None,
        });
    let tags = asked.names[1..]
        .iter()
        .filter_map(|n| n.split_once(':').map(|(_, t)| t.to_owned()))
        .collect();
    let build = TemplateBuildRequest {
        // E2B's builds give the template's sandboxes' size, not the builder's.
        builder_disk_mib: None,
        name: asked.names[0].clone(),
        from_image,
        from_template,
        steps,
        start,
        tags,
        user: None,
        registry_auth,
        registry_credential: None,
    };
    native::start_build_as(&st.app, &caller, build, build_id).await?;
    asked.started = true;
    st.template_builds.save(&asked).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Rewrites upload `hash` for a `COPY` of `src` to `dest` and stores it on the node;
/// returns its SHA-256 and the directory it goes under.
async fn store_copy(
    st: &E2bState,
    caller: &Caller,
    hash: &str,
    src: &str,
    dest: &str,
    mode: Option<u32>,
) -> RestResult<(String, String)> {
    check_hash(hash)?;
    // An upload is rewritten in memory (at most `template_files::MAX_BYTES` in, about as
    // much out): a few at a time per replica bounds what that holds.
    static REWRITES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
    let _rewriting = REWRITES.acquire().await.map_err(internal)?;
    let upload = st
        .template_builds
        .read_upload(caller.id.as_str(), hash)
        .await?
        .ok_or_else(|| {
            RestError::bad_request(format!(
                "COPY {}: its files {hash} were not uploaded",
                excerpt(src, 128)
            ))
        })?;
    let (src_owned, dest_owned) = (src.to_owned(), dest.to_owned());
    let rewritten = tokio::task::spawn_blocking(move || {
        template_files::rewrite(&upload, &src_owned, &dest_owned, mode)
    })
    .await
    .map_err(internal)?
    .map_err(|e| RestError::bad_request(format!("COPY {}: {e}", excerpt(src, 128))))?;
    let body = futures::stream::once(async move {
        Ok::<_, std::io::Error>(bytes::Bytes::from(rewritten.archive))
    })
    .boxed();
    space_control::service::build_files::put(&st.app, caller, &rewritten.sha256, body).await?;
    Ok((rewritten.sha256, rewritten.dest_dir))
}

/// The query of a build's status.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusQuery {
    #[serde(default)]
    logs_offset: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}

/// A log entry as E2B has them.
#[derive(Debug, Serialize)]
pub struct E2bLogEntry {
    timestamp: String,
    level: &'static str,
    message: String,
}

/// Why a build failed, as E2B says it.
#[derive(Debug, Serialize)]
pub struct E2bBuildReason {
    message: String,
}

/// A build's status as E2B has it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bBuildStatus {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: &'static str,
    logs: Vec<String>,
    log_entries: Vec<E2bLogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<E2bBuildReason>,
}

/// SPACE's build status in E2B's shape (at most `limit` log entries).
pub fn e2b_status(
    template_id: &str,
    s: &TemplateBuildStatus,
    limit: Option<usize>,
) -> E2bBuildStatus {
    let take = limit.unwrap_or(usize::MAX);
    let failed = s.state == TemplateBuildState::Failed;
    let log_entries: Vec<E2bLogEntry> = s
        .logs
        .iter()
        .take(take)
        .map(|l| E2bLogEntry {
            timestamp: rfc3339(l.ts_ms),
            level: if failed && l.line.starts_with("build failed") {
                "error"
            } else {
                "info"
            },
            message: l.line.clone(),
        })
        .collect();
    E2bBuildStatus {
        template_id: template_id.to_owned(),
        build_id: s.build_id.clone(),
        status: match s.state {
            TemplateBuildState::Building => "building",
            TemplateBuildState::Ready => "ready",
            TemplateBuildState::Failed => "error",
        },
        logs: log_entries
            .iter()
            .map(|e| format!("[{}] {}", e.timestamp, e.message))
            .collect(),
        log_entries,
        reason: s.error.as_ref().map(|e| E2bBuildReason {
            message: e.message.clone(),
        }),
    }
}

/// `GET /templates/{templateID}/builds/{buildID}/status?logsOffset=N`.
pub async fn build_status(
    State(st): State<E2bState>,
    caller: Caller,
    Path((template_id, build_id)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> RestResult<Json<E2bBuildStatus>> {
    let asked = st
        .template_builds
        .load(&build_id)
        .await?
        .filter(|a| a.tenant == caller.id.to_string());
    if let Some(a) = asked.as_ref().filter(|a| !a.started) {
        // Asked for, not started: E2B's `waiting`.
        return Ok(Json(E2bBuildStatus {
            template_id: a.template_id.clone(),
            build_id: a.build_id.clone(),
            status: "waiting",
            logs: Vec::new(),
            log_entries: Vec::new(),
            reason: None,
        }));
    }
    let status =
        native::build_status(&st.app, &caller, &build_id, q.logs_offset.unwrap_or(0)).await?;
    Ok(Json(e2b_status(&template_id, &status, q.limit)))
}

/// What `GET /templates/aliases/{alias}` answers.
#[derive(Debug, Serialize)]
pub struct E2bAlias {
    #[serde(rename = "templateID")]
    template_id: String,
    public: bool,
}

/// `GET /templates/aliases/{alias}` (`Template.exists`): the template of that name.
pub async fn alias(
    State(st): State<E2bState>,
    caller: Caller,
    Path(alias): Path<String>,
) -> RestResult<Json<E2bAlias>> {
    let tpl = native::get(&st.app, &caller, &alias).await?;
    let (owner, name) = space_core::template::split_template_owner(&tpl.name);
    Ok(Json(E2bAlias {
        template_id: name.split(':').next().unwrap_or(name).to_owned(),
        // Shared templates are everyone's, as E2B's public ones.
        public: owner.is_none(),
    }))
}

use space_core::error::excerpt;

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str], hash: Option<&str>) -> E2bStep {
        E2bStep {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            files_hash: hash.map(str::to_owned),
            force: None,
        }
    }

    #[test]
    fn e2b_steps_become_spaces() {
        let plan = translate(
            &[
                step("RUN", &["pip install x", "root"], None),
                step("ENV", &["A", "1", "B", "2"], None),
                step("COPY", &["app/*.py", "/app/", "", "0755"], Some("ab")),
                step("USER", &["root"], None),
                step("COPY", &["x", "y", "app:app", ""], Some("cd")),
                step("WORKDIR", &["/srv"], None),
                step("RUN", &["make"], None),
            ],
            "user",
        )
        .unwrap();
        let run = |s: &str| Planned::Step(BuildStep::Run(RunCommand::Shell(s.into())));
        let user = |u: &str| Planned::Step(BuildStep::User(u.into()));
        assert_eq!(plan[0], user("root"));
        assert_eq!(plan[1], run("pip install x"));
        assert_eq!(plan[2], user("user"));
        assert!(matches!(&plan[3], Planned::Step(BuildStep::Env(v)) if v.len() == 2));
        assert_eq!(
            plan[4],
            Planned::Copy {
                hash: "ab".into(),
                src: "app/*.py".into(),
                dest: "/app/".into(),
                owner: "user".into(),
                mode: Some(0o755)
            }
        );
        assert_eq!(plan[5], user("root"));
        assert!(matches!(&plan[6], Planned::Copy { owner, .. } if owner == "app"));
        assert_eq!(plan[8], run("make"));
    }

    #[test]
    fn bad_e2b_steps_are_refused_with_their_number() {
        for (bad, what) in [
            (step("RUN", &[], None), "step 1: RUN needs"),
            (
                step("COPY", &["a", "b"], None),
                "step 1: COPY without filesHash",
            ),
            (step("ENV", &["A"], None), "step 1: ENV takes"),
            (
                step("FROBNICATE", &["x"], None),
                "step 1: FROBNICATE steps are not supported",
            ),
            (
                step("COPY", &["a", "b", "", "999"], Some("h")),
                "step 1: COPY's mode",
            ),
        ] {
            let e = translate(&[bad], "user").unwrap_err();
            assert!(e.starts_with(what), "{e}");
        }
    }
}

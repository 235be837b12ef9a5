//! Templates: immutable, content-addressed root filesystem images a sandbox starts from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resources::Resources;

/// A template as the API and CLI show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateInfo {
    /// Name sandboxes are created from, e.g. `base`.
    pub name: String,
    /// sha256 of the recipe inputs (the cache key and the template's identity).
    pub digest: String,
    /// sha256 of the built ext4 image.
    pub image_sha256: String,
    /// Size of the image; the smallest disk a sandbox of this template can have.
    pub image_size_mib: u32,
    /// Digest of the kernel bundle (kernel + initramfs with the daemon) it boots with.
    pub kernel_digest: String,
    /// Resources used when a create request gives none.
    pub default_resources: Resources,
    /// The user commands run as by default.
    pub default_user: String,
    /// One line about what is in it.
    pub description: String,
    /// When it was built, ms since the Unix epoch.
    pub built_at_ms: i64,
    /// The container image it was built from; absent for SPACE's own recipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<TemplateImage>,
    /// Environment every process of its sandboxes gets (below the sandbox's and the
    /// process's own): the image's `Env`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The directory processes start in when a request names none: the image's
    /// `WorkingDir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The image's `Entrypoint` followed by its `Cmd`: what the image would run (recorded,
    /// not run: a build's `start` says what its sandboxes run).
    #[serde(
        default,
        alias = "start_command",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub image_command: Vec<String>,
    /// The process the template's sandboxes have running from the start, ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<crate::build_steps::TemplateStart>,
}

/// Where a template built from a container image came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateImage {
    /// The reference it was built from (`docker://HOST/REPO:TAG`, `oci:DIR[:TAG]`,
    /// `docker-archive:FILE`); never with credentials.
    pub reference: String,
    /// `sha256:…` of the image's config: the image's identity, whatever its transport.
    pub config_digest: String,
}

/// Separates the tenant that owns a template from its name: `tnt-….NAME[:TAG]` is the
/// full name of a tenant's template. A shared template (the operator's, usable by every
/// tenant) has no owner, and no `.` before its tag.
pub const OWNER_SEPARATOR: char = '.';

/// The tenant that owns template `name` (its full name), and the name within the tenant;
/// `(None, name)` for a shared template. Does not validate.
pub fn split_template_owner(name: &str) -> (Option<&str>, &str) {
    match name.split_once(OWNER_SEPARATOR) {
        // A `.` after the `:` is the tag's (`python:3.12`).
        Some((owner, rest)) if !owner.contains(':') => (Some(owner), rest),
        _ => (None, name),
    }
}

/// The full name of tenant `owner`'s template `name` (a name without an owner).
pub fn owned_template_name(owner: &crate::TenantId, name: &str) -> String {
    format!("{owner}{OWNER_SEPARATOR}{name}")
}

/// A template's full name: `NAME` or `NAME:TAG` for a shared template, `TENANT.NAME[:TAG]`
/// for a tenant's own ([`OWNER_SEPARATOR`]), where `NAME` is `[a-z0-9][a-z0-9_-]{0,62}`,
/// `TAG` (like an image tag: `3.12`, `v2-slim`) is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}` and
/// `TENANT` a tenant id. `NAME:latest` is `NAME` (see [`canonical_template_name`]).
pub fn validate_template_name(name: &str) -> bool {
    match split_template_owner(name) {
        (Some(owner), rest) => {
            owner.parse::<crate::TenantId>().is_ok() && validate_unowned_name(rest)
        }
        (None, name) => validate_unowned_name(name),
    }
}

/// [`validate_template_name`] for a name without an owner.
fn validate_unowned_name(name: &str) -> bool {
    let (base, tag) = match name.split_once(':') {
        Some((base, tag)) => (base, Some(tag)),
        None => (name, None),
    };
    let base_ok = !base.is_empty()
        && base.len() <= 63
        && base.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'-' || b == b'_'))
        });
    let tag_ok = tag.is_none_or(|t| {
        !t.is_empty()
            && t.len() <= 128
            && t.bytes().enumerate().all(|(i, b)| {
                b.is_ascii_alphanumeric() || b == b'_' || (i > 0 && (b == b'.' || b == b'-'))
            })
    });
    base_ok && tag_ok
}

/// A default user a template build may name (`--user`): an account name or uid of 1-64
/// bytes without control characters (the build resolves it in the image).
pub fn validate_default_user(user: &str) -> bool {
    !user.is_empty() && user.len() <= 64 && !user.chars().any(|c| c.is_control())
}

/// The one spelling of a template name: `NAME:latest` becomes `NAME`; `None` if invalid.
pub fn canonical_template_name(name: &str) -> Option<String> {
    if !validate_template_name(name) {
        return None;
    }
    Some(name.strip_suffix(":latest").unwrap_or(name).to_owned())
}

/// Where a template build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TemplateBuildState {
    /// Fetching, unpacking or preparing.
    Building,
    /// Built: the template is named and can be used.
    Ready,
    /// Failed: see the build's `error`; nothing was registered.
    Failed,
}

/// Why a template build failed, as a machine-readable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TemplateBuildErrorCode {
    /// The image reference cannot be understood, or names no registry image.
    BadReference,
    /// No such image or tag.
    ImageNotFound,
    /// The registry refused the credentials (or asked for some).
    RegistryUnauthorized,
    /// The registry could not be reached or failed.
    RegistryUnavailable,
    /// The image is malformed, hostile (escaping paths, device nodes) or has no linux/amd64
    /// variant.
    BadImage,
    /// The image is larger than the node allows.
    ImageTooLarge,
    /// The node failed (storage, the unpacker, a builder sandbox): not the image's fault.
    NodeFailed,
    /// A build step failed: a `RUN` exited non-zero or timed out, a `COPY` or `WORKDIR`
    /// could not be written. The log says which and shows its output.
    StepFailed,
    /// A `COPY`'s files were not uploaded (`PUT /v1/templates/files/{sha256}`).
    FilesNotFound,
    /// The build's steps (or its start command) are invalid.
    BadStep,
    /// The start command exited with an error, or its ready check did not pass in time.
    /// The log shows its output.
    StartFailed,
}

/// A failed build's error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateBuildError {
    /// What kind of failure.
    pub code: TemplateBuildErrorCode,
    /// What happened, for a human.
    pub message: String,
}

/// A line of a build's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateBuildLine {
    /// Its number in the build's log, from 0.
    pub index: u64,
    /// When, ms since the Unix epoch.
    pub ts_ms: i64,
    /// The line.
    pub line: String,
}

/// A template build and its log (from the offset asked for).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateBuildStatus {
    /// The build's id.
    pub build_id: String,
    /// The template name it builds.
    pub name: String,
    /// The image it builds from.
    pub from_image: String,
    /// Where it is.
    pub state: TemplateBuildState,
    /// Log lines from the offset asked for (older lines may have been dropped: a build
    /// keeps its newest 2,000).
    pub logs: Vec<TemplateBuildLine>,
    /// The index the next line will have: the offset to ask for next.
    pub next_log_index: u64,
    /// The template, once ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateInfo>,
    /// The failure, once failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<TemplateBuildError>,
    /// When it started, ms since the Unix epoch.
    pub started_at_ms: i64,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<i64>,
}

/// One line of a followed build (`POST /v1/templates` with `Accept: application/x-ndjson`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TemplateBuildEvent {
    /// The build started.
    Started {
        /// Its id (`GET /v1/templates/builds/{id}` follows it too).
        build_id: String,
        /// The template name.
        name: String,
    },
    /// A line of its log.
    Log(TemplateBuildLine),
    /// Built: the template.
    Ready {
        /// It.
        template: Box<TemplateInfo>,
    },
    /// Failed; nothing was registered.
    Failed {
        /// Why.
        error: TemplateBuildError,
    },
}

/// A template in a node's template cache: one no name points at there (a build's cached
/// step, what a name meant before it was rebuilt, one fetched by digest). Kept until pruned
/// (`POST /v1/template-cache/prune`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CachedTemplate {
    /// The node that holds it.
    pub node: String,
    /// Its digest.
    pub digest: String,
    /// What made it (a build step, or the template's own description).
    pub description: String,
    /// Size of its image.
    pub image_size_mib: u32,
    /// When it was built, ms since the Unix epoch.
    pub built_at_ms: i64,
    /// When a build, create or resume last needed it on that node (at least `built_at_ms`).
    pub last_used_ms: i64,
}

/// `POST /v1/template-cache/prune`: what to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TemplateCachePruneRequest {
    /// Remove what no node needed for this long (default a day; 0: everything unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unused_for_secs: Option<u64>,
    /// Only say what would be removed.
    #[serde(default)]
    pub dry_run: bool,
}

/// What a prune of the template cache removed, and what it kept and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateCachePrune {
    /// Removed (or, on a dry run, would be).
    pub removed: Vec<CachedTemplate>,
    /// Old enough but kept: sandboxes or snapshots were made from them.
    pub in_use: Vec<CachedTemplate>,
    /// Nodes skipped because a template build ran there (a build may need any step).
    pub busy_nodes: Vec<String>,
    /// Nodes that could not be asked; their caches are untouched.
    pub unreachable_nodes: Vec<String>,
    /// The removed images' sizes, summed.
    pub freed_mib: u64,
    /// Nothing was removed: this is what would have been.
    pub dry_run: bool,
}

/// A valid build id: 1-64 of `[a-z0-9-]`.
pub fn validate_build_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_names_and_tags() {
        for ok in [
            "base",
            "python:3.12",
            "a-b_c:v2-slim",
            "x:latest",
            "py:3.12.1_rc",
        ] {
            assert!(validate_template_name(ok), "{ok}");
        }
        for bad in [
            "", "Base", "-x", "x:", ":x", "x:.1", "x:a:b", "x/y", "x:a/b", "x y", "x:-a",
        ] {
            assert!(!validate_template_name(bad), "{bad:?}");
        }
        assert!(!validate_template_name(&"a".repeat(64)));
        assert!(!validate_template_name(&format!("a:{}", "b".repeat(129))));
        assert_eq!(canonical_template_name("x:latest").as_deref(), Some("x"));
        assert_eq!(canonical_template_name("x:3").as_deref(), Some("x:3"));
        assert_eq!(canonical_template_name("X"), None);
    }

    #[test]
    fn a_tenants_templates_carry_its_id() {
        let owner: crate::TenantId = "tnt-abcdefghijkl".parse().unwrap();
        let full = owned_template_name(&owner, "python:3.12");
        assert_eq!(full, "tnt-abcdefghijkl.python:3.12");
        assert!(validate_template_name(&full));
        assert_eq!(
            split_template_owner(&full),
            (Some("tnt-abcdefghijkl"), "python:3.12")
        );
        assert_eq!(split_template_owner("python:3.12"), (None, "python:3.12"));
        assert_eq!(
            canonical_template_name("tnt-abcdefghijkl.py:latest").as_deref(),
            Some("tnt-abcdefghijkl.py")
        );
        for bad in [
            "tnt-short.py",
            "x.py",
            "tnt-abcdefghijkl.",
            "tnt-abcdefghijkl.Py",
            "tnt-abcdefghijkl.tnt-abcdefghijkl.py",
            ".py",
        ] {
            assert!(!validate_template_name(bad), "{bad:?}");
        }
    }
}

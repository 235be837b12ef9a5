//! Template builds: what the control plane asks a node to build.

use serde::{Deserialize, Serialize};

use crate::wire::SecretString;

/// Longest image reference accepted.
pub const MAX_IMAGE_REFERENCE: usize = 1024;
/// Smallest builder disk a build may ask for, MiB.
pub const MIN_BUILDER_DISK_MIB: u32 = 256;
/// Largest builder disk a build may ask for, MiB (sparse: what the steps write is what it
/// takes).
pub const MAX_BUILDER_DISK_MIB: u32 = 256 * 1024;

/// Checks a build's `builder_disk_mib` against [`MIN_BUILDER_DISK_MIB`] and
/// [`MAX_BUILDER_DISK_MIB`]; the error says the bounds.
pub fn check_builder_disk_mib(mib: u32) -> Result<(), String> {
    if (MIN_BUILDER_DISK_MIB..=MAX_BUILDER_DISK_MIB).contains(&mib) {
        Ok(())
    } else {
        Err(format!(
            "a builder's disk (builder_disk_mib) is {MIN_BUILDER_DISK_MIB} to {MAX_BUILDER_DISK_MIB} MiB"
        ))
    }
}

/// Build template `name` from registry image `from_image` on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildTemplate {
    /// The build's id (chosen by the control plane; see
    /// [`space_core::template::validate_build_id`]).
    pub build_id: String,
    /// The name (canonical, see [`space_core::template::canonical_template_name`]).
    pub name: String,
    /// More names for the same build (`NAME:TAG`s).
    #[serde(default)]
    pub also_named: Vec<String>,
    /// A registry image: `HOST/REPO:TAG`, `HOST/REPO@sha256:…` or `docker://…`; empty
    /// when the build starts from a template.
    pub from_image: String,
    /// A template the node has, to start from instead of an image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_template: Option<String>,
    /// What is done on top of the base, in order (see `space_core::build_steps`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<space_core::build_steps::BuildStep>,
    /// What the template's sandboxes have running from the start (see
    /// `space_core::build_steps::TemplateStart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<space_core::build_steps::TemplateStart>,
    /// The account commands run as by default, instead of the image's `User`.
    #[serde(default)]
    pub user: Option<String>,
    /// Registry credentials given with the build.
    #[serde(default)]
    pub registry_login: Option<RegistryLogin>,
    /// What the build's builder sandboxes may reach (a tenant's build: the tenant's default
    /// policy); without one, the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<space_core::egress::EgressPolicy>,
    /// The builder sandboxes' disk at least, MiB (for steps that install more than the
    /// default headroom); the templates the steps make have an image this large.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builder_disk_mib: Option<u32>,
}

/// A registry user name and password (redacted in every formatting).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryLogin {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: SecretString,
}

/// What a node did when asked to remove a template from its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheRemoval {
    /// Removed, with its memory images and warm sandboxes.
    Removed,
    /// Not in the cache (gone already, or a name points at it now).
    NotCached,
    /// Needed since the cut-off the caller gave: kept.
    UsedSince,
    /// A template build runs on the node: nothing is removed until it ends.
    BuildRunning,
}

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
    /// The image's `Entrypoint` followed by its `Cmd`: what the image would run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub start_command: Vec<String>,
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

/// A template name: `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn validate_template_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'-' || b == b'_'))
        })
}

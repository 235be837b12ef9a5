//! Templates: immutable, content-addressed root filesystem images a sandbox starts from.

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
}

/// A template name: `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn validate_template_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'-' || b == b'_'))
        })
}

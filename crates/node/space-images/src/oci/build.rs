//! `space template build NAME --from REF`: an image becomes a template in the store.
//!
//! The template's digest is derived from the image config's digest (which names every
//! layer's content), the plumbing's version and the default user, so the same image built
//! again — from a registry, a layout or an archive, compressed any way — is found in the
//! store and not unpacked again; when the config says the template is there, no layer is
//! even downloaded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_core::template::{TemplateImage, TemplateInfo};
use space_core::Resources;
use space_storage::{Store, IMAGE_FILE};

use crate::digest::{sha256_file, InputDigest};
use crate::error::ImageError;
use crate::kernel::{now_ms, short};
use crate::oci::fetch::PulledImage;
use crate::oci::jail::{self, UnpackJob};
use crate::oci::registry::RegistryOpts;
use crate::oci::source::ImageSource;
use crate::oci::staged::{self, StagedImage, StagedInput};
use crate::oci::unpack::UnpackLimits;
use crate::oci::{layout, registry, ImageLimits, OciError};

/// Bumped when what [`super::plumbing`] adds changes: templates built before are rebuilt.
pub const PLUMBING_VERSION: &str = "1";

/// Options of an image build.
#[derive(Debug, Clone, Default)]
pub struct ImageBuildOpts {
    /// Registry credentials, CA and plain-HTTP hosts.
    pub registry: RegistryOpts,
    /// Bounds on the image.
    pub limits: ImageLimits,
    /// The program the jailed unpacker runs as (`space`, which answers
    /// [`jail::CHILD_ARG`]).
    pub unpacker: PathBuf,
    /// The account commands run as by default, instead of the image's `User` (or the
    /// sandbox user when it sets none).
    pub user: Option<String>,
    /// Resources sandboxes get when a create names none.
    pub default_resources: Resources,
}

/// Progress lines of a build.
pub type Progress = Arc<dyn Fn(&str) + Send + Sync>;

/// Builds template `name` from `source` into `store`, bound to kernel bundle
/// `kernel_digest`, in this process: [`stage_image`] then [`build_staged`] (the CLI's way;
/// a node splits the two between its sandbox manager and its node manager). Needs root.
pub async fn build_from_image(
    store: &Store,
    name: &str,
    source: &ImageSource,
    kernel_digest: &str,
    opts: &ImageBuildOpts,
    progress: Progress,
) -> Result<TemplateInfo, ImageError> {
    check_build(store, Some(name), kernel_digest)?;
    let work = work_dir(store)?;
    let blobs = work.path().join("blobs");
    stage_image(store, source, &blobs, opts, progress.clone()).await?;
    let store = store.clone();
    let (name, kernel_digest, opts) = (name.to_owned(), kernel_digest.to_owned(), opts.clone());
    tokio::task::spawn_blocking(move || {
        let input = staged::open_staged(&blobs, &opts.limits)?;
        let info = build_staged(
            &store,
            Some(&name),
            &input,
            &kernel_digest,
            &opts,
            &*progress,
        );
        drop(work);
        info
    })
    .await
    .map_err(|e| OciError::Unpacker(format!("the build task failed: {e}")))?
}

/// Fetches `source` into directory `dir` as a staged image (see [`staged`]); scratch space
/// (an archive's extraction) goes beside it. When the template the image makes is in
/// `store` already, no layer is fetched. Needs no privilege.
pub async fn stage_image(
    store: &Store,
    source: &ImageSource,
    dir: &Path,
    opts: &ImageBuildOpts,
    progress: Progress,
) -> Result<StagedImage, OciError> {
    let templates = store.templates();
    let user = opts.user.clone();
    let cached = move |config_digest: &str| {
        templates
            .lookup_digest(&template_digest(config_digest, user.as_deref()))
            .ok()
            .flatten()
            .is_some()
    };
    let scratch = dir.with_extension("scratch");
    let pulled = fetch(source, &scratch, dir, opts, &cached, progress).await?;
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || staged::stage(&pulled, &dir))
        .await
        .map_err(|e| OciError::Unpacker(format!("the staging task failed: {e}")))?
}

/// Checks what a build needs before anything is fetched: a valid name (if any) and the
/// kernel bundle.
pub fn check_build(
    store: &Store,
    name: Option<&str>,
    kernel_digest: &str,
) -> Result<(), ImageError> {
    if store.kernels().get(kernel_digest)?.is_none() {
        return Err(ImageError::KernelMissing(kernel_digest.to_owned()));
    }
    if let Some(name) = name.filter(|n| !space_core::template::validate_template_name(n)) {
        return Err(
            space_storage::StorageError::InvalidName(name.chars().take(80).collect()).into(),
        );
    }
    Ok(())
}

/// Builds template `name` from a staged image (opened and checked by
/// [`staged::open_staged`]) into `store`, unless the store has it already; points `name` at
/// it (none: the template is found by its digest only, e.g. the base of a build with steps).
/// Blocking; needs root (the unpacker's uid range). Nothing is registered unless every step
/// succeeds.
pub fn build_staged(
    store: &Store,
    name: Option<&str>,
    input: &StagedInput,
    kernel_digest: &str,
    opts: &ImageBuildOpts,
    say: &dyn Fn(&str),
) -> Result<TemplateInfo, ImageError> {
    check_build(store, name, kernel_digest)?;
    let digest = template_digest(&input.config_digest, opts.user.as_deref());
    let templates = store.templates();
    let shown = name.unwrap_or("image");
    if templates.lookup_digest(&digest)?.is_some() {
        say(&format!("template {shown} ({}) is cached", short(&digest)));
    }
    let build = |staging: &Path| {
        let work = work_dir(store)?;
        unpack(
            input,
            work.path(),
            staging,
            &digest,
            kernel_digest,
            opts,
            say,
        )
    };
    let info = match name {
        Some(name) => templates.build_or_wait(name, &digest, build)?,
        None => templates.build_unnamed_or_wait(&digest, build)?,
    };
    let info = if info.kernel_digest != kernel_digest {
        templates.set_kernel_digest(&digest, kernel_digest)?
    } else {
        info
    };
    say(&format!(
        "template {shown} ready ({} MiB image, from {})",
        info.image_size_mib, input.image.source
    ));
    Ok(TemplateInfo {
        name: name.unwrap_or_default().to_owned(),
        ..info
    })
}

/// The template digest of an image (see the module doc).
pub fn template_digest(config_digest: &str, user: Option<&str>) -> String {
    let mut d = InputDigest::new("oci-template");
    d.field("config", config_digest.as_bytes())
        .field("plumbing", PLUMBING_VERSION.as_bytes())
        .field("user", user.unwrap_or("").as_bytes());
    d.finish()
}

async fn fetch(
    source: &ImageSource,
    scratch: &Path,
    blobs: &Path,
    opts: &ImageBuildOpts,
    cached: &(dyn Fn(&str) -> bool + Sync),
    progress: Progress,
) -> Result<PulledImage, OciError> {
    let described = source.describe();
    match source {
        ImageSource::Registry(r) => {
            registry::pull(r, blobs, &opts.registry, &opts.limits, cached, &*progress).await
        }
        ImageSource::Layout { dir, tag } => {
            let (dir, tag, blobs, limits) =
                (dir.clone(), tag.clone(), blobs.to_owned(), opts.limits);
            progress(&format!("reading {described}"));
            tokio::task::spawn_blocking(move || {
                layout::read_layout(&dir, tag.as_deref(), &blobs, &limits, &described)
            })
            .await
            .map_err(|e| OciError::Unpacker(e.to_string()))?
        }
        ImageSource::Archive(file) => {
            let (file, blobs, limits) = (file.clone(), blobs.to_owned(), opts.limits);
            let extracted = scratch.to_owned();
            progress(&format!("reading {described}"));
            tokio::task::spawn_blocking(move || {
                let r = layout::read_archive(&file, &extracted, &blobs, &limits, &described);
                let _ = std::fs::remove_dir_all(&extracted);
                r
            })
            .await
            .map_err(|e| OciError::Unpacker(e.to_string()))?
        }
    }
}

/// Unpacks the staged image in the jail (its work directory `work`) and moves the image
/// into `staging`.
fn unpack(
    input: &StagedInput,
    work: &Path,
    staging: &Path,
    digest: &str,
    kernel_digest: &str,
    opts: &ImageBuildOpts,
    say: &dyn Fn(&str),
) -> Result<TemplateInfo, ImageError> {
    let config = &input.config;
    say(&format!(
        "unpacking {} layers of {} ({})",
        input.image.layers.len(),
        input.image.source,
        short(&input.config_digest)
    ));
    let job = UnpackJob {
        layers: input.layers()?,
        limits: UnpackLimits {
            max_bytes: opts.limits.max_unpacked_bytes,
            max_entries: opts.limits.max_entries,
        },
        image_user: opts.user.clone().or_else(|| config.user.clone()),
        workdir: config.working_dir.clone(),
        min_image_mib: 0,
    };
    let report = jail::run_jailed(&opts.unpacker, work, &input.dir, &job, say)?;
    if !report.skipped_xattrs.is_empty() {
        say(&format!(
            "xattrs not applied (not meaningful in a sandbox): {}",
            report.skipped_xattrs.join(", ")
        ));
    }
    let image = staging.join(IMAGE_FILE);
    let from = work.join(jail::IMAGE);
    std::fs::rename(&from, &image).map_err(|e| ImageError::io("move the image to", &image, e))?;
    say("hashing image");
    let image_sha256 = sha256_file(&image)?;
    Ok(TemplateInfo {
        name: String::new(),
        digest: digest.to_owned(),
        image_sha256,
        image_size_mib: u32::try_from(report.image_size_mib).unwrap_or(u32::MAX),
        kernel_digest: kernel_digest.to_owned(),
        default_resources: opts.default_resources,
        default_user: report.plumbed.default_user,
        description: format!("from {}", input.image.source),
        built_at_ms: now_ms(),
        image: Some(TemplateImage {
            reference: input.image.source.clone(),
            config_digest: input.config_digest.clone(),
        }),
        env: config.env.clone(),
        workdir: config.working_dir.clone(),
        image_command: config.image_command(),
        start: None,
    })
}

/// A build's scratch directory in the store (root's, 0700, a random name: the unpacker
/// reaches it only through the descriptor it is given), removed when dropped.
fn work_dir(store: &Store) -> Result<tempfile::TempDir, ImageError> {
    let parent = store.root().join(".image-builds");
    std::fs::create_dir_all(&parent).map_err(|e| ImageError::io("create", &parent, e))?;
    tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(&parent)
        .map_err(|e| ImageError::io("create a work directory in", &parent, e))
}

//! Building a template: a recipe's root filesystem as an ext4 image in the store's template
//! store, bound to a kernel bundle.

use std::path::PathBuf;

use space_core::template::TemplateInfo;
use space_storage::{Store, IMAGE_FILE};

use crate::digest::sha256_file;
use crate::error::ImageError;
use crate::hostfiles::{self, CopiedFile};
use crate::kernel::{busybox_applets, now_ms, short};
use crate::recipes::{recipe, recipes, RecipeKind, TemplateRecipe};
use crate::{ext4, mirror, rootfs};

/// Build options that do not change what a template is.
#[derive(Debug, Clone)]
pub struct BuildOpts {
    /// Debian mirror for debootstrap; default: the host's apt source for the suite, else
    /// `http://deb.debian.org/debian`.
    pub mirror: Option<String>,
    /// Static busybox for the busybox template (its hash is part of that template's digest).
    pub busybox: PathBuf,
    /// Where the host's apt sources are (`/etc/apt`), for the default mirror.
    pub apt_dir: PathBuf,
}

impl Default for BuildOpts {
    fn default() -> Self {
        BuildOpts {
            mirror: None,
            busybox: PathBuf::from("/bin/busybox"),
            apt_dir: PathBuf::from("/etc/apt"),
        }
    }
}

/// The digest template `name` would have with these options (its cache key).
pub fn template_digest(name: &str, opts: &BuildOpts) -> Result<String, ImageError> {
    let r = find(name)?;
    let host = host_files(&r)?;
    digest_of(&r, opts, &host)
}

/// The recipe's digest, given the host files it copies.
fn digest_of(
    r: &TemplateRecipe,
    opts: &BuildOpts,
    host: &[CopiedFile],
) -> Result<String, ImageError> {
    Ok(r.digest(
        &extra_inputs(r, opts, host)?
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect::<Vec<_>>(),
    ))
}

/// The files the recipe copies from the host, libraries resolved.
fn host_files(r: &TemplateRecipe) -> Result<Vec<CopiedFile>, ImageError> {
    match r.kind {
        RecipeKind::Busybox { host_files, .. } => hostfiles::resolve(host_files),
        RecipeKind::Debootstrap { .. } => Ok(Vec::new()),
    }
}

fn find(name: &str) -> Result<TemplateRecipe, ImageError> {
    recipe(name).ok_or_else(|| ImageError::UnknownTemplate {
        name: name.chars().take(80).collect(),
        known: recipes()
            .iter()
            .map(|r| r.name)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Content inputs beyond the recipe: the busybox binary's sha256, then each host file's
/// path in the tree (libraries included) and sha256, in path order.
fn extra_inputs(
    r: &TemplateRecipe,
    opts: &BuildOpts,
    host: &[CopiedFile],
) -> Result<Vec<(&'static str, String)>, ImageError> {
    let mut extra = match r.kind {
        RecipeKind::Busybox { .. } => vec![("busybox_sha256", sha256_file(&opts.busybox)?)],
        RecipeKind::Debootstrap { .. } => vec![],
    };
    for f in host {
        extra.push(("host_file", f.dest.clone()));
        extra.push(("host_file_sha256", sha256_file(&f.source)?));
    }
    Ok(extra)
}

/// Builds template `name` into the store (or finds it built) and binds it to the kernel
/// bundle `kernel_digest`, which must already be in the store (see
/// [`crate::build_kernel_bundle`]).
///
/// The image is keyed by the recipe digest only, so a new kernel bundle (e.g. a rebuilt
/// `spaced`) is bound to an existing image without rebuilding it: the template's
/// `kernel_digest` (and its default resources, user and description) are updated in place.
/// Concurrent builds of one template build once. Needs root.
pub fn build_template(
    store: &Store,
    name: &str,
    kernel_digest: &str,
    opts: &BuildOpts,
    progress: &dyn Fn(&str),
) -> Result<TemplateInfo, ImageError> {
    let r = find(name)?;
    if store.kernels().get(kernel_digest)?.is_none() {
        return Err(ImageError::KernelMissing(kernel_digest.to_owned()));
    }
    let host = host_files(&r)?;
    let digest = digest_of(&r, opts, &host)?;
    let templates = store.templates();
    if templates.lookup_digest(&digest)?.is_some() {
        progress(&format!("template {name} ({}) is cached", short(&digest)));
    }
    let info = templates.build_or_wait(name, &digest, |staging| {
        if !nix::unistd::geteuid().is_root() {
            return Err(ImageError::NotRoot(format!("template {name}")));
        }
        progress(&format!("building template {name} ({})", short(&digest)));
        let tree = staging.join("tree");
        match r.kind {
            RecipeKind::Busybox { dirs, links, .. } => {
                let applets = busybox_applets(&opts.busybox)?;
                rootfs::busybox_tree(&tree, &opts.busybox, &applets, r.files, dirs, links)?;
                hostfiles::copy_into(&tree, &host)?;
                hostfiles::check_in_tree(&tree, &host)?;
            }
            RecipeKind::Debootstrap { suite, variant } => {
                let m = opts
                    .mirror
                    .clone()
                    .unwrap_or_else(|| mirror::default_mirror(&opts.apt_dir, suite));
                rootfs::debootstrap_tree(
                    &tree,
                    suite,
                    variant,
                    &r.packages,
                    &r.apt_packages,
                    &m,
                    r.files,
                    progress,
                )?;
            }
        }
        let usage = ext4::tree_usage(&tree)?;
        let size_mib = match r.image_size_mib {
            Some(s) => u64::from(s).max(ext4::min_size_mib(usage.bytes)),
            None => ext4::image_size_mib(usage.bytes),
        };
        progress(&format!(
            "root filesystem: {} MiB in {} inodes",
            usage.bytes >> 20,
            usage.inodes
        ));
        let image = staging.join(IMAGE_FILE);
        ext4::make_image(
            &tree,
            &image,
            size_mib,
            ext4::inode_count(usage.inodes, size_mib),
            progress,
        )?;
        space_storage::mountinfo::remove_tree(&tree)?;
        progress("hashing image");
        let image_sha256 = sha256_file(&image)?;
        Ok(TemplateInfo {
            name: name.to_owned(),
            digest: digest.clone(),
            image_sha256,
            image_size_mib: u32::try_from(size_mib).unwrap_or(u32::MAX),
            kernel_digest: kernel_digest.to_owned(),
            default_resources: r.default_resources,
            default_user: r.default_user.to_owned(),
            description: r.description.to_owned(),
            built_at_ms: now_ms(),
            image: None,
            env: Default::default(),
            workdir: None,
            image_command: Vec::new(),
            start: None,
        })
    })?;
    let stale = info.kernel_digest != kernel_digest
        || info.default_resources != r.default_resources
        || info.default_user != r.default_user
        || info.description != r.description;
    let mut info = if stale {
        progress(&format!(
            "binding template {name} to kernel bundle {}",
            short(kernel_digest)
        ));
        templates.artifacts().update_meta(&digest, |t| {
            t.kernel_digest = kernel_digest.to_owned();
            t.default_resources = r.default_resources;
            t.default_user = r.default_user.to_owned();
            t.description = r.description.to_owned();
        })?
    } else {
        info
    };
    info.name = name.to_owned();
    progress(&format!(
        "template {name} ready ({} MiB image)",
        info.image_size_mib
    ));
    Ok(info)
}

//! Builds guest artifacts: the kernel bundle (kernel + initramfs with spaced) and template root filesystems.
//!
//! - [`build_kernel_bundle`]: the host's Debian cloud kernel plus an initramfs we write
//!   (busybox, the virtio modules in dependency order, `/init` from `images/initramfs/init`,
//!   and `spaced`), stored content-addressed in the store; boot it with [`kernel_cmdline`].
//! - [`build_template`]: a recipe's ([`recipes`]) root filesystem as an ext4 image in the
//!   store, bound to a kernel bundle.
//!
//! - [`oci::build_from_image`]: a container image (registry, OCI layout, `docker save`
//!   archive) as a template, unpacked in a jail.
//!
//! All are cached by input digest and built once even when requested concurrently (the
//! store's `build_or_wait`). Both report progress lines through a callback.

mod digest;
mod error;
pub mod ext4;
mod hostfiles;
pub mod initramfs;
mod kernel;
pub mod mirror;
pub mod modules;
pub mod oci;
pub mod recipes;
mod rootfs;
mod run;
mod template;

pub use error::ImageError;
pub use kernel::{
    build_kernel_bundle, compare_versions, kernel_cmdline, newest_cloud_kernel, KernelOpts,
    BUNDLE_RECIPE_VERSION,
};
pub use recipes::{recipe, recipes, TemplateRecipe};
pub use space_storage::KernelBundleInfo;
pub use template::{build_template, template_digest, BuildOpts};

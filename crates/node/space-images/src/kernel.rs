//! The kernel bundle: the host's Debian cloud kernel plus an initramfs we build (busybox,
//! virtio modules, `/init`, `spaced`), stored content-addressed in the store's kernel dir.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use space_storage::{KernelBundleInfo, KernelMeta, Store, INITRAMFS_FILE, VMLINUZ_FILE};

use crate::digest::{sha256_file, InputDigest};
use crate::error::{ImageError, IoContext};
use crate::initramfs::{self, InitramfsSpec, INIT_SCRIPT};
use crate::modules::{self, ModuleDeps, ResolveError, WANTED_MODULES};

/// Bumped whenever the bundle layout or build logic changes, so old bundles are not reused.
pub const BUNDLE_RECIPE_VERSION: u32 = 1;

/// The kernel command line the VMM boots bundles with.
pub fn kernel_cmdline() -> String {
    // console on the first serial port (the VMM logs it); reboot=t: reboot by triple fault,
    // which ends the VM under -no-reboot; panic=-1: a panic reboots at once (so also ends the
    // VM); rdinit: our initramfs's init.
    "console=ttyS0 reboot=t panic=-1 quiet rdinit=/init".to_owned()
}

/// Inputs of a kernel bundle.
#[derive(Debug, Clone)]
pub struct KernelOpts {
    /// Kernel release to bundle; default: the newest `/boot/vmlinuz-*-cloud-amd64`.
    pub kernel_version: Option<String>,
    /// The guest daemon, statically linked.
    pub spaced: PathBuf,
    /// Static busybox (Debian's busybox-static).
    pub busybox: PathBuf,
    /// Where kernels are (`/boot`).
    pub boot_dir: PathBuf,
    /// Where their modules are (`/lib/modules`).
    pub modules_root: PathBuf,
}

impl KernelOpts {
    /// Options with the host defaults for everything but `spaced`.
    pub fn new(spaced: impl Into<PathBuf>) -> Self {
        KernelOpts {
            kernel_version: None,
            spaced: spaced.into(),
            busybox: PathBuf::from("/bin/busybox"),
            boot_dir: PathBuf::from("/boot"),
            modules_root: PathBuf::from("/lib/modules"),
        }
    }
}

/// Compares version strings the way `sort -V` does: digit runs numerically, the rest as text.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(cb.iter()) {
        let ord = match (x, y) {
            ((true, x), (true, y)) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            ((_, x), (_, y)) => x.cmp(y),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    ca.len().cmp(&cb.len())
}

/// The newest cloud kernel release among `/boot` file names (`vmlinuz-<release>` with a
/// release ending in `-cloud-amd64`).
pub fn newest_cloud_kernel<'a>(boot_files: impl IntoIterator<Item = &'a str>) -> Option<String> {
    boot_files
        .into_iter()
        .filter_map(|f| f.strip_prefix("vmlinuz-"))
        .filter(|v| v.ends_with("-cloud-amd64"))
        .max_by(|a, b| compare_versions(a, b))
        .map(str::to_owned)
}

/// Applets of a busybox binary (`busybox --list`).
pub(crate) fn busybox_applets(busybox: &Path) -> Result<Vec<String>, ImageError> {
    let out = space_storage::cmd::run(Command::new(busybox).arg("--list"))?;
    let applets: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| initramfs::valid_applet(l))
        .map(str::to_owned)
        .collect();
    for needed in ["sh", "mount", "insmod", "switch_root"] {
        if !applets.iter().any(|a| a == needed) {
            return Err(ImageError::BadOutput {
                program: busybox.display().to_string(),
                detail: format!(
                    "busybox has no '{needed}' applet (use busybox-static's /bin/busybox)"
                ),
            });
        }
    }
    Ok(applets)
}

fn resolve_kernel_version(opts: &KernelOpts) -> Result<String, ImageError> {
    if let Some(v) = &opts.kernel_version {
        return Ok(v.clone());
    }
    let names: Vec<String> = std::fs::read_dir(&opts.boot_dir)
        .ctx("list", &opts.boot_dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    newest_cloud_kernel(names.iter().map(String::as_str)).ok_or_else(|| {
        ImageError::NoKernel(format!(
            "no {}/vmlinuz-*-cloud-amd64 (install linux-image-cloud-amd64, or pass a kernel version)",
            opts.boot_dir.display()
        ))
    })
}

/// Module files (host paths) for the initramfs, dependencies first.
fn resolve_modules(modules_dir: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let dep_path = modules_dir.join("modules.dep");
    let text = std::fs::read_to_string(&dep_path).ctx("read", &dep_path)?;
    let order = ModuleDeps::parse(&text)
        .load_order(WANTED_MODULES)
        .map_err(|e| match e {
            ResolveError::Missing(m) => ImageError::ModuleMissing {
                module: m,
                modules_dep: dep_path.clone(),
            },
            ResolveError::Cycle(m) => ImageError::ModuleCycle(m),
        })?;
    if let Some(c) = order.iter().find(|p| modules::is_compressed(p)) {
        return Err(ImageError::CompressedModule(c.clone()));
    }
    Ok(order.into_iter().map(|p| modules_dir.join(p)).collect())
}

/// Builds (or finds in the store) the kernel bundle for `opts`, and returns it.
///
/// The digest covers the bundle recipe version, the kernel image, each module (name and
/// contents), the `/init` script, `spaced` and busybox; a bundle with the same inputs is
/// built once and reused.
pub fn build_kernel_bundle(
    store: &Store,
    opts: &KernelOpts,
    progress: &dyn Fn(&str),
) -> Result<KernelBundleInfo, ImageError> {
    let version = resolve_kernel_version(opts)?;
    let vmlinuz = opts.boot_dir.join(format!("vmlinuz-{version}"));
    if !vmlinuz.is_file() {
        return Err(ImageError::NoKernel(format!(
            "{} does not exist",
            vmlinuz.display()
        )));
    }
    let modules_dir = opts.modules_root.join(&version);
    let modules = resolve_modules(&modules_dir)?;
    let applets = busybox_applets(&opts.busybox)?;
    progress(&format!(
        "kernel {version}: {} modules ({})",
        modules.len(),
        modules
            .iter()
            .map(|m| initramfs::module_file_name(m))
            .collect::<Vec<_>>()
            .join(", ")
    ));

    let mut d = InputDigest::new("space-kernel-bundle");
    d.field("recipe_version", &BUNDLE_RECIPE_VERSION.to_le_bytes());
    d.field("kernel_version", version.as_bytes());
    d.field("vmlinuz", sha256_file(&vmlinuz)?.as_bytes());
    for m in &modules {
        d.field("module", initramfs::module_file_name(m).as_bytes());
        d.field("module_sha256", sha256_file(m)?.as_bytes());
    }
    d.field("init", INIT_SCRIPT.as_bytes());
    d.field("spaced", sha256_file(&opts.spaced)?.as_bytes());
    d.field("busybox", sha256_file(&opts.busybox)?.as_bytes());
    let digest = d.finish();

    if store.kernels().get(&digest)?.is_some() {
        progress(&format!("kernel bundle {} is cached", short(&digest)));
    }
    let module_names: Vec<String> = modules
        .iter()
        .map(|m| initramfs::module_file_name(m))
        .collect();
    store.kernels().build_or_wait(&digest, |staging| {
        progress(&format!("building kernel bundle {}", short(&digest)));
        space_storage::reflink_or_copy(&vmlinuz, &staging.join(VMLINUZ_FILE))?;
        let spec = InitramfsSpec {
            busybox: opts.busybox.clone(),
            applets,
            modules,
            spaced: opts.spaced.clone(),
        };
        initramfs::write(&initramfs::entries(&spec)?, &staging.join(INITRAMFS_FILE))?;
        progress("initramfs written");
        Ok::<_, ImageError>(KernelMeta {
            digest: digest.clone(),
            kernel_version: version.clone(),
            modules: module_names,
            built_at_ms: now_ms(),
        })
    })
}

/// The first 12 characters of a digest, for messages.
pub(crate) fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_order() {
        assert_eq!(
            compare_versions("6.1.0-9-cloud-amd64", "6.1.0-56-cloud-amd64"),
            Ordering::Less
        );
        assert_eq!(
            compare_versions("6.10.0-1-cloud-amd64", "6.9.0-99-cloud-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            compare_versions("6.1.0-56-cloud-amd64", "6.1.0-56-cloud-amd64"),
            Ordering::Equal
        );
    }

    #[test]
    fn picks_newest_cloud_kernel() {
        let files = [
            "config-6.1.0-56-cloud-amd64",
            "vmlinuz-6.1.0-9-cloud-amd64",
            "vmlinuz-6.1.0-56-cloud-amd64",
            "vmlinuz-6.12.0-1-amd64",
            "initrd.img-6.1.0-56-cloud-amd64",
        ];
        assert_eq!(
            newest_cloud_kernel(files).as_deref(),
            Some("6.1.0-56-cloud-amd64")
        );
        assert_eq!(newest_cloud_kernel(["vmlinuz-6.12.0-1-amd64"]), None);
    }

    #[test]
    fn cmdline_has_what_the_vmm_needs() {
        let c = kernel_cmdline();
        for part in [
            "console=ttyS0",
            "reboot=t",
            "panic=-1",
            "quiet",
            "rdinit=/init",
        ] {
            assert!(c.split(' ').any(|p| p == part), "{part} missing from {c}");
        }
    }
}

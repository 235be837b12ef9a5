//! Memory images: a booted, ready VM of a template, saved once, from which sandboxes start
//! without booting.
//!
//! An image is the guest RAM as a file (written by a VM whose memory was a shared file),
//! the device state saved with `x-ignore-shared` (tens of KB), and the disk as it was at that
//! instant. A sandbox maps the memory file copy-on-write, so every sandbox started from one
//! image shares the pages it has not written, and loads only the device state: ~50 ms
//! instead of a multi-second boot under TCG.
//!
//! Images are content-addressed by everything that shapes the saved VM ([`ImageKey`]): the
//! template and kernel bundle, vCPUs, memory and accelerator. Building one boots a VM once;
//! concurrent requests for the same key wait for that one build (the store's per-digest
//! lock), so a burst of creates materialises an image once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use space_core::template::TemplateInfo;
use space_core::Resources;
use space_storage::{Artifact, CasDir, ExistingDisk, KernelBundleInfo};
use space_vmm::{GuestMemory, SaveOptions, Vm, VmConfig};

use crate::template_builds::Log;
use crate::NodeError;

/// A log of a VM's start command into the node's own log (at debug: it is the workload's
/// output).
pub(crate) fn node_log(vm: &str) -> Log {
    let vm = vm.to_owned();
    std::sync::Arc::new(move |line: &str| tracing::debug!(vm = %vm, "{line}"))
}

/// The memory file of an image.
pub const MEMORY_FILE: &str = "memory";
/// The device state of an image.
pub const STATE_FILE: &str = "vm.state";
/// The disk of an image.
pub const DISK_FILE: &str = "disk.raw";
/// Version of what an image holds. 2: the root file system is already grown to the image's
/// disk size (sandboxes started from it need no online resize).
pub const IMAGE_FORMAT: u32 = 2;
/// Hostname of the image VM (every sandbox gets its own at restore).
const IMAGE_HOSTNAME: &str = "space-image";
/// Bound on saving the image's device state (the RAM is in the memory file already).
const SAVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything that shapes a saved VM; two requests with equal keys can share an image.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ImageKey {
    /// Bumped whenever what an image holds changes (old images are then not reused).
    pub format: u32,
    pub template_digest: String,
    pub kernel_digest: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    /// Size of the image's disk; sandboxes with larger disks grow theirs after the restore.
    pub disk_mib: u32,
    pub accel: String,
    /// The VM has a network card (its device set differs from one without).
    #[serde(default)]
    pub network: bool,
}

impl ImageKey {
    /// The key for sandboxes of `tpl` with `resources`.
    pub fn new(
        tpl: &TemplateInfo,
        resources: &Resources,
        accel: space_vmm::Accel,
        network: bool,
    ) -> ImageKey {
        ImageKey {
            format: IMAGE_FORMAT,
            template_digest: tpl.digest.clone(),
            kernel_digest: tpl.kernel_digest.clone(),
            vcpus: resources.vcpus,
            memory_mib: resources.memory_mib,
            disk_mib: tpl.default_resources.disk_mib.min(resources.disk_mib),
            accel: accel.to_string(),
            network,
        }
    }

    /// Content address: sha256 of the canonical JSON.
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(json))
    }
}

/// Metadata of a stored image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    pub digest: String,
    pub key: ImageKey,
    pub created_at_ms: i64,
    /// How long the one boot took, spawn to daemon ready.
    pub boot_ms: u64,
    /// Size of the device state.
    pub state_bytes: u64,
}

impl Artifact for ImageInfo {
    const META_FILE: &'static str = "image.json";
    const KIND: &'static str = "memory image";
    fn digest(&self) -> &str {
        &self.digest
    }
}

/// A stored image and its files.
#[derive(Debug, Clone)]
pub struct MemoryImage {
    pub info: ImageInfo,
    pub memory: PathBuf,
    pub state: PathBuf,
    pub disk: PathBuf,
}

impl MemoryImage {
    fn at(dir: &Path, info: ImageInfo) -> MemoryImage {
        MemoryImage {
            info,
            memory: dir.join(MEMORY_FILE),
            state: dir.join(STATE_FILE),
            disk: dir.join(DISK_FILE),
        }
    }

    /// Guest memory for a VM started from this image: the file, mapped copy-on-write.
    pub fn guest_memory(&self) -> GuestMemory {
        GuestMemory::File {
            path: self.memory.clone(),
            shared: false,
        }
    }

    /// The state a VM started from this image loads (a template's: never sealed).
    pub(crate) fn saved_state(&self) -> crate::vm_start::SavedState<'_> {
        crate::vm_start::SavedState {
            path: &self.state,
            ignore_shared: true,
            paused: false,
            open: None,
        }
    }
}

/// The image store: `<store>/images/<digest>/`.
pub(crate) fn image_dir(store: &space_storage::Store) -> CasDir<ImageInfo> {
    CasDir::new(store.root().join("images"))
}

/// Removes the memory images of template `template_digest` (every shape); how many. A VM
/// started from one keeps its mapping (the file goes when the last one closes it).
pub(crate) fn remove_images_of(
    store: &space_storage::Store,
    template_digest: &str,
) -> Result<usize, space_storage::StorageError> {
    let cas = image_dir(store);
    let mut removed = 0;
    for info in cas.list()? {
        if info.key.template_digest == template_digest && cas.remove(&info.digest)? {
            removed += 1;
        }
    }
    Ok(removed)
}

/// What building an image needs from the node.
pub(crate) struct ImageBuild<'a> {
    pub key: &'a ImageKey,
    pub kernel: &'a KernelBundleInfo,
    pub template_image: &'a Path,
    /// The template: its default user (the image VM is configured like a sandbox), and
    /// its start command, started and found ready before the image is saved.
    pub template: &'a TemplateInfo,
    /// Where the start command's progress goes (a build's log); the node's log otherwise.
    pub log: Option<Log>,
    pub run_dir: PathBuf,
    pub vm_name: String,
    pub cfg: &'a crate::NodeConfig,
    pub accel: space_vmm::Accel,
    pub nm: Arc<dyn space_node_manager::NodeManager>,
    pub store: space_storage::Store,
    /// Network namespace for the image VM when sandboxes have a network card (the image
    /// must have the same devices as the VMs restored from it).
    pub netns: Option<String>,
}

/// Returns the image for `build.key`, building it (once, however many callers ask at the
/// same time) if the store does not have it.
pub(crate) async fn get_or_build(build: ImageBuild<'_>) -> Result<MemoryImage, NodeError> {
    let cas = image_dir(&build.store);
    let digest = build.key.digest();
    if let Some(info) = cas
        .get(&digest)
        .map_err(|e| NodeError::Internal(format!("cannot read memory image: {e}")))?
    {
        return Ok(MemoryImage::at(&cas.entry_dir(&digest), info));
    }
    // The per-digest lock is a blocking flock, and the build itself is async: run the wait
    // and the build on a blocking thread that drives the build on this runtime.
    let handle = tokio::runtime::Handle::current();
    let entry = cas.entry_dir(&digest);
    let info = {
        let build = OwnedBuild::from(&build);
        let digest = digest.clone();
        tokio::task::spawn_blocking(move || {
            cas.build_or_wait(&digest, |staging| {
                handle.block_on(build.run(&digest, staging))
            })
        })
        .await
        .map_err(|e| NodeError::Internal(format!("image build task: {e}")))??
    };
    Ok(MemoryImage::at(&entry, info))
}

/// [`ImageBuild`] with owned fields, to move onto the blocking thread.
struct OwnedBuild {
    key: ImageKey,
    kernel: KernelBundleInfo,
    template_image: PathBuf,
    template: TemplateInfo,
    log: Option<Log>,
    run_dir: PathBuf,
    vm_name: String,
    ready_timeout: Duration,
    tcg_tb_size_mib: Option<u32>,
    accel: space_vmm::Accel,
    nm: Arc<dyn space_node_manager::NodeManager>,
    store: space_storage::Store,
    netns: Option<String>,
}

impl From<&ImageBuild<'_>> for OwnedBuild {
    fn from(b: &ImageBuild<'_>) -> Self {
        OwnedBuild {
            key: b.key.clone(),
            kernel: b.kernel.clone(),
            template_image: b.template_image.to_owned(),
            template: b.template.clone(),
            log: b.log.clone(),
            run_dir: b.run_dir.clone(),
            vm_name: b.vm_name.clone(),
            ready_timeout: Duration::from_secs(b.cfg.ready_timeout_secs),
            tcg_tb_size_mib: b.cfg.tcg_tb_size_mib,
            accel: b.accel,
            nm: b.nm.clone(),
            store: b.store.clone(),
            netns: b.netns.clone(),
        }
    }
}

impl OwnedBuild {
    /// Boots a VM whose RAM is `staging/memory` (shared), waits for its daemon, and saves
    /// its device state and disk. The staging directory becomes the image.
    async fn run(&self, digest: &str, staging: &Path) -> Result<ImageInfo, NodeError> {
        let started = Instant::now();
        let disk = staging.join(DISK_FILE);
        self.nm.clone_disk(
            &self.store,
            &self.template_image,
            &disk,
            self.key.disk_mib,
            ExistingDisk::Refuse,
        )?;
        let cfg = VmConfig {
            name: self.vm_name.clone(),
            vcpus: self.key.vcpus,
            memory_mib: self.key.memory_mib,
            kernel: self.kernel.vmlinuz.clone(),
            initrd: self.kernel.initramfs.clone(),
            cmdline: space_images::kernel_cmdline(),
            root_disk: disk,
            run_dir: self.run_dir.clone(),
            accel: self.accel,
            tcg_tb_size_mib: self.tcg_tb_size_mib,
            memory: GuestMemory::File {
                path: staging.join(MEMORY_FILE),
                shared: true,
            },
            restore: None,
            network: match &self.netns {
                Some(netns) => Some(self.nm.ensure_vm_network(netns)?),
                None => None,
            },
        };
        tracing::info!(digest, vm = %self.vm_name, "building memory image (one boot)");
        let launched = self.nm.launch_vm(&cfg).await;
        let result = match &launched {
            Ok(vm) => self.save(vm, staging, started).await,
            Err(_) => Err(NodeError::Internal("image VM did not start".into())),
        };
        if let Ok(vm) = &launched {
            if let Err(e) = self.nm.kill_vm(vm).await {
                tracing::warn!(vm = %self.vm_name, error = %e, "cannot stop image VM");
            }
        }
        if let Some(netns) = &self.netns {
            if let Err(e) = self.nm.remove_vm_network(netns) {
                tracing::warn!(vm = %self.vm_name, error = %e, "cannot remove image VM network");
            }
        }
        launched?;
        if let Err(e) = self.nm.remove_run_dir(&self.run_dir) {
            tracing::warn!(vm = %self.vm_name, error = %e, "cannot remove image VM run directory");
        }
        let (boot_ms, state_bytes) = result?;
        // The RAM reached the file through the page cache; make it durable before the image
        // is published.
        let memory = staging.join(MEMORY_FILE);
        std::fs::File::open(&memory)
            .and_then(|f| f.sync_all())
            .map_err(|e| NodeError::Internal(format!("cannot sync {}: {e}", memory.display())))?;
        tracing::info!(
            digest,
            boot_ms,
            state_bytes,
            total_ms = started.elapsed().as_millis() as u64,
            "memory image built"
        );
        Ok(ImageInfo {
            digest: digest.to_owned(),
            key: self.key.clone(),
            created_at_ms: crate::sandbox_manager::now_ms(),
            boot_ms,
            state_bytes,
        })
    }

    async fn save(
        &self,
        vm: &Vm,
        staging: &Path,
        started: Instant,
    ) -> Result<(u64, u64), NodeError> {
        let guest = crate::vm_start::connect_ready(vm, self.ready_timeout).await?;
        // Grow the file system now, once, rather than online in every sandbox (slow under
        // TCG); env, hostname and clock are set again in each sandbox.
        let config = space_guest_proto::GuestConfig {
            hostname: IMAGE_HOSTNAME.to_owned(),
            env: Default::default(),
            default_user: self.template.default_user.clone(),
            default_workdir: None,
            resize_root: true,
            time_unix_ms: crate::sandbox_manager::now_ms(),
            network: None,
            trusted_ca_pem: None,
        };
        guest
            .with_timeouts(self.ready_timeout, self.ready_timeout)
            .configure(&config)
            .await?;
        guest.health().await?;
        if let Some(start) = &self.template.start {
            let log = self.log.clone().unwrap_or_else(|| node_log(&self.vm_name));
            crate::template_start::start_and_wait_ready(
                &guest,
                start,
                &self.template.env,
                self.template.workdir.as_deref(),
                &log,
            )
            .await
            .map_err(|e| NodeError::TemplateStartFailed(e.0))?;
        }
        let boot_ms = started.elapsed().as_millis() as u64;
        // Close the channel before saving: a restored VM starts with no host connected and
        // the daemon waits for a fresh handshake.
        drop(guest);
        // Restored VMs must not start in the middle of tearing down this session.
        crate::vm_start::park(vm).await;
        // A template's image: shared by every tenant, never sealed.
        let report = crate::sealing::save_state(
            vm,
            &staging.join(STATE_FILE),
            None,
            crate::sealing::StateForm::Raw,
            SaveOptions {
                ignore_shared: true,
                live: false,
                timeout: SAVE_TIMEOUT,
                ..Default::default()
            },
        )
        .await?
        .finish()
        .await?;
        Ok((boot_ms, report.bytes))
    }
}

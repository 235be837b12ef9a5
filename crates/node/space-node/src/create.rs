//! Creating sandboxes, fastest way first: a warm pool member, else a restore from the
//! template's memory image (built once on demand), else a cold boot. And the background
//! task that keeps the warm pool filled.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_core::template::TemplateInfo;
use space_core::{Resources, SandboxEvent, SandboxState};
use space_guest_client::GuestClient;
use space_guest_proto::GuestConfig;
use space_storage::{ExistingDisk, SANDBOX_DISK_FILE};
use space_vmm::{GuestMemory, Vm, VmConfig};

use crate::image::{self, ImageBuild, ImageKey, MemoryImage};
use crate::pool::{self, Member};
use crate::sandbox_manager::{internal, now_ms, Inner};
use crate::settings::Inherited;
use crate::vm_start::{connect_ready, connect_restored, make_unique_and_configure};
use crate::{CreateSandbox, Node, NodeError, SandboxRecord, VmOrigin};

/// Fills in flight at once (each costs a QEMU start and a restore; more would only slow
/// the creates that are waiting).
const MAX_PARALLEL_FILLS: usize = 2;
/// How often the filler looks at memory pressure even when nothing woke it.
const FILL_TICK: Duration = Duration::from_millis(500);
/// Pause after a failed fill before trying again.
const FILL_BACKOFF: Duration = Duration::from_secs(2);

/// The certificate of a throwaway CA, for warming pool members up; `None` if it cannot be
/// made (the warm-up then skips the trust store).
fn warm_up_ca() -> Option<String> {
    space_net::ca::SandboxCa::generate("SPACE pool warm-up")
        .map(|ca| ca.cert_pem().to_owned())
        .map_err(|e| tracing::warn!(error = %e, "cannot make the warm-up CA"))
        .ok()
}

/// How a new sandbox's VM came up.
pub(crate) struct Started {
    pub vm: Vm,
    pub guest: GuestClient,
    pub vm_name: Option<String>,
    pub origin: VmOrigin,
}

/// On failure: the error and the VM to kill, if one was started.
pub(crate) type StartError = (NodeError, Option<Vm>);

impl Node {
    /// Creates a sandbox and returns when its daemon is ready (`running`), or fails it.
    pub async fn create_sandbox(&self, req: CreateSandbox) -> Result<SandboxRecord, NodeError> {
        self.create_sandbox_for(req, None).await
    }

    /// Creates a sandbox, a builder of template build `build` if one is named (see
    /// [`SandboxRecord::template_build`]).
    pub(crate) async fn create_sandbox_for(
        &self,
        req: CreateSandbox,
        build: Option<&str>,
    ) -> Result<SandboxRecord, NodeError> {
        let started = Instant::now();
        let tpl = self
            .template_to_create(&req.template, req.template_digest.as_deref())
            .await?;
        let resources = req.resources.resolve(tpl.default_resources);
        resources
            .validate(tpl.image_size_mib)
            .map_err(NodeError::Capacity)?;
        let mut record = SandboxRecord::new(
            req.id.clone(),
            tpl.name.clone(),
            tpl.digest.clone(),
            resources,
            SandboxState::Creating,
        );
        record.created_at_ms = now_ms();
        record.template_build = build.map(str::to_owned);
        let inherited = Inherited {
            egress: self.inner.cfg.egress.clone(),
            ..Inherited::default()
        };
        crate::settings::apply(
            &req.settings,
            inherited,
            &self.inner.egress_ceiling,
            &mut record,
        )?;
        let op = self.inner.admit(record)?;
        let _guard = op.lock().await;
        match self
            .materialise(&req, &tpl, &resources, build.is_none())
            .await
        {
            Ok(s) => {
                let latency = started.elapsed().as_millis() as u64;
                let pid = s.vm.pid();
                let vm = Arc::new(s.vm);
                let rec = self.inner.transition(&req.id, SandboxEvent::Ready, |r| {
                    r.create_latency_ms = Some(latency);
                    r.vmm_pid = Some(pid);
                    r.vm_name = s.vm_name;
                    r.origin = s.origin;
                })?;
                self.attach(&req.id, vm, Some(s.guest));
                tracing::info!(id = %req.id, latency_ms = latency, origin = ?rec.origin, "sandbox ready");
                Ok(rec)
            }
            Err((err, vm)) => {
                let reason = err.to_string();
                self.inner.fail(&req.id, vm.as_ref(), &reason).await;
                Err(err)
            }
        }
    }

    /// Brings up the VM of a new sandbox: pool member, memory image, or cold boot.
    async fn materialise(
        &self,
        req: &CreateSandbox,
        tpl: &TemplateInfo,
        resources: &Resources,
        // A build's builder boots: its template is used once, not worth a memory image or
        // a pool.
        from_memory: bool,
    ) -> Result<Started, StartError> {
        let config = GuestConfig {
            resize_root: resources.disk_mib > tpl.image_size_mib,
            ..self
                .inner
                .guest_config(&req.id, tpl)
                .map_err(|e| (e, None))?
        };
        let disk = self
            .inner
            .store
            .sandbox_dir(&req.id)
            .join(SANDBOX_DISK_FILE);
        if from_memory
            && self.inner.cfg.memory_images
            && resources.disk_mib >= tpl.default_resources.disk_mib
        {
            let key = ImageKey::new(
                tpl,
                resources,
                self.inner.accel,
                self.inner.cfg.sandbox_network,
            );
            // The image's file system already fills its disk; grow only beyond it.
            let config = &GuestConfig {
                resize_root: resources.disk_mib > key.disk_mib,
                ..config.clone()
            };
            self.inner.pool.want(&key, tpl, resources);
            if let Some(member) = self.inner.pool.take(&key) {
                let name = member.name.clone();
                match self.claim(member, &disk, resources, config).await {
                    Ok(started) => return Ok(started),
                    // A broken member is not the request's fault: fall through to a restore.
                    Err(e) => {
                        tracing::warn!(id = %req.id, member = %name, error = %e, "pool member unusable; restoring from the image instead")
                    }
                }
            }
            match self.template_image(&key, tpl, None).await {
                Ok(image) => {
                    let run_dir = self.inner.vm_run_dir(req.id.as_str());
                    return self
                        .start_from_image(
                            req.id.as_str(),
                            &run_dir,
                            &image,
                            &disk,
                            resources,
                            config,
                        )
                        .await
                        .map(|(vm, guest)| Started {
                            vm,
                            guest,
                            vm_name: None,
                            origin: VmOrigin::TemplateImage { pooled: false },
                        });
                }
                // The start command would fail a boot the same way: say so now.
                Err(e @ NodeError::TemplateStartFailed(_)) => return Err((e, None)),
                Err(e) => {
                    tracing::warn!(id = %req.id, error = %e, "no memory image; booting instead")
                }
            }
        }
        self.boot(
            req.id.as_str(),
            tpl,
            resources,
            &disk,
            ExistingDisk::Refuse,
            &config,
            from_memory,
        )
        .await
        .map(|(vm, guest)| Started {
            vm,
            guest,
            vm_name: None,
            origin: VmOrigin::Boot,
        })
    }

    /// Clones the template disk (unless `existing` is `Replace` and the disk is to be
    /// reused as is, see [`Node::start`]), boots the VM, connects and configures; then, with
    /// `with_start`, starts the template's start command and waits until it is ready (a
    /// build's builder never runs it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn boot(
        &self,
        vm_name: &str,
        tpl: &TemplateInfo,
        resources: &Resources,
        disk: &Path,
        existing: ExistingDisk,
        config: &GuestConfig,
        with_start: bool,
    ) -> Result<(Vm, GuestClient), StartError> {
        let inner = &self.inner;
        let kernel = inner.kernel(tpl).map_err(|e| (e, None))?;
        if existing == ExistingDisk::Refuse {
            let image = inner.store.templates().image_path(tpl);
            inner
                .nm
                .clone_disk(&inner.store, &image, disk, resources.disk_mib, existing)
                .map_err(|e| (NodeError::from(e), None))?;
        }
        let cfg = VmConfig {
            name: vm_name.to_owned(),
            vcpus: resources.vcpus,
            memory_mib: resources.memory_mib,
            kernel: kernel.vmlinuz.clone(),
            initrd: kernel.initramfs.clone(),
            cmdline: space_images::kernel_cmdline(),
            root_disk: disk.to_owned(),
            run_dir: inner.vm_run_dir(vm_name),
            accel: inner.accel,
            tcg_tb_size_mib: inner.cfg.tcg_tb_size_mib,
            memory: GuestMemory::Anonymous,
            restore: None,
            network: inner.vm_network(vm_name).map_err(|e| (e, None))?,
        };
        let vm = inner
            .nm
            .launch_vm(&cfg)
            .await
            .map_err(|e| (NodeError::from(e), None))?;
        let ready = async {
            let guest = connect_ready(&vm, inner.ready_timeout()).await?;
            // The clock is read now, not before boot: the guest sets its clock from it.
            let config = GuestConfig {
                time_unix_ms: now_ms(),
                ..config.clone()
            };
            guest.configure(&config).await?;
            if let (true, Some(start)) = (with_start, &tpl.start) {
                // The sandbox's env is configured already; the template's is in it.
                crate::template_start::start_and_wait_ready(
                    &guest,
                    start,
                    &Default::default(),
                    tpl.workdir.as_deref(),
                    &image::node_log(vm_name),
                )
                .await
                .map_err(|e| NodeError::TemplateStartFailed(e.0))?;
            }
            Ok::<_, NodeError>(guest)
        };
        match ready.await {
            Ok(guest) => Ok((vm, guest)),
            Err(e) => Err((e, Some(vm))),
        }
    }

    /// Restores a VM from a memory image onto a reflink of the image's disk, then makes it
    /// unique and configures it.
    pub(crate) async fn start_from_image(
        &self,
        vm_name: &str,
        run_dir: &Path,
        image: &MemoryImage,
        disk: &Path,
        resources: &Resources,
        config: &GuestConfig,
    ) -> Result<(Vm, GuestClient), StartError> {
        let vm = self
            .restore_image_vm(vm_name, run_dir, image, disk, resources.disk_mib)
            .await
            .map_err(|e| (e, None))?;
        let ready = async {
            self.grow_disk(&vm, image, resources).await?;
            let guest = connect_restored(&vm, self.inner.ready_timeout()).await?;
            make_unique_and_configure(&guest, config).await?;
            Ok::<_, NodeError>(guest)
        };
        match ready.await {
            Ok(guest) => Ok((vm, guest)),
            Err(e) => Err((e, Some(vm))),
        }
    }

    /// Launches a VM from `image` (no connection yet).
    async fn restore_image_vm(
        &self,
        vm_name: &str,
        run_dir: &Path,
        image: &MemoryImage,
        disk: &Path,
        disk_mib: u32,
    ) -> Result<Vm, NodeError> {
        let inner = &self.inner;
        inner.nm.clone_disk(
            &inner.store,
            &image.disk,
            disk,
            disk_mib,
            ExistingDisk::Refuse,
        )?;
        let tpl = inner
            .store
            .templates()
            .lookup_digest(&image.info.key.template_digest)
            .map_err(|e| internal("cannot read template", e))?
            .ok_or_else(|| NodeError::Internal("template of memory image is gone".into()))?;
        let kernel = inner.kernel(&tpl)?;
        let cfg = VmConfig {
            name: vm_name.to_owned(),
            vcpus: image.info.key.vcpus,
            memory_mib: image.info.key.memory_mib,
            kernel: kernel.vmlinuz.clone(),
            initrd: kernel.initramfs.clone(),
            cmdline: space_images::kernel_cmdline(),
            root_disk: disk.to_owned(),
            run_dir: run_dir.to_owned(),
            accel: inner.accel,
            tcg_tb_size_mib: inner.cfg.tcg_tb_size_mib,
            memory: image.guest_memory(),
            restore: Some(space_vmm::RestoreFrom {
                ignore_shared: true,
            }),
            network: inner.vm_network(vm_name)?,
        };
        let vm = inner.nm.launch_vm(&cfg).await?;
        crate::vm_start::load_saved_state(inner, vm, image.saved_state()).await
    }

    /// A sandbox asked for a larger disk than the image's: the file was grown when cloned;
    /// tell the guest's block device (the configure that follows grows the filesystem).
    async fn grow_disk(
        &self,
        vm: &Vm,
        image: &MemoryImage,
        resources: &Resources,
    ) -> Result<(), NodeError> {
        if resources.disk_mib > image.info.key.disk_mib {
            vm.resize_root_disk(u64::from(resources.disk_mib) << 20)
                .await?;
        }
        Ok(())
    }

    /// Turns a pool member into the sandbox: moves its disk under the sandbox, resumes it,
    /// makes it unique and configures it.
    async fn claim(
        &self,
        member: Member,
        disk: &Path,
        resources: &Resources,
        config: &GuestConfig,
    ) -> Result<Started, NodeError> {
        let inner = &self.inner;
        let t0 = Instant::now();
        let result = async {
            inner.nm.link_disk(&member.disk, disk)?;
            if resources.disk_mib > member.image.info.key.disk_mib {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(disk)
                    .map_err(|e| internal("cannot open disk", e))?;
                f.set_len(u64::from(resources.disk_mib) << 20)
                    .map_err(|e| internal("cannot grow disk", e))?;
            }
            let t_disk = t0.elapsed();
            member.vm.resume().await?;
            self.grow_disk(&member.vm, &member.image, resources).await?;
            let t_resume = t0.elapsed();
            let guest = connect_ready(&member.vm, inner.ready_timeout()).await?;
            let t_connect = t0.elapsed();
            make_unique_and_configure(&guest, config).await?;
            tracing::debug!(
                member = %member.name,
                disk_ms = t_disk.as_millis() as u64,
                resume_ms = t_resume.as_millis() as u64,
                connect_ms = t_connect.as_millis() as u64,
                ready_ms = t0.elapsed().as_millis() as u64,
                "pool member claimed"
            );
            Ok::<_, NodeError>(guest)
        }
        .await;
        // The member's own disk path stays (QEMU reopens the disk by it); it goes when the
        // sandbox's VM does (see `Node::discard_current_vm` and teardown).
        match result {
            Ok(guest) => Ok(Started {
                vm: member.vm,
                guest,
                vm_name: Some(member.name),
                origin: VmOrigin::TemplateImage { pooled: true },
            }),
            Err(e) => {
                inner.discard_member(member).await;
                Err(e)
            }
        }
    }

    /// The memory image for `key`, built (once) if missing.
    pub(crate) async fn template_image(
        &self,
        key: &ImageKey,
        tpl: &TemplateInfo,
        log: Option<crate::template_builds::Log>,
    ) -> Result<MemoryImage, NodeError> {
        let inner = &self.inner;
        let kernel = inner.kernel(tpl)?;
        let template_image = inner.store.templates().image_path(tpl);
        let vm_name = format!("img-{}", &key.digest()[..20]);
        image::get_or_build(ImageBuild {
            key,
            kernel: &kernel,
            template_image: &template_image,
            template: tpl,
            log,
            run_dir: inner.vm_run_dir(&vm_name),
            netns: inner
                .cfg
                .sandbox_network
                .then(|| inner.netns_name(&vm_name)),
            vm_name,
            cfg: &inner.cfg,
            accel: inner.accel,
            nm: inner.nm.clone(),
            store: inner.store.clone(),
        })
        .await
    }

    /// What the warm pool holds.
    pub fn pool_status(&self) -> Vec<crate::PoolShape> {
        self.inner.pool.status()
    }

    /// Starts the background work of the node: the scheduler, the metrics sampler, the
    /// pool filler.
    pub(crate) fn start_background(&self) {
        self.start_scheduler();
        self.start_metrics();
        self.start_publisher();
        self.start_warming();
        if self.inner.pool.target() == 0 || !self.inner.cfg.memory_images {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let task = tokio::spawn(fill_pool(weak));
        self.inner
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task.abort_handle());
    }

    /// Makes one pool member of `key`.
    async fn new_member(
        &self,
        key: &ImageKey,
        tpl: &TemplateInfo,
        resources: &Resources,
    ) -> Result<Member, NodeError> {
        let image = self.template_image(key, tpl, None).await?;
        let name = format!(
            "{}{}",
            pool::MEMBER_PREFIX,
            space_core::SandboxId::generate()
                .as_str()
                .trim_start_matches(space_core::SandboxId::PREFIX)
        );
        let run_dir = self.inner.vm_run_dir(&name);
        let disk = self.inner.pool_dir().join(&name).join(SANDBOX_DISK_FILE);
        let vm = self
            .restore_image_vm(&name, &run_dir, &image, &disk, image.info.key.disk_mib)
            .await;
        let vm = match vm {
            Ok(vm) => vm,
            Err(e) => {
                let _ = self.inner.nm.remove_run_dir(&run_dir);
                self.inner.drop_vm_network(&name);
                let _ = self
                    .inner
                    .nm
                    .remove_run_dir(&self.inner.pool_dir().join(&name));
                return Err(e);
            }
        };
        // Under TCG every code path a VM runs for the first time is translated first (tens
        // to hundreds of ms for identity and configure: RNG ioctls, ext4 writes). So the
        // member runs the very requests a claim sends, once, while nobody waits; a claim
        // then finds them translated. It also leaves the member unique already (its own
        // RNG seed). Then it waits paused (no CPU) with no host connected.
        let warm = async {
            let guest = connect_restored(&vm, self.inner.ready_timeout()).await?;
            let config = GuestConfig {
                hostname: name.clone(),
                env: Default::default(),
                default_user: tpl.default_user.clone(),
                default_workdir: tpl.workdir.clone(),
                resize_root: false,
                time_unix_ms: now_ms(),
                network: self.inner.guest_network(),
                // A CA whose key is thrown away at once (nobody can sign with it): the
                // member runs the trust-store code a claim runs (see above), and the claim
                // replaces it with the sandbox's own.
                trusted_ca_pem: self.inner.cfg.sandbox_network.then(warm_up_ca).flatten(),
            };
            make_unique_and_configure(&guest, &config).await?;
            drop(guest);
            crate::vm_start::park(&vm).await;
            vm.pause().await?;
            Ok::<_, NodeError>(())
        };
        if let Err(e) = warm.await {
            let console =
                space_vmm::console_tail(&vm.paths().console_log, 2048).unwrap_or_default();
            tracing::warn!(member = %name, error = %e, %console, "pool member did not warm up");
            self.inner.discard_vm(&vm, &run_dir).await;
            let _ = self
                .inner
                .nm
                .remove_run_dir(&self.inner.pool_dir().join(&name));
            return Err(e);
        }
        let _ = resources;
        Ok(Member {
            name,
            vm,
            disk,
            run_dir,
            image,
        })
    }
}

/// Keeps the pool at its target while memory allows; sheds members under memory pressure.
async fn fill_pool(weak: std::sync::Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let node = Node {
            inner: inner.clone(),
        };
        let low_memory =
            pool::available_memory_percent().is_some_and(|p| p < pool::LOW_MEMORY_PERCENT);
        if low_memory {
            if let Some(member) = inner.pool.evict_one() {
                tracing::warn!(member = %member.name, "host memory low: shedding a pool member");
                inner.discard_member(member).await;
                continue;
            }
        } else if let Some((key, tpl, resources)) = inner.pool.next_fill(MAX_PARALLEL_FILLS) {
            let node = node.clone();
            tokio::spawn(async move {
                let member = node.new_member(&key, &tpl, &resources).await;
                let failed = member.is_err();
                match member {
                    Ok(m) => {
                        tracing::debug!(member = %m.name, template = %tpl.name, "pool member ready");
                        if let Some(late) = node.inner.pool.filled(&key, Some(m)) {
                            node.inner.discard_member(late).await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(template = %tpl.name, error = %e, "cannot make pool member");
                        tokio::time::sleep(FILL_BACKOFF).await;
                        node.inner.pool.filled(&key, None);
                    }
                }
                node.inner.pool.wake.notify_one();
                let _ = failed;
            });
            continue;
        }
        drop(node);
        // Holding `inner` while waiting is fine: shutdown aborts this task.
        let _ = tokio::time::timeout(FILL_TICK, inner.pool.wake.notified()).await;
    }
}

impl Inner {
    /// Run directory of a VM.
    pub(crate) fn vm_run_dir(&self, vm_name: &str) -> PathBuf {
        self.run_root.join(vm_name)
    }

    /// Where pool members keep their disks until claimed.
    pub(crate) fn pool_dir(&self) -> PathBuf {
        self.store.root().join("pool")
    }

    /// How long a starting VM's daemon has to answer.
    pub(crate) fn ready_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.ready_timeout_secs)
    }

    /// The kernel bundle a template boots with.
    pub(crate) fn kernel(
        &self,
        tpl: &TemplateInfo,
    ) -> Result<space_storage::KernelBundleInfo, NodeError> {
        self.store
            .kernels()
            .get(&tpl.kernel_digest)
            .map_err(|e| internal("cannot read kernel bundle", e))?
            .ok_or_else(|| {
                NodeError::Internal(format!(
                    "kernel bundle {} of template '{}' is missing; rebuild the template",
                    tpl.kernel_digest, tpl.name
                ))
            })
    }

    /// Kills a VM that belongs to no sandbox and removes its run directory.
    pub(crate) async fn discard_vm(&self, vm: &Vm, run_dir: &Path) {
        if let Err(e) = self.nm.kill_vm(vm).await {
            tracing::warn!(vm = %vm.name(), error = %e, "cannot kill VM");
        }
        if let Err(e) = self.nm.remove_run_dir(run_dir) {
            tracing::warn!(vm = %vm.name(), error = %e, "cannot remove VM run directory");
        }
        self.drop_vm_network(vm.name());
    }

    /// Kills a pool member and removes its files.
    pub(crate) async fn discard_member(&self, member: Member) {
        self.discard_vm(&member.vm, &member.run_dir).await;
        if let Some(dir) = member.disk.parent() {
            let _ = self.nm.remove_run_dir(dir);
        }
    }
}

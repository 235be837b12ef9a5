//! Templates and kernel bundles through the object store, by content digest.
//!
//! **Publishing.** A cluster's node (`NodeConfig::publish_templates`) publishes every template it has, and the
//! kernel bundle each boots, in the background (at start, then every
//! [`PUBLISH_INTERVAL`]; a digest known to be there is not looked at again):
//!
//! ```text
//! kernels/<digest>/vmlinuz, kernels/<digest>/initramfs.cpio.zst, then kernels/<digest>/kernel.json
//! templates/<digest>/rootfs.ext4.zst,                            then templates/<digest>/template.json
//! template-names/<name>                                          the digest the name means
//! ```
//!
//! A manifest (`kernel.json`, `template.json`) is written only once every object it names is
//! stored, and records each one's size and SHA-256: a manifest that exists describes a whole
//! artifact, and a half-published one is invisible. Content addressing makes publishing
//! idempotent: two nodes publishing one digest write the same thing.
//!
//! **Fetching.** A node asked for a template it lacks — a create placed on it, a suspended
//! sandbox resumed on it — fetches it by digest: the manifest, then the kernel bundle it
//! boots (the same way), then its image, downloaded and verified, decompressed (bounded by
//! the size the manifest records, zero blocks left as holes) into the sandbox manager's
//! `incoming/`, and installed by the node manager, which copies it into the store's root-owned
//! templates and checks it against the template's own image digest. Concurrent requests for
//! one digest on a node wait for one fetch: a burst of resumes of one template is one
//! download and one installation.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use space_core::template::{validate_template_name, TemplateInfo};
use space_objects::{Artifact, ObjectKey, Objects};
use space_storage::{KernelMeta, IMAGE_FILE, INITRAMFS_FILE, VMLINUZ_FILE};

use crate::packing::{compress_file, decompress_sparse, UnpackError};
use crate::sandbox_manager::internal;
use crate::{Node, NodeError};

/// How often a node looks for templates of its own to publish.
pub const PUBLISH_INTERVAL: Duration = Duration::from_secs(60);
/// Version of the manifests.
const MANIFEST_FORMAT: u32 = 1;
/// Largest manifest read.
const MAX_MANIFEST: u64 = 64 * 1024;
/// Largest kernel image and initramfs fetched.
const MAX_VMLINUZ: u64 = 128 << 20;
const MAX_INITRAMFS: u64 = 1 << 30;
/// Object names inside a template's and a kernel bundle's prefix.
const IMAGE_OBJECT: &str = "rootfs.ext4.zst";
const TEMPLATE_MANIFEST: &str = "template.json";
const VMLINUZ_OBJECT: &str = "vmlinuz";
const INITRAMFS_OBJECT: &str = "initramfs.cpio.zst";
const KERNEL_MANIFEST: &str = "kernel.json";

/// `templates/<digest>/template.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateManifest {
    format: u32,
    template: TemplateInfo,
    /// `rootfs.ext4.zst`: the image, compressed.
    image: Artifact,
}

/// `kernels/<digest>/kernel.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelManifest {
    format: u32,
    kernel: KernelMeta,
    vmlinuz: Artifact,
    /// `initramfs.cpio.zst`: the initramfs, compressed.
    initramfs: Artifact,
}

/// `template-names/<name>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameManifest {
    format: u32,
    digest: String,
}

/// What a node knows of the object store's templates and kernel bundles.
#[derive(Default)]
pub(crate) struct Published {
    /// Digests (templates and kernel bundles) known to be published.
    known: Mutex<HashSet<String>>,
    /// One fetch per digest (or stored snapshot, `crate::stored`) at a time: the others
    /// wait for it.
    pub(crate) fetching: crate::coalesce::Coalesce,
    /// One publishing pass at a time.
    publishing: tokio::sync::Mutex<()>,
    /// Templates and kernel bundles this node fetched since it started.
    fetched: AtomicU64,
}

impl Published {
    fn is_known(&self, digest: &str) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(digest)
    }

    fn learn(&self, digest: &str) {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_owned());
    }
}

fn key(parts: &[&str]) -> Result<ObjectKey, NodeError> {
    ObjectKey::join(parts).map_err(|e| NodeError::Invalid(e.to_string()))
}

fn name_key(name: &str) -> Result<ObjectKey, NodeError> {
    ObjectKey::template_name(name).map_err(|e| NodeError::Invalid(e.to_string()))
}

fn manifest_json<T: Serialize>(manifest: &T) -> Result<Bytes, NodeError> {
    serde_json::to_vec_pretty(manifest)
        .map(Bytes::from)
        .map_err(|e| internal("manifest", e))
}

/// A manifest as stored, or why it cannot be used.
fn parse_manifest<T: for<'de> Deserialize<'de>>(
    key: &ObjectKey,
    bytes: &[u8],
) -> Result<T, NodeError> {
    serde_json::from_slice(bytes)
        .map_err(|e| NodeError::Storage(format!("published manifest {key} is malformed: {e}")))
}

/// `artifact` is the object `expected` (a manifest naming any other object is refused).
fn check_names(artifact: &Artifact, expected: &ObjectKey) -> Result<(), NodeError> {
    if artifact.key == expected.as_str() {
        Ok(())
    } else {
        Err(NodeError::Storage(format!(
            "a published manifest names {} where {expected} belongs",
            artifact.key.chars().take(120).collect::<String>()
        )))
    }
}

impl Node {
    /// The template a create names: build `digest` if given, else what `name` means here,
    /// else what it means in the object store; fetched if this node lacks it.
    pub(crate) async fn template_to_create(
        &self,
        name: &str,
        digest: Option<&str>,
    ) -> Result<TemplateInfo, NodeError> {
        let digest = match digest {
            Some(d) => d.to_owned(),
            None => match self.template(name) {
                Err(NodeError::TemplateNotFound(_)) => match self.published_template(name).await? {
                    Some(t) => t.digest,
                    None => return Err(NodeError::TemplateNotFound(name.to_owned())),
                },
                found => return found,
            },
        };
        let tpl = self.ensure_template(&digest, name).await?;
        Ok(TemplateInfo {
            name: name.to_owned(),
            ..tpl
        })
    }

    /// Publishes this node's templates in the background, if it has an object store.
    pub(crate) fn start_publisher(&self) {
        if self.inner.objects.is_none() || !self.inner.cfg.publish_templates {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(PUBLISH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                if let Err(e) = (Node { inner }).publish_templates().await {
                    tracing::warn!(error = %e, "publishing templates failed; tried again later");
                }
            }
        });
        self.inner
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task.abort_handle());
    }

    /// Publishes every template of this node that the object store lacks (and the kernel
    /// bundles they boot). Returns how many it published.
    pub async fn publish_templates(&self) -> Result<usize, NodeError> {
        let objects = self.objects()?.clone();
        let published = &self.inner.published;
        let _one_pass = published.publishing.lock().await;
        let mut count = 0;
        for tpl in self.templates()? {
            if published.is_known(&tpl.digest) {
                continue;
            }
            let manifest = key(&["templates", &tpl.digest, TEMPLATE_MANIFEST])?;
            if objects.size(&manifest).await?.is_none() {
                self.publish_kernel(&objects, &tpl.kernel_digest).await?;
                self.publish_template(&objects, &tpl, &manifest).await?;
                count += 1;
            }
            // The name: the last published build of a name is what it means.
            self.publish_template_name(&tpl.name, &tpl.digest).await?;
            published.learn(&tpl.digest);
        }
        Ok(count)
    }

    async fn publish_template(
        &self,
        objects: &Objects,
        tpl: &TemplateInfo,
        manifest: &ObjectKey,
    ) -> Result<(), NodeError> {
        let started = Instant::now();
        let image = self.inner.store.templates().image_path(tpl);
        let scratch = self.scratch_dir(&tpl.digest, "publish")?;
        let packed = scratch.join(IMAGE_OBJECT);
        let result = async {
            blocking_io("compress the template image", {
                let (image, packed) = (image.clone(), packed.clone());
                move || compress_file(&image, &packed)
            })
            .await?;
            let stored = objects
                .put_file(&key(&["templates", &tpl.digest, IMAGE_OBJECT])?, &packed)
                .await?;
            objects
                .put_bytes(
                    manifest,
                    manifest_json(&TemplateManifest {
                        format: MANIFEST_FORMAT,
                        template: tpl.clone(),
                        image: stored.clone(),
                    })?,
                )
                .await?;
            Ok::<_, NodeError>(stored)
        }
        .await;
        let _ = std::fs::remove_dir_all(&scratch);
        let stored = result?;
        tracing::info!(template = %tpl.name, digest = %tpl.digest, bytes = stored.size, ms = started.elapsed().as_millis() as u64, "template published");
        Ok(())
    }

    async fn publish_kernel(&self, objects: &Objects, digest: &str) -> Result<(), NodeError> {
        let published = &self.inner.published;
        if published.is_known(digest) {
            return Ok(());
        }
        let manifest = key(&["kernels", digest, KERNEL_MANIFEST])?;
        if objects.size(&manifest).await?.is_none() {
            let kernels = self.inner.store.kernels();
            let bundle = kernels
                .get(digest)
                .map_err(|e| internal("cannot read kernel bundle", e))?
                .ok_or_else(|| internal("publish", format!("kernel bundle {digest} is missing")))?;
            let meta = kernels
                .artifacts()
                .get(digest)
                .map_err(|e| internal("cannot read kernel bundle", e))?
                .ok_or_else(|| internal("publish", format!("kernel bundle {digest} is missing")))?;
            let scratch = self.scratch_dir(digest, "publish")?;
            let packed = scratch.join(INITRAMFS_OBJECT);
            let result = async {
                blocking_io("compress the initramfs", {
                    let (src, packed) = (bundle.initramfs.clone(), packed.clone());
                    move || compress_file(&src, &packed)
                })
                .await?;
                let vmlinuz = objects
                    .put_file(&key(&["kernels", digest, VMLINUZ_OBJECT])?, &bundle.vmlinuz)
                    .await?;
                let initramfs = objects
                    .put_file(&key(&["kernels", digest, INITRAMFS_OBJECT])?, &packed)
                    .await?;
                objects
                    .put_bytes(
                        &manifest,
                        manifest_json(&KernelManifest {
                            format: MANIFEST_FORMAT,
                            kernel: meta,
                            vmlinuz,
                            initramfs,
                        })?,
                    )
                    .await?;
                Ok::<_, NodeError>(())
            }
            .await;
            let _ = std::fs::remove_dir_all(&scratch);
            result?;
            tracing::info!(digest, "kernel bundle published");
        }
        published.learn(digest);
        Ok(())
    }

    /// The template the object store's `template-names/<name>` means, if there is one (not
    /// fetched: a create placed here fetches it).
    pub async fn published_template(&self, name: &str) -> Result<Option<TemplateInfo>, NodeError> {
        let Some(objects) = self.inner.objects.as_ref() else {
            return Ok(None);
        };
        if !validate_template_name(name) {
            return Ok(None);
        }
        let name_key = name_key(name)?;
        let Some(bytes) = objects.get_manifest(&name_key, MAX_MANIFEST).await? else {
            return Ok(None);
        };
        let named: NameManifest = parse_manifest(&name_key, &bytes)?;
        Ok(self
            .template_manifest(objects, &named.digest)
            .await?
            .map(|m| TemplateInfo {
                name: name.to_owned(),
                ..m.template
            }))
    }

    async fn template_manifest(
        &self,
        objects: &Objects,
        digest: &str,
    ) -> Result<Option<TemplateManifest>, NodeError> {
        space_storage::validate_digest(digest).map_err(|e| NodeError::Invalid(e.to_string()))?;
        let manifest_key = key(&["templates", digest, TEMPLATE_MANIFEST])?;
        let Some(bytes) = objects.get_manifest(&manifest_key, MAX_MANIFEST).await? else {
            return Ok(None);
        };
        let m: TemplateManifest = parse_manifest(&manifest_key, &bytes)?;
        if m.format != MANIFEST_FORMAT
            || m.template.digest != digest
            || !validate_template_name(&m.template.name)
        {
            return Err(NodeError::Storage(format!(
                "published manifest {manifest_key} does not describe template {digest}"
            )));
        }
        check_names(&m.image, &key(&["templates", digest, IMAGE_OBJECT])?)?;
        Ok(Some(m))
    }

    /// Template `digest`: this node's, or fetched from the object store (see the module
    /// docs). `name` is only for messages.
    pub async fn ensure_template(
        &self,
        digest: &str,
        name: &str,
    ) -> Result<TemplateInfo, NodeError> {
        let local = |node: &Node| {
            node.inner
                .store
                .templates()
                .lookup_digest(digest)
                .map_err(|e| internal("cannot read template", e))
        };
        if let Some(tpl) = local(self)? {
            self.mark_template_used(digest);
            return Ok(tpl);
        }
        let not_found = || NodeError::TemplateNotFound(format!("{name} ({digest})"));
        let Some(objects) = self.inner.objects.clone() else {
            return Err(not_found());
        };
        let fetch = async {
            // Whoever went first may have fetched it.
            if let Some(tpl) = local(self)? {
                return Ok(tpl);
            }
            let manifest = self
                .template_manifest(&objects, digest)
                .await?
                .ok_or_else(not_found)?;
            self.ensure_kernel(&objects, &manifest.template.kernel_digest)
                .await?;
            self.fetch_template(&objects, &manifest).await?;
            local(self)?.ok_or_else(|| internal("fetch", "the installed template is not there"))
        };
        let tpl = self.inner.published.fetching.run(digest, fetch).await?;
        self.mark_template_used(digest);
        Ok(tpl)
    }

    async fn fetch_template(
        &self,
        objects: &Objects,
        m: &TemplateManifest,
    ) -> Result<(), NodeError> {
        let started = Instant::now();
        let tpl = &m.template;
        let staged = self.scratch_dir(&tpl.digest, "fetch")?;
        let result = async {
            let packed = staged.join(IMAGE_OBJECT);
            objects
                .get_to_file(&m.image, &packed)
                .await
                .map_err(fetch_error)?;
            let image_len = u64::from(tpl.image_size_mib) << 20;
            blocking_unpack("template image", {
                let (packed, image) = (packed.clone(), staged.join(IMAGE_FILE));
                move || {
                    let n = decompress_sparse(&packed, &image, image_len, true);
                    let _ = std::fs::remove_file(&packed);
                    n
                }
            })
            .await?;
            let (nm, store, tpl2, dir) = (
                self.inner.nm.clone(),
                self.inner.store.clone(),
                tpl.clone(),
                staged.clone(),
            );
            tokio::task::spawn_blocking(move || nm.install_template(&store, &dir, &tpl2, true))
                .await
                .map_err(|e| internal("installing task", e))?
                .map_err(|e| NodeError::Storage(format!("installing template {}: {e}", tpl.digest)))
        }
        .await;
        let _ = std::fs::remove_dir_all(&staged);
        result?;
        self.inner.published.fetched.fetch_add(1, Ordering::Relaxed);
        self.inner.published.learn(&tpl.digest);
        tracing::info!(template = %tpl.name, digest = %tpl.digest, bytes = m.image.size, ms = started.elapsed().as_millis() as u64, "template fetched from the object store");
        Ok(())
    }

    /// Kernel bundle `digest`: this node's, or fetched.
    async fn ensure_kernel(&self, objects: &Objects, digest: &str) -> Result<(), NodeError> {
        let local = |node: &Node| {
            node.inner
                .store
                .kernels()
                .get(digest)
                .map(|k| k.is_some())
                .map_err(|e| internal("cannot read kernel bundle", e))
        };
        if local(self)? {
            return Ok(());
        }
        let fetch = async {
            if local(self)? {
                return Ok(());
            }
            self.fetch_kernel(objects, digest).await
        };
        self.inner.published.fetching.run(digest, fetch).await
    }

    async fn fetch_kernel(&self, objects: &Objects, digest: &str) -> Result<(), NodeError> {
        space_storage::validate_digest(digest).map_err(|e| NodeError::Invalid(e.to_string()))?;
        let manifest_key = key(&["kernels", digest, KERNEL_MANIFEST])?;
        let bytes = objects
            .get_manifest(&manifest_key, MAX_MANIFEST)
            .await?
            .ok_or_else(|| {
                NodeError::Storage(format!("kernel bundle {digest} is not published"))
            })?;
        let m: KernelManifest = parse_manifest(&manifest_key, &bytes)?;
        if m.format != MANIFEST_FORMAT || m.kernel.digest != digest {
            return Err(NodeError::Storage(format!(
                "published manifest {manifest_key} does not describe kernel bundle {digest}"
            )));
        }
        check_names(&m.vmlinuz, &key(&["kernels", digest, VMLINUZ_OBJECT])?)?;
        check_names(&m.initramfs, &key(&["kernels", digest, INITRAMFS_OBJECT])?)?;
        if m.vmlinuz.size > MAX_VMLINUZ {
            return Err(NodeError::Storage(format!(
                "kernel bundle {digest}: its kernel image is larger than {MAX_VMLINUZ} bytes"
            )));
        }
        let staged = self.scratch_dir(digest, "fetch")?;
        let result = async {
            objects
                .get_to_file(&m.vmlinuz, &staged.join(VMLINUZ_FILE))
                .await
                .map_err(fetch_error)?;
            let packed = staged.join(INITRAMFS_OBJECT);
            objects
                .get_to_file(&m.initramfs, &packed)
                .await
                .map_err(fetch_error)?;
            blocking_unpack("initramfs", {
                let (packed, out) = (packed.clone(), staged.join(INITRAMFS_FILE));
                move || {
                    let n = decompress_sparse(&packed, &out, MAX_INITRAMFS, false);
                    let _ = std::fs::remove_file(&packed);
                    n
                }
            })
            .await?;
            let (nm, store, meta, dir) = (
                self.inner.nm.clone(),
                self.inner.store.clone(),
                m.kernel.clone(),
                staged.clone(),
            );
            tokio::task::spawn_blocking(move || nm.install_kernel(&store, &dir, &meta))
                .await
                .map_err(|e| internal("installing task", e))?
                .map_err(|e| NodeError::Storage(format!("installing kernel bundle {digest}: {e}")))
        }
        .await;
        let _ = std::fs::remove_dir_all(&staged);
        result?;
        self.inner.published.fetched.fetch_add(1, Ordering::Relaxed);
        self.inner.published.learn(digest);
        tracing::info!(digest, "kernel bundle fetched from the object store");
        Ok(())
    }

    /// Says in the object store that template name `name` means `digest` (a build's names:
    /// the publisher skips templates it knows, so a new name for one would not be seen).
    pub(crate) async fn publish_template_name(
        &self,
        name: &str,
        digest: &str,
    ) -> Result<(), NodeError> {
        self.objects()?
            .put_bytes(
                &name_key(name)?,
                manifest_json(&NameManifest {
                    format: MANIFEST_FORMAT,
                    digest: digest.to_owned(),
                })?,
            )
            .await?;
        Ok(())
    }

    /// Removes name `name` from the object store's template names (the published template
    /// stays: stored snapshots may be restored onto it); whether it was there.
    pub(crate) async fn unpublish_template_name(&self, name: &str) -> Result<bool, NodeError> {
        let objects = self.objects()?.clone();
        let key = name_key(name)?;
        let existed = objects.size(&key).await?.is_some();
        if existed {
            objects.delete(&key).await?;
        }
        Ok(existed)
    }

    /// Templates and kernel bundles this node fetched since it started.
    pub fn fetched_from_object_store(&self) -> u64 {
        self.inner.published.fetched.load(Ordering::Relaxed)
    }

    /// A fresh directory of `incoming/` for `digest`'s `what` (publish or fetch).
    pub(crate) fn scratch_dir(&self, digest: &str, what: &str) -> Result<PathBuf, NodeError> {
        let dir = self.inner.store.incoming_dir().join(format!(
            "{what}-{digest}-{}",
            space_core::SandboxId::generate()
                .as_str()
                .trim_start_matches(space_core::SandboxId::PREFIX)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| internal("incoming directory", e))?;
        Ok(dir)
    }
}

/// A fetched object that is not what its manifest records is the store's fault, not the
/// snapshot's: reported as storage trouble.
fn fetch_error(e: space_objects::ObjectsError) -> NodeError {
    NodeError::Storage(e.to_string())
}

async fn blocking_io(
    what: &'static str,
    f: impl FnOnce() -> std::io::Result<u64> + Send + 'static,
) -> Result<u64, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| internal(what, e))?
        .map_err(|e| internal(what, e))
}

async fn blocking_unpack(
    what: &'static str,
    f: impl FnOnce() -> Result<u64, UnpackError> + Send + 'static,
) -> Result<u64, NodeError> {
    match tokio::task::spawn_blocking(f).await {
        Err(e) => Err(internal(what, e)),
        Ok(Ok(n)) => Ok(n),
        Ok(Err(UnpackError::Malformed(m))) => Err(NodeError::Storage(format!(
            "the published {what} is damaged: {m}"
        ))),
        Ok(Err(e)) => Err(internal(what, e)),
    }
}

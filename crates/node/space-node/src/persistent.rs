//! Persistent snapshots: what a snapshot taken `persistent` carries so that new sandboxes
//! can start from it once its sandbox is gone ([`SnapshotSource`], in its `source.json`,
//! written before the snapshot is committed), moving them out of a sandbox being deleted,
//! and reading, listing and deleting the ones whose sandbox was deleted.
//!
//! Ownership lives here, with the files: the source names the tenant, and the control
//! plane filters by it. A snapshot of a live sandbox that is not persistent is described
//! from the sandbox's record instead (its owner is the sandbox's).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use space_core::egress::EgressPolicy;
use space_core::{Resources, SandboxId, SandboxState, SnapshotId, SnapshotInfo, TenantId};
use space_storage::{SnapshotPaths, SnapshotSizes};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use crate::sandbox_manager::{internal, Inner};
use crate::sealing::{open_bytes, seal_bytes, ArtifactSeal};
use crate::{Node, NodeError, ProjectId};

pub use space_node_proto::SnapshotOwner;

/// The sandbox a snapshot was taken of, as it was then: everything a new sandbox started
/// from the snapshot needs. Holds secrets (env values, the CA key): its Debug output leaves
/// them out, and its file is mode 0600.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSource {
    /// The sandbox.
    pub sandbox_id: SandboxId,
    /// Its owner; `None` only for a live sandbox from before records carried it.
    pub tenant: Option<TenantId>,
    /// Its project within the tenant.
    #[serde(default)]
    pub project: Option<ProjectId>,
    /// Template name.
    pub template: String,
    /// The template digest the sandbox was created from (its disk's and kernel's).
    pub template_digest: String,
    /// Its resources (a checkpoint restores only into the same memory size).
    pub resources: Resources,
    /// Its egress policy.
    pub egress: EgressPolicy,
    /// Its environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its labels (empty for a live sandbox's snapshot that is not persistent: the control
    /// plane has them).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its CA (certificate, then key), which the trust store on the snapshot's disk and in
    /// its memory holds; `None` if it had none.
    #[serde(default)]
    pub sandbox_ca_pem: Option<String>,
    /// The env values and the CA, sealed, when the sandbox is sealed at rest: then `env` and
    /// `sandbox_ca_pem` are empty at rest, until [`Node::open_source`] fills them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_secrets: Option<SealedSecrets>,
}

/// A source's secrets (env values, the CA and its key) sealed under the tenant's key: what
/// stays in the clear is what listing and ownership need (the tenant, the env's names).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedSecrets {
    /// The env's names.
    pub env_keys: Vec<String>,
    /// [`SourceSecrets`] as JSON, sealed as [`secrets_artifact`], in base64.
    pub sealed: String,
}

/// What [`SealedSecrets`] seals.
#[derive(Serialize, Deserialize)]
struct SourceSecrets {
    env: BTreeMap<String, String>,
    sandbox_ca_pem: Option<String>,
}

/// The id the secrets in snapshot `snap`'s source are sealed as.
pub(crate) fn secrets_artifact(snap: &SnapshotId) -> String {
    format!("snapshots/{snap}/source.secrets")
}

impl SnapshotSource {
    /// This source with its secrets sealed under `seal` (see [`SealedSecrets`]).
    fn sealed(mut self, seal: &ArtifactSeal) -> Result<SnapshotSource, NodeError> {
        let secrets = SourceSecrets {
            env: std::mem::take(&mut self.env),
            sandbox_ca_pem: self.sandbox_ca_pem.take(),
        };
        let json = zeroize::Zeroizing::new(
            serde_json::to_vec(&secrets).map_err(|e| internal("snapshot source", e))?,
        );
        self.sealed_secrets = Some(SealedSecrets {
            env_keys: secrets.env.keys().cloned().collect(),
            sealed: BASE64.encode(seal_bytes(seal, &json)?),
        });
        Ok(self)
    }

    /// This source with its sealed secrets opened with `open` (the mirror of `sealed`).
    fn opened(mut self, open: &ArtifactSeal) -> Result<SnapshotSource, NodeError> {
        let Some(sealed) = self.sealed_secrets.take() else {
            return Ok(self);
        };
        let corrupt = |what: &str| NodeError::SnapshotCorrupt(format!("its source: {what}"));
        let bytes = BASE64
            .decode(sealed.sealed.as_bytes())
            .map_err(|_| corrupt("its sealed secrets are not base64"))?;
        let json = zeroize::Zeroizing::new(open_bytes(open, &bytes)?);
        let secrets: SourceSecrets =
            serde_json::from_slice(&json).map_err(|_| corrupt("unreadable sealed secrets"))?;
        self.env = secrets.env;
        self.sandbox_ca_pem = secrets.sandbox_ca_pem;
        Ok(self)
    }
}

impl SnapshotSource {
    /// What the control plane may see of it (no environment values, no CA key).
    pub fn origin(&self) -> space_node_proto::SnapshotOrigin {
        space_node_proto::SnapshotOrigin {
            sandbox_id: self.sandbox_id.clone(),
            tenant: self.tenant.clone(),
            template: self.template.clone(),
            template_digest: self.template_digest.clone(),
            resources: self.resources,
            env_keys: match &self.sealed_secrets {
                Some(sealed) => sealed.env_keys.clone(),
                None => self.env.keys().cloned().collect(),
            },
            labels: self.labels.clone(),
        }
    }
}

impl fmt::Debug for SnapshotSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotSource")
            .field("sandbox_id", &self.sandbox_id)
            .field("tenant", &self.tenant)
            .field("project", &self.project)
            .field("template", &self.template)
            .field("template_digest", &self.template_digest)
            .field("resources", &self.resources)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("labels", &self.labels)
            .field("sandbox_ca", &self.sandbox_ca_pem.is_some())
            .field("sealed_secrets", &self.sealed_secrets.is_some())
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// The source of live sandbox `id` as it is now; `owner` names the tenant and labels
    /// (without one, the record's tenant and no labels).
    pub(crate) fn snapshot_source(
        &self,
        id: &SandboxId,
        owner: Option<&SnapshotOwner>,
    ) -> Result<SnapshotSource, NodeError> {
        let rec = self
            .lock()
            .get(id)
            .map(|e| e.record.clone())
            .filter(|r| r.state != SandboxState::Deleted)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        Ok(SnapshotSource {
            sandbox_id: rec.id,
            tenant: owner.map(|o| o.tenant.clone()).or(rec.tenant),
            project: rec.project,
            template: rec.template,
            template_digest: rec.template_digest,
            resources: rec.resources,
            egress: rec.egress,
            env: rec.env,
            labels: owner.map(|o| o.labels.clone()).unwrap_or_default(),
            sandbox_ca_pem: self.sandbox_cas.pem(id)?,
            sealed_secrets: None,
        })
    }

    /// Moves every persistent snapshot of `id` (being deleted, its VM gone) out of its
    /// directory; how many moved. Each move is one rename, so a crash between two leaves
    /// every snapshot whole in one place, and repeating this moves the rest.
    pub(crate) fn persist_snapshots(&self, id: &SandboxId) -> Result<usize, NodeError> {
        let mut moved = 0;
        for snap in self.store.list_snapshots(id, SnapshotSizes::Stored)? {
            if snap.persistent && self.nm.persist_snapshot(&self.store, id, &snap.id)? {
                tracing::info!(%id, snapshot = %snap.id, "persistent snapshot kept after its sandbox");
                moved += 1;
            }
        }
        Ok(moved)
    }
}

/// Reads a snapshot's source.json.
fn read_source(paths: &SnapshotPaths) -> Result<Option<SnapshotSource>, NodeError> {
    space_storage::read_snapshot_source(paths)?
        .map(|bytes| {
            serde_json::from_slice(&bytes).map_err(|e| {
                internal(
                    "unreadable snapshot source",
                    format!("{}: {e}", paths.dir.display()),
                )
            })
        })
        .transpose()
}

impl Node {
    /// The source of live sandbox `id` as snapshot `snap` keeps it at rest (`owner` as for
    /// [`Inner::snapshot_source`]), as JSON: its secrets sealed when the sandbox is sealed at
    /// rest (without its tenant's key, none).
    pub(crate) fn source_json(
        &self,
        id: &SandboxId,
        snap: &SnapshotId,
        owner: Option<&SnapshotOwner>,
    ) -> Result<Vec<u8>, NodeError> {
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let mut source = self.inner.snapshot_source(id, owner)?;
        if let Some(seal) = self
            .inner
            .artifact_keys
            .seal_for(&rec, secrets_artifact(snap))?
        {
            source = source.sealed(&seal)?;
        }
        serde_json::to_vec(&source).map_err(|e| internal("snapshot source", e))
    }

    /// Source `source` of snapshot `snap` with its secrets opened, if sealed (the tenant it
    /// names has the key): what a sandbox made from the snapshot gets.
    pub(crate) fn open_source(
        &self,
        source: SnapshotSource,
        snap: &SnapshotId,
    ) -> Result<SnapshotSource, NodeError> {
        if source.sealed_secrets.is_none() {
            return Ok(source);
        }
        let open = self.inner.artifact_keys.opener(
            source.tenant.as_ref(),
            secrets_artifact(snap),
            "the sealed secrets of its source",
        )?;
        source.opened(&open)
    }

    /// Snapshot `snap` of live sandbox `sandbox`, with its source: its own (persistent
    /// snapshots) or the sandbox as it is now. `None` if the sandbox has no such snapshot.
    pub async fn snapshot_source(
        &self,
        sandbox: &SandboxId,
        snap: &SnapshotId,
    ) -> Result<Option<(SnapshotInfo, SnapshotSource)>, NodeError> {
        let (node, sandbox, snap) = (self.clone(), sandbox.clone(), snap.clone());
        blocking(move || {
            let Some((info, paths)) = node.inner.store.snapshot(&sandbox, &snap)? else {
                return Ok(None);
            };
            let source = match read_source(&paths)? {
                Some(source) => source,
                None => node.inner.snapshot_source(&sandbox, None)?,
            };
            Ok(Some((info, source)))
        })
        .await
    }

    /// The persistent snapshots whose sandbox was deleted, oldest first, with their sources
    /// (current sizes). One whose source cannot be read is left out, with a warning.
    pub async fn persistent_snapshots(
        &self,
    ) -> Result<Vec<(SnapshotInfo, SnapshotSource)>, NodeError> {
        let node = self.clone();
        blocking(move || {
            let store = &node.inner.store;
            let mut out = Vec::new();
            for info in store.list_persistent_snapshots(SnapshotSizes::Refresh)? {
                let source = store
                    .persistent_snapshot(&info.id)
                    .map_err(NodeError::from)
                    .and_then(|found| match found {
                        Some((_, paths)) => read_source(&paths),
                        None => Ok(None),
                    });
                match source {
                    Ok(Some(source)) => out.push((info, source)),
                    // Deleted meanwhile.
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(snapshot = %info.id, error = %e, "persistent snapshot without a readable source skipped")
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    /// One persistent snapshot whose sandbox was deleted, with its source.
    pub async fn persistent_snapshot(
        &self,
        snap: &SnapshotId,
    ) -> Result<Option<(SnapshotInfo, SnapshotSource)>, NodeError> {
        let (node, snap) = (self.clone(), snap.clone());
        blocking(move || {
            let Some((info, paths)) = node.inner.store.persistent_snapshot(&snap)? else {
                return Ok(None);
            };
            let source = read_source(&paths)?
                .ok_or_else(|| internal("persistent snapshot without a source", &snap))?;
            Ok(Some((info, source)))
        })
        .await
    }

    /// Deletes a persistent snapshot whose sandbox was deleted.
    pub async fn delete_persistent_snapshot(&self, snap: &SnapshotId) -> Result<(), NodeError> {
        let (node, id) = (self.clone(), snap.clone());
        let deleted = blocking(move || {
            Ok(node
                .inner
                .nm
                .delete_persistent_snapshot(&node.inner.store, &id)?)
        })
        .await?;
        if !deleted {
            return Err(NodeError::SnapshotNotFound(snap.clone()));
        }
        tracing::info!(snapshot = %snap, "persistent snapshot deleted");
        Ok(())
    }
}

/// Runs store work (file reads, FIEMAP walks) off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, NodeError> + Send + 'static,
) -> Result<T, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| internal("snapshot store task", e))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_envelope::DataKey;

    fn source() -> SnapshotSource {
        SnapshotSource {
            sandbox_id: SandboxId::generate(),
            tenant: Some(TenantId::generate()),
            project: None,
            template: "base".into(),
            template_digest: "d".repeat(64),
            resources: Resources::default(),
            egress: EgressPolicy::default(),
            env: [("TOKEN".to_owned(), "s3cr3t-env-value".to_owned())].into(),
            labels: BTreeMap::new(),
            sandbox_ca_pem: Some("-----BEGIN PRIVATE KEY----- ca-key".into()),
            sealed_secrets: None,
        }
    }

    #[test]
    fn sealed_secrets_leave_names_in_the_clear_and_open_only_as_their_snapshot() {
        let key = DataKey::generate();
        let snap = SnapshotId::generate();
        let seal = |snap: &SnapshotId| ArtifactSeal {
            key: key.derive(&secrets_artifact(snap)),
            artifact: secrets_artifact(snap),
        };
        let plain = source();
        let sealed = plain.clone().sealed(&seal(&snap)).unwrap();
        let json = String::from_utf8(serde_json::to_vec(&sealed).unwrap()).unwrap();
        assert!(
            !json.contains("s3cr3t-env-value") && !json.contains("ca-key"),
            "{json}"
        );
        assert_eq!(sealed.origin().env_keys, vec!["TOKEN".to_owned()]);
        assert_eq!(sealed.origin(), plain.origin());
        let read: SnapshotSource = serde_json::from_str(&json).unwrap();
        assert_eq!(read.clone().opened(&seal(&snap)).unwrap(), plain);
        // Another snapshot's key, or a damaged seal: refused, never half-opened.
        let other = SnapshotId::generate();
        assert!(matches!(
            read.clone().opened(&seal(&other)),
            Err(NodeError::SnapshotCorrupt(_))
        ));
        let mut damaged = read;
        if let Some(s) = damaged.sealed_secrets.as_mut() {
            s.sealed.replace_range(10..12, "AA");
        }
        assert!(matches!(
            damaged.opened(&seal(&snap)),
            Err(NodeError::SnapshotCorrupt(_))
        ));
    }
}

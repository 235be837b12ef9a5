//! The node's credential manager and audit log, opened at start. The gateways inject its
//! credentials into sandbox requests; the control plane manages credentials and reads the
//! audit log through [`crate::Node::credentials`] and [`crate::Node::audit`].
//!
//! Files (all under the data directory, never on the sandbox store, so no sandbox snapshot
//! or disk ever holds them): `credentials/` and `credentials.key` (the built-in encrypted
//! store), `placeholder.key` (derives the per-sandbox placeholders), `audit/credentials/` (the decision log, a directory per tenant and a file per day).

use std::path::Path;
use std::sync::Arc;

use space_secrets::audit::AuditLimits;
use space_secrets::store::EncryptedFileStore;
use space_secrets::{
    AuditLog, CommandBackend, CredentialManager, ManagerConfig, PlaceholderKey, SecretBackend,
};

use crate::config::CredentialBackend;
use crate::sandbox_manager::internal;
use crate::NodeError;

/// The opened manager and its audit log.
pub(crate) struct Credentials {
    pub(crate) manager: Arc<CredentialManager>,
    pub(crate) audit: Arc<AuditLog>,
    /// The control plane's catalog revision the manager's set was last synced to (0 since
    /// start: the control plane syncs the node at its next heartbeat).
    pub(crate) catalog_revision: std::sync::atomic::AtomicU64,
}

/// Opens the backend `kind` under `data_dir`, loads every credential's metadata (failing
/// closed on an invalid one) and attaches the audit log.
pub(crate) async fn open(
    data_dir: &Path,
    kind: &CredentialBackend,
    audit_limits: &AuditLimits,
    cluster_placeholder_key: Option<&Path>,
) -> Result<Credentials, NodeError> {
    let backend: Arc<dyn SecretBackend> = match kind {
        CredentialBackend::Store => Arc::new(
            EncryptedFileStore::open(
                data_dir.join("credentials"),
                &data_dir.join("credentials.key"),
            )
            .map_err(|e| internal("credentials: cannot open the store", e))?,
        ),
        CredentialBackend::Command(cfg) => Arc::new(
            CommandBackend::new(cfg.clone(), data_dir.join("credentials-metadata.json"))
                .map_err(|e| internal("credentials: bad helper", e))?,
        ),
    };
    let placeholder_key = match cluster_placeholder_key {
        Some(path) => PlaceholderKey::load(path),
        None => PlaceholderKey::load_or_create(&data_dir.join("placeholder.key")),
    }
    .map_err(|e| internal("credentials: placeholder key", e))?;
    let audit = Arc::new(
        AuditLog::open_with(
            data_dir.join("audit").join("credentials"),
            audit_limits.clone(),
        )
        .map_err(|e| internal("credentials: cannot open the audit log", e))?,
    );
    let manager = CredentialManager::load(backend, placeholder_key, ManagerConfig::default())
        .await
        .map_err(|e| internal("credentials: cannot load", e))?
        .with_audit(audit.clone());
    Ok(Credentials {
        manager: Arc::new(manager),
        audit,
        catalog_revision: std::sync::atomic::AtomicU64::new(0),
    })
}

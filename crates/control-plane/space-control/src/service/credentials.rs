//! Credentials: the secrets the egress gateways inject into sandbox requests, as desired
//! state. The control plane's catalog (`db::credentials`) is the source of truth: each
//! credential's metadata and its value sealed under the control plane's credential key
//! ([`CredentialSealer`]). Nodes hold copies, since their gateways inject them:
//!
//! - a change is written to the catalog first (one transaction, the catalog's revision
//!   bumped), then pushed to every ready node; a node that misses the push is not an error
//!   (the catalog is what counts);
//! - a node reports the catalog revision it was last synced to in its status; whichever
//!   replica sees it behind syncs it ([`sync_node`]: every credential pushed, every other
//!   one the node holds deleted, then the revision recorded on the node): at its first
//!   heartbeat after a join or a restart, and after any push it missed;
//! - the single-machine default syncs its own node at start.
//!
//! Values are write-only: they go in with a create or replace and never come out of the
//! API, a log or an error. A tenant sees and manages only its own credentials.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use space_core::{SandboxId, TenantId};
use space_secrets::keyfile::{KeyBytes, KEY_LEN};
use space_secrets::{Credential, CredentialId, CredentialName, CredentialRule, Scope, SecretValue};

use super::sandboxes::parse_project;
use super::Caller;
use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;
use crate::db::{DbError, StoredCredential};
use crate::nodes::{NodeApi, NodeCallError};

/// What a credential's value is sealed with: XChaCha20-Poly1305 under the control plane's
/// credential key, with the credential's id as associated data (a sealed value moved to
/// another row does not open).
pub struct CredentialSealer {
    key: KeyBytes,
}

/// Why a sealed value does not open.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// Not what [`CredentialSealer::seal`] makes.
    #[error("credential {0}: the stored value is malformed")]
    Malformed(CredentialId),
    /// Changed, moved, or sealed under another key.
    #[error("credential {0}: the stored value fails authentication (changed, or sealed under another key)")]
    Authentication(CredentialId),
}

impl CredentialSealer {
    /// A sealer with `key`.
    pub fn new(key: KeyBytes) -> CredentialSealer {
        CredentialSealer { key }
    }

    /// The credential placeholder key the cluster's nodes share, derived from this key (a
    /// join hands it over): a sandbox's placeholders are the same on every node.
    pub fn placeholder_key(&self) -> space_secrets::PlaceholderKey {
        space_secrets::PlaceholderKey::derive(&self.key)
    }

    pub(crate) fn aad(id: &CredentialId) -> Vec<u8> {
        format!("space-control/credential/v1:{id}").into_bytes()
    }

    /// `value`, sealed for credential `id` (base64 of nonce and ciphertext).
    pub fn seal(&self, id: &CredentialId, value: &SecretValue) -> ApiResult<String> {
        self.seal_bytes(&Self::aad(id), value.expose().as_bytes())
    }

    /// Opens what [`CredentialSealer::seal`] made for credential `id`.
    pub fn open(&self, id: &CredentialId, sealed: &str) -> Result<SecretValue, SealError> {
        value_of(id, self.open_bytes(&Self::aad(id), sealed))
    }

    /// `plain`, sealed with `aad` as associated data (base64 of nonce and ciphertext): what
    /// else the control plane keeps secret in its database (how it reaches a customer key).
    pub fn seal_bytes(&self, aad: &[u8], plain: &[u8]) -> ApiResult<String> {
        seal_under(&self.key, aad, plain)
    }

    /// Opens what [`CredentialSealer::seal_bytes`] made with `aad`.
    pub fn open_bytes(
        &self,
        aad: &[u8],
        sealed: &str,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, SealedBytesError> {
        open_under(&self.key, aad, sealed)
    }
}

/// `plain` sealed under `key` (XChaCha20-Poly1305, `aad` as associated data): base64 of
/// nonce and ciphertext. The control plane's credential key and data keys seal alike.
fn seal_under(key: &[u8; KEY_LEN], aad: &[u8], plain: &[u8]) -> ApiResult<String> {
    use base64::Engine as _;
    let (nonce, ciphertext) =
        space_secrets::crypto::seal(key, aad, plain).map_err(ApiError::internal)?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&ciphertext);
    Ok(base64::engine::general_purpose::STANDARD.encode(out))
}

/// Opens what [`seal_under`] made with `key` and `aad`.
fn open_under(
    key: &[u8; KEY_LEN],
    aad: &[u8],
    sealed: &str,
) -> Result<zeroize::Zeroizing<Vec<u8>>, SealedBytesError> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(sealed)
        .map_err(|_| SealedBytesError::Malformed)?;
    let n = space_secrets::crypto::NONCE_LEN;
    if bytes.len() < n {
        return Err(SealedBytesError::Malformed);
    }
    space_secrets::crypto::open(key, aad, &bytes[..n], &bytes[n..])
        .map_err(|_| SealedBytesError::Authentication)
}

/// Credential `id`'s value from what opening its sealed form gave.
fn value_of(
    id: &CredentialId,
    opened: Result<zeroize::Zeroizing<Vec<u8>>, SealedBytesError>,
) -> Result<SecretValue, SealError> {
    let plain = opened.map_err(|e| match e {
        SealedBytesError::Malformed => SealError::Malformed(id.clone()),
        SealedBytesError::Authentication => SealError::Authentication(id.clone()),
    })?;
    SecretValue::from_bytes(plain).map_err(|_| SealError::Malformed(id.clone()))
}

/// Why sealed bytes do not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealedBytesError {
    /// Not what [`CredentialSealer::seal_bytes`] makes.
    #[error("the sealed value is malformed")]
    Malformed,
    /// Changed, moved, or sealed under another key.
    #[error("the sealed value fails authentication (changed, moved, or sealed under another key)")]
    Authentication,
}

/// Whom a credential is for, within the caller's tenant.
#[derive(Debug, Clone)]
pub enum ScopeRequest {
    /// Every sandbox of the tenant.
    Tenant,
    /// The tenant's sandboxes created in this project.
    Project(String),
    /// One of the tenant's sandboxes.
    Sandbox(SandboxId),
}

/// A credential to store: everything but its id and creation time.
pub struct NewCredential {
    /// Name, unique within the scope.
    pub name: String,
    /// Whom it is for.
    pub scope: ScopeRequest,
    /// Where and how it is injected.
    pub rule: CredentialRule,
    /// After this instant (ms since the Unix epoch) it is refused.
    pub expires_at_ms: Option<i64>,
    /// The value (write-only).
    pub value: String,
}

/// The stored form of `new` (checked: name, project, the sandbox is the caller's).
async fn credential_of(
    st: &AppState,
    tenant: &TenantId,
    id: CredentialId,
    created_at_ms: i64,
    new: &NewCredential,
) -> ApiResult<Credential> {
    let name: CredentialName = new
        .name
        .parse()
        .map_err(|e: space_secrets::ValidationError| ApiError::invalid(e.to_string()))?;
    let tenant = tenant.clone();
    let scope = match &new.scope {
        ScopeRequest::Tenant => Scope::Tenant { tenant },
        ScopeRequest::Project(project) => Scope::Project {
            tenant,
            project: parse_project(Some(project))?
                .ok_or_else(|| ApiError::invalid("project is empty"))?,
        },
        ScopeRequest::Sandbox(sandbox) => {
            st.find_sandbox(&tenant, sandbox).await?;
            Scope::Sandbox {
                tenant,
                sandbox: sandbox.clone(),
            }
        }
    };
    Ok(Credential {
        id,
        name,
        scope,
        rule: new.rule.clone(),
        created_at_ms,
        expires_at_ms: new.expires_at_ms,
    })
}

/// The value of `credential`, checked as a node checks what it is given (the rule, and a
/// value a header can carry): what the catalog takes, every node takes.
fn value_for(credential: &Credential, value: String) -> ApiResult<SecretValue> {
    let value = SecretValue::new(value).map_err(|e| ApiError::invalid(e.to_string()))?;
    space_secrets::manager::check_storable(credential, &value)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(value)
}

/// Creates a credential, within the tenant's quota.
pub async fn create(st: &AppState, caller: &Caller, new: NewCredential) -> ApiResult<Credential> {
    let credential = credential_of(
        st,
        &caller.id,
        CredentialId::generate(),
        crate::db::now_ms(),
        &new,
    )
    .await?;
    tracing::info!(tenant = %caller.name, credential = %credential.id, name = %credential.name, "creating credential");
    let value = value_for(&credential, new.value)?;
    {
        let _admission = st.quotas.admission(&caller.id).await?;
        st.admit_credential(&caller.id).await?;
        store(st, &credential, &value, false).await?;
    }
    push(st, &credential, &value).await;
    Ok(credential)
}

/// Replaces a credential's name, scope, rule, expiry and value.
pub async fn replace(
    st: &AppState,
    caller: &Caller,
    id: &CredentialId,
    new: NewCredential,
) -> ApiResult<Credential> {
    let old = get(st, caller, id).await?;
    let credential = credential_of(st, &caller.id, id.clone(), old.created_at_ms, &new).await?;
    let value = value_for(&credential, new.value)?;
    store(st, &credential, &value, true).await?;
    push(st, &credential, &value).await;
    Ok(credential)
}

/// The caller's credentials (metadata only).
pub async fn list(st: &AppState, caller: &Caller) -> ApiResult<Vec<Credential>> {
    Ok(st
        .db
        .credentials_of(&caller.id)
        .await?
        .into_iter()
        .map(|s| s.credential)
        .collect())
}

/// One of the caller's credentials (metadata only), or 404 (also for another tenant's).
pub async fn get(st: &AppState, caller: &Caller, id: &CredentialId) -> ApiResult<Credential> {
    st.db
        .credential(&caller.id, id)
        .await?
        .map(|s| s.credential)
        .ok_or_else(|| not_found(id))
}

/// Deletes a credential: from now on no request gets it (nodes that miss the deletion drop
/// it at their next sync, within seconds).
pub async fn delete(st: &AppState, caller: &Caller, id: &CredentialId) -> ApiResult<()> {
    let stored = st.db.credential(&caller.id, id).await?;
    if st.db.delete_credential(&caller.id, id).await?.is_none() {
        return Err(not_found(id));
    }
    if let Some(data_key) = stored.as_ref().and_then(|s| data_key_of(&s.sealed_value)) {
        super::customer_keys::forget_data_key(st, &caller.id, data_key).await?;
    }
    tracing::info!(tenant = %caller.name, credential = %id, "credential deleted");
    let id = id.clone();
    to_every_node(st, "deletion", move |node| {
        let id = id.clone();
        async move { node.delete_credential(&id).await }
    })
    .await;
    Ok(())
}

fn not_found(id: &CredentialId) -> ApiError {
    ApiError::not_found(format!("credential {id} not found"))
}

/// How a value sealed under a data key of the tenant's customer key starts (then the data
/// key's id, `:`, and base64 of nonce and ciphertext); any other sealed value is under the
/// control plane's credential key.
const UNDER_CUSTOMER_KEY: &str = "customer-key:";

/// `value` of `credential`, sealed: under a data key of its own wrapped by the tenant's
/// customer key if the tenant has one, else under the control plane's credential key.
async fn seal_value(
    st: &AppState,
    credential: &Credential,
    value: &SecretValue,
) -> ApiResult<String> {
    let tenant = credential.scope.tenant();
    let artifact = format!("credential {}", credential.id);
    match super::customer_keys::new_data_key(st, tenant, &artifact).await? {
        None => st.credential_sealer.seal(&credential.id, value),
        Some((data_key_id, data_key)) => {
            let sealed = seal_under(
                data_key.expose(),
                &CredentialSealer::aad(&credential.id),
                value.expose().as_bytes(),
            )?;
            Ok(format!("{UNDER_CUSTOMER_KEY}{data_key_id}:{sealed}"))
        }
    }
}

/// The data key a sealed value is under, if it is under the tenant's customer key.
fn data_key_of(sealed: &str) -> Option<&str> {
    sealed
        .strip_prefix(UNDER_CUSTOMER_KEY)
        .and_then(|rest| rest.split_once(':'))
        .map(|(id, _)| id)
}

/// Opens a stored credential's value: with its data key (unwrapped by the tenant's
/// customer key: `403 key_unavailable` once the customer revoked it), or the control
/// plane's credential key.
pub async fn open_value(st: &AppState, stored: &StoredCredential) -> ApiResult<SecretValue> {
    let id = &stored.credential.id;
    let Some(rest) = stored.sealed_value.strip_prefix(UNDER_CUSTOMER_KEY) else {
        return st
            .credential_sealer
            .open(id, &stored.sealed_value)
            .map_err(ApiError::internal);
    };
    let (data_key_id, sealed) = rest
        .split_once(':')
        .ok_or_else(|| ApiError::internal(SealError::Malformed(id.clone())))?;
    let data_key =
        super::customer_keys::open_data_key(st, stored.credential.scope.tenant(), data_key_id)
            .await?;
    value_of(
        id,
        open_under(data_key.expose(), &CredentialSealer::aad(id), sealed),
    )
    .map_err(ApiError::internal)
}

/// Seals again, under data keys of the tenant's customer key, those of its values still
/// under the control plane's credential key (what it stored before it registered one).
/// Returns how many.
pub async fn reseal_under_customer_key(st: &AppState, tenant: &TenantId) -> ApiResult<u64> {
    let mut done = 0;
    for stored in st.db.credentials_of(tenant).await? {
        if data_key_of(&stored.sealed_value).is_some() {
            continue;
        }
        let value = open_value(st, &stored).await?;
        store(st, &stored.credential, &value, true).await?;
        done += 1;
    }
    Ok(done)
}

/// Deletes credential `id` from `node`, if it holds it.
async fn forget_on(node: &dyn NodeApi, id: &CredentialId) -> Result<(), NodeCallError> {
    match node.delete_credential(id).await {
        Err(e) if e.code() == space_core::ErrorCode::NotFound => Ok(()),
        other => other,
    }
}

/// Deletes from every node the values of `tenant` sealed under its customer key (which is
/// no longer usable); the catalog keeps them, sealed. Returns how many.
pub async fn drop_from_nodes(st: &AppState, tenant: &TenantId) -> ApiResult<usize> {
    let ids: Vec<CredentialId> = st
        .db
        .credentials_of(tenant)
        .await?
        .into_iter()
        .filter(|s| data_key_of(&s.sealed_value).is_some())
        .map(|s| s.credential.id)
        .collect();
    let count = ids.len();
    if count > 0 {
        let ids = Arc::new(ids);
        to_every_node(st, "revocation", move |node| {
            let ids = ids.clone();
            async move {
                for id in ids.iter() {
                    forget_on(node.as_ref(), id).await?;
                }
                Ok(())
            }
        })
        .await;
    }
    Ok(count)
}

/// Writes `credential` with `value` into the catalog (a replaced value's data key is
/// forgotten once the new one is stored).
async fn store(
    st: &AppState,
    credential: &Credential,
    value: &SecretValue,
    replace: bool,
) -> ApiResult<()> {
    let tenant = credential.scope.tenant();
    let previous = if replace {
        st.db.credential(tenant, &credential.id).await?
    } else {
        None
    };
    let stored = StoredCredential {
        credential: credential.clone(),
        sealed_value: seal_value(st, credential, value).await?,
    };
    let result = match st.db.put_credential(&stored, replace).await {
        Ok(_) => Ok(()),
        Err(DbError::AlreadyExists(what)) => Err(ApiError::new(
            space_core::ErrorCode::AlreadyExists,
            format!("{what} already exists"),
        )),
        Err(DbError::NotFound(_)) => Err(not_found(&credential.id)),
        Err(e) => Err(e.into()),
    };
    // The data key of whichever value is not in the catalog now.
    let unused = if result.is_ok() {
        previous.as_ref().map(|p| p.sealed_value.as_str())
    } else {
        Some(stored.sealed_value.as_str())
    };
    if let Some(data_key) = unused.and_then(data_key_of) {
        super::customer_keys::forget_data_key(st, tenant, data_key).await?;
    }
    result
}

/// How long a change waits for the nodes to take it before answering (a node that takes
/// longer, or is down, gets it in the background or at its next sync).
pub const PUSH_WAIT: Duration = Duration::from_secs(3);

/// Pushes one credential to every node.
async fn push(st: &AppState, credential: &Credential, value: &SecretValue) {
    let (credential, value) = (credential.clone(), Arc::new(value.duplicate()));
    to_every_node(st, "credential", move |node| {
        let (credential, value) = (credential.clone(), value.duplicate());
        async move { node.put_credential(credential, value).await }
    })
    .await;
}

/// Runs `change` on every node, each in a task of its own; waits at most [`PUSH_WAIT`] for
/// them (the rest finish in the background). A node that fails is logged: the catalog
/// has the change, and the node's next sync brings it.
pub(super) async fn to_every_node<F, Fut>(st: &AppState, what: &'static str, change: F)
where
    F: Fn(Arc<dyn NodeApi>) -> Fut,
    Fut: std::future::Future<Output = Result<(), NodeCallError>> + Send + 'static,
{
    let tasks: Vec<_> = st
        .nodes
        .all()
        .into_iter()
        .map(|node| {
            let name = node.name().to_owned();
            let work = change(node);
            tokio::spawn(async move {
                if let Err(e) = work.await {
                    tracing::warn!(node = %name, error = %e, "node missed a {what} change; its next sync brings it");
                }
            })
        })
        .collect();
    if tokio::time::timeout(PUSH_WAIT, futures::future::join_all(tasks))
        .await
        .is_err()
    {
        tracing::info!("a node is slow to take a {what} change; it goes on in the background");
    }
}

/// Why a node could not be synced.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The catalog could not be read.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A stored value does not open (the catalog or the key is not what it was, or the
    /// key service of a customer key did not answer).
    #[error(transparent)]
    Open(space_core::ErrorBody),
    /// The node refused or did not answer.
    #[error(transparent)]
    Node(#[from] NodeCallError),
}

/// Makes `node`'s credentials the catalog's: every credential put (replaced if it has it),
/// every other one it holds deleted, then the catalog's revision recorded on the node.
/// Returns that revision.
pub async fn sync_node(st: &AppState, node: &dyn NodeApi) -> Result<u64, SyncError> {
    let (revision, catalog) = st.db.credential_catalog().await?;
    let wanted: HashSet<&CredentialId> = catalog.iter().map(|s| &s.credential.id).collect();
    // Deletions first: a credential the catalog renamed or replaced under another id must
    // not hold its name on the node when the new one arrives.
    for held in node.credentials().await? {
        if !wanted.contains(&held.id) {
            node.delete_credential(&held.id).await?;
        }
    }
    for stored in &catalog {
        let value = match open_value(st, stored).await {
            Ok(value) => value,
            // The customer revoked the key its tenant's values are under: SPACE can no
            // longer open them, and the node must not keep a copy either. Other tenants'
            // credentials are synced all the same.
            Err(e) if e.body.code == space_core::ErrorCode::KeyUnavailable => {
                tracing::warn!(node = node.name(), credential = %stored.credential.id, error = %e.body, "credential under an unavailable customer key: dropped from the node");
                forget_on(node, &stored.credential.id).await?;
                continue;
            }
            Err(e) => return Err(SyncError::Open(e.body)),
        };
        node.put_credential(stored.credential.clone(), value)
            .await?;
    }
    node.credentials_synced(revision).await?;
    tracing::info!(
        node = node.name(),
        revision,
        credentials = catalog.len(),
        "node's credentials synced with the catalog"
    );
    Ok(revision)
}

/// Syncs `node` in the background if its reported revision is behind the catalog's; at most
/// one sync per node at a time in this replica.
pub async fn sync_if_behind(st: &AppState, node: Arc<dyn NodeApi>, reported: u64) {
    let current = match st.db.credential_revision().await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the credential catalog's revision");
            return;
        }
    };
    if reported >= current || !st.credential_syncs.begin(node.name()) {
        return;
    }
    let st = st.clone();
    tokio::spawn(async move {
        if let Err(e) = sync_node(&st, node.as_ref()).await {
            tracing::warn!(node = node.name(), error = %e, "credential sync failed; retried at its next heartbeat");
        }
        st.credential_syncs.end(node.name());
    });
}

/// The nodes this replica is syncing now.
#[derive(Default, Clone)]
pub struct SyncsUnderWay(Arc<std::sync::Mutex<HashSet<String>>>);

impl SyncsUnderWay {
    /// Marks `node` as being synced; `false` if it already is.
    fn begin(&self, node: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_owned())
    }

    fn end(&self, node: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(node);
    }
}

/// A registry login taken from the credential manager for a template build.
pub struct RegistryCredential {
    /// The registry user name (the rule's `basic_auth` user).
    pub username: String,
    /// The password or token.
    pub password: SecretValue,
}

/// The caller's credential that logs in to `registry` (a template build's image registry,
/// as the image reference names it): the one `named` (its name or id), or else the only
/// one of the caller's tenant-wide credentials whose rule lists that registry. `None` when
/// none is named and none lists it (the pull goes anonymous or with the node's file).
///
/// Only tenant-wide credentials count (a project's or a sandbox's are for its sandboxes),
/// and only for the registries their rule names: a value is never sent anywhere its owner
/// did not say, whatever the image reference.
pub async fn registry_login(
    st: &AppState,
    caller: &Caller,
    registry: &str,
    named: Option<&str>,
) -> ApiResult<Option<RegistryCredential>> {
    let now = crate::db::now_ms();
    let usable = |c: &Credential| {
        matches!(c.scope, Scope::Tenant { .. }) && c.expires_at_ms.is_none_or(|t| t > now)
    };
    let mine = st.db.credentials_of(&caller.id).await?;
    let chosen = match named {
        Some(named) => {
            let found = mine
                .into_iter()
                .find(|s| {
                    (s.credential.id.as_str() == named || s.credential.name.as_str() == named)
                        && usable(&s.credential)
                })
                .ok_or_else(|| {
                    ApiError::not_found(format!(
                        "registry_credential {named:?}: no tenant-wide, unexpired credential has that name or id"
                    ))
                })?;
            if !found.credential.rule.logs_in_to(registry) {
                return Err(ApiError::invalid(format!(
                    "credential {} is not for registry {registry}: add it to the rule's registries to allow it",
                    found.credential.name
                )));
            }
            found
        }
        None => {
            let mut matching: Vec<StoredCredential> = mine
                .into_iter()
                .filter(|s| usable(&s.credential) && s.credential.rule.logs_in_to(registry))
                .collect();
            match matching.len() {
                0 => return Ok(None),
                1 => matching.remove(0),
                n => {
                    return Err(ApiError::invalid(format!(
                        "{n} credentials log in to registry {registry}: name one with registry_credential"
                    )))
                }
            }
        }
    };
    let username = chosen
        .credential
        .rule
        .registry_username()
        .ok_or_else(|| ApiError::internal("a stored registry credential is not basic_auth"))?
        .to_owned();
    let password = open_value(st, &chosen).await?;
    tracing::info!(tenant = %caller.name, credential = %chosen.credential.id, %registry, "registry login from a credential");
    Ok(Some(RegistryCredential { username, password }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_for_their_credential_and_key() {
        let sealer = CredentialSealer::new(KeyBytes::new([3u8; KEY_LEN]));
        let (a, b) = (CredentialId::generate(), CredentialId::generate());
        let value = SecretValue::new("sk-test-123".into()).unwrap();
        let sealed = sealer.seal(&a, &value).unwrap();
        assert!(!sealed.contains("sk-test"));
        assert_eq!(sealer.open(&a, &sealed).unwrap().expose(), "sk-test-123");
        assert!(matches!(
            sealer.open(&b, &sealed),
            Err(SealError::Authentication(_))
        ));
        let other = CredentialSealer::new(KeyBytes::new([4u8; KEY_LEN]));
        assert!(matches!(
            other.open(&a, &sealed),
            Err(SealError::Authentication(_))
        ));
        assert!(matches!(
            sealer.open(&a, "!!"),
            Err(SealError::Malformed(_))
        ));
        assert!(matches!(
            sealer.open(&a, "AAAA"),
            Err(SealError::Malformed(_))
        ));
        // Each seal is fresh (a new nonce).
        assert_ne!(sealer.seal(&a, &value).unwrap(), sealed);
    }
}

//! Customer keys: a tenant brings its own key, at one of the operator's key services
//! ([`space_kms`]), and everything of the tenant's that SPACE keeps at rest is sealed under
//! data keys wrapped by it.
//!
//! - **Registration** (`PUT /v1/customer-key`): the key service must exist, and the key
//!   must wrap and unwrap a throwaway data key there before it is accepted. How SPACE
//!   reaches it (key id, token, credentials) is stored sealed under the control plane's
//!   credential key. A tenant has one customer key; the local key service's keys are made
//!   by SPACE (a tenant never names one), one per tenant and version.
//! - **The gate** ([`require_usable`]): every start, resume, restore and create-from-snapshot
//!   of a tenant with a customer key asks its key service first. A check is a round trip of
//!   a throwaway key; a passed check is trusted for at most the check TTL
//!   ([`DEFAULT_CHECK_TTL`], `space server --customer-key-check-ttl-secs`), a failed one not
//!   at all. A revoked, disabled or destroyed key is `403 key_unavailable`, naming the
//!   customer key (service, key id, version), never key material; a key service that does
//!   not answer is retried, then `503 key_service_unavailable`.
//! - **Data keys** ([`new_data_key`], [`open_data_key`]): one per sealed artifact, made here,
//!   wrapped under the current version and stored wrapped (`db::customer_keys`); the
//!   plaintext goes to whoever seals or opens the artifact, in memory, for that operation.
//!   The wrap is bound to the tenant and the data key's id.
//! - **Rotation** (`POST /v1/customer-key/rotate`): a new version (a new key, or the same
//!   one with fresh credentials) is checked, made current, and every data key is re-wrapped
//!   under it: unwrapped under its old version, wrapped under the new one, one conditional
//!   update each. No artifact is re-encrypted. Online: artifacts stay readable throughout.
//! - **Audit**: every wrap, unwrap, check and refusal goes to the tenant's action log
//!   (`customer_key.*`), naming the data key or version, never key material.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use space_core::{ErrorCode, TenantId};
use space_kms::{
    check_round_trip, unwrap_data_key, DataKey, KeyAccess, KeyCredentials, KeyService, KeyServices,
    KmsError,
};
use utoipa::ToSchema;

use super::Caller;
use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;
use crate::db::{
    now_ms, CustomerKeyRemoval, DataKeyRow, NewAuditRecord, StoredCustomerKey, StoredKeyVersion,
};

/// How long a passed check is trusted by default.
pub const DEFAULT_CHECK_TTL: Duration = Duration::from_secs(30);
/// Longest check TTL an operator may set.
pub const MAX_CHECK_TTL: Duration = Duration::from_secs(3600);
/// Tries of a call whose key service is unreachable, and the pause after each failure.
const ATTEMPTS: u32 = 3;
const RETRY_PAUSE: Duration = Duration::from_millis(300);
/// What a loan of an artifact key to a node lasts beyond two check TTLs.
const ARTIFACT_KEY_LOAN_MARGIN: Duration = Duration::from_secs(30);
/// The id of `tenant`'s artifact key among the data keys (ids are unique across tenants).
fn artifact_key_id(tenant: &TenantId) -> String {
    format!("ak-{tenant}")
}
/// Data keys re-wrapped per database round trip during a rotation.
const REWRAP_BATCH: i64 = 100;

/// The operator's key services and what this replica remembers of recent checks.
pub struct CustomerKeys {
    services: KeyServices,
    check_ttl: Duration,
    /// Tenant → the version that passed a check, and when.
    passed: Mutex<HashMap<TenantId, (i64, Instant)>>,
    /// Tenant → when the leader's watch last looked at its key (at most once per TTL,
    /// whatever the verdict: a revoked key is not asked about every second).
    watched: Mutex<HashMap<TenantId, Instant>>,
    /// Tenant → its artifact key, unwrapped, and when: kept in memory for at most the check
    /// TTL, dropped at once when a check fails.
    artifact_keys: Mutex<HashMap<TenantId, (DataKey, Instant)>>,
}

impl CustomerKeys {
    /// Keys at `services`, a passed check trusted for `check_ttl` (at most [`MAX_CHECK_TTL`]).
    pub fn new(services: KeyServices, check_ttl: Duration) -> CustomerKeys {
        CustomerKeys {
            services,
            check_ttl: check_ttl.min(MAX_CHECK_TTL),
            passed: Mutex::new(HashMap::new()),
            watched: Mutex::new(HashMap::new()),
            artifact_keys: Mutex::new(HashMap::new()),
        }
    }

    /// How long a node holds a tenant's artifact key once lent: the watch renews the loan
    /// about once per check TTL, so two TTLs and a margin outlast one missed renewal.
    pub fn artifact_key_loan(&self) -> Duration {
        self.check_ttl * 2 + ARTIFACT_KEY_LOAN_MARGIN
    }

    fn cached_artifact_key(&self, tenant: &TenantId) -> Option<DataKey> {
        let mut keys = self.artifact_keys.lock().unwrap_or_else(|p| p.into_inner());
        match keys.get(tenant) {
            Some((key, at)) if at.elapsed() < self.check_ttl => Some(key.duplicate()),
            Some(_) => {
                keys.remove(tenant);
                None
            }
            None => None,
        }
    }

    fn cache_artifact_key(&self, tenant: &TenantId, key: &DataKey) {
        let mut keys = self.artifact_keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.insert(tenant.clone(), (key.duplicate(), Instant::now()));
    }

    /// The key services.
    pub fn services(&self) -> &KeyServices {
        &self.services
    }

    fn passed_recently(&self, tenant: &TenantId, version: i64) -> bool {
        let passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
        passed
            .get(tenant)
            .is_some_and(|(v, at)| *v == version && at.elapsed() < self.check_ttl)
    }

    /// Whether the watch is due to look at `tenant`'s key (and notes that it does now).
    fn watch_due(&self, tenant: &TenantId) -> bool {
        let mut watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        let due = watched
            .get(tenant)
            .is_none_or(|at| at.elapsed() >= self.check_ttl);
        if due {
            watched.insert(tenant.clone(), Instant::now());
        }
        due
    }

    fn remember(&self, tenant: &TenantId, outcome: Option<i64>) {
        let mut passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Some(version) => {
                passed.insert(tenant.clone(), (version, Instant::now()));
            }
            None => {
                passed.remove(tenant);
                drop(passed);
                let mut keys = self.artifact_keys.lock().unwrap_or_else(|p| p.into_inner());
                keys.remove(tenant);
            }
        }
    }
}

/// `PUT /v1/customer-key`: the key to register.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomerKeyRequest {
    /// One of the operator's key services (`GET /v1/customer-key/services` lists them).
    pub provider: String,
    /// The key at that service: a KMIP unique identifier, a PKCS#11 key label, a helper's
    /// key id. Leave out for the local key service, which makes the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// PKCS#11: the label of the token the key is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// How SPACE authenticates: `{"kind": "client_certificate", "certificate_pem": …,
    /// "private_key_pem": …}` (KMIP), `{"kind": "pin", "pin": …}` (PKCS#11), or none.
    /// Write-only: never returned.
    #[serde(default)]
    pub credentials: KeyCredentials,
}

/// `POST /v1/customer-key/rotate`: the new version. What is left out is the current
/// version's (so `{}` re-wraps under the same key with a fresh version; the local key
/// service makes a new key either way).
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateRequest {
    /// Another of the operator's key services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The new key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// PKCS#11: its token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// New credentials (write-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<KeyCredentials>,
}

/// A version of a customer key, as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CustomerKeyVersion {
    /// 1, 2, …
    pub version: i64,
    /// Its key service.
    pub provider: String,
    /// The key's id there.
    pub key_id: String,
    /// PKCS#11: its token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The kind of credentials SPACE holds for it (`none`, `client_certificate`, `pin`).
    pub credentials: String,
    /// Data keys wrapped under it now.
    pub data_keys: u64,
    /// When it was added, ms since the Unix epoch.
    pub created_at_ms: i64,
}

/// `GET /v1/customer-key`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CustomerKeyView {
    /// The version new data keys are wrapped under.
    pub current_version: i64,
    /// Every version, oldest first.
    pub versions: Vec<CustomerKeyVersion>,
    /// When it was registered.
    pub created_at_ms: i64,
    /// When it last rotated.
    pub updated_at_ms: i64,
}

/// `POST /v1/customer-key/rotate`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Rotation {
    /// The key, its new version current.
    pub customer_key: CustomerKeyView,
    /// Data keys re-wrapped under the new version.
    pub rewrapped: u64,
    /// Data keys that could not be (their version's key is unavailable): they stay under
    /// their version, and a later rotation tries them again.
    pub not_rewrapped: u64,
}

/// One of the operator's key services.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KeyServiceInfo {
    /// Its name (what `provider` names).
    pub name: String,
    /// `kmip`, `pkcs11`, `command` or `local`.
    pub kind: String,
}

/// The associated data a version's sealed access is bound to.
fn access_aad(tenant: &TenantId, version: i64) -> Vec<u8> {
    format!("space-control/customer-key/v1:{tenant}:{version}").into_bytes()
}

/// The context a data key's wrap is bound to: its tenant and id.
fn data_key_context(tenant: &TenantId, id: &str) -> Vec<u8> {
    format!("space/data-key/v1:{tenant}:{id}").into_bytes()
}

/// The context of a check's throwaway key.
fn check_context(tenant: &TenantId) -> Vec<u8> {
    format!("space/check/v1:{tenant}").into_bytes()
}

/// How a customer key version is named in messages and the action log: never key material.
fn describe(v: &StoredKeyVersion) -> String {
    format!(
        "customer key version {} ({} key {:?})",
        v.version, v.provider, v.key_id
    )
}

/// A key service's failure as the API's error, naming the customer key version.
fn kms_error(v: &StoredKeyVersion, e: KmsError) -> ApiError {
    let what = describe(v);
    match e {
        KmsError::KeyUnavailable { reason, detail } => ApiError::new(
            ErrorCode::KeyUnavailable,
            format!("{what} is unavailable ({}): {detail}", reason.as_str()),
        ),
        KmsError::Unreachable(m) | KmsError::Protocol(m) => ApiError::new(
            ErrorCode::KeyServiceUnavailable,
            format!("the key service of {what} did not answer: {m}; retry later"),
        ),
        KmsError::WrappedKeyRejected => ApiError::new(
            ErrorCode::SnapshotCorrupt,
            format!("{what} refused a wrapped data key: it is damaged or not this tenant's"),
        ),
        KmsError::InvalidAccess(m) => ApiError::new(
            ErrorCode::KeyUnavailable,
            format!("{what} cannot be used: {m}"),
        ),
        KmsError::Config(m) => ApiError::new(
            ErrorCode::KeyServiceUnavailable,
            format!("the key service of {what} is misconfigured: {m}"),
        ),
    }
}

/// The outcome of a key service call, as the action log records it.
fn outcome(r: &Result<impl Sized, KmsError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(KmsError::KeyUnavailable { .. } | KmsError::InvalidAccess(_)) => "key_unavailable",
        Err(KmsError::WrappedKeyRejected) => "wrapped_key_rejected",
        Err(_) => "key_service_unavailable",
    }
}

async fn audit(st: &AppState, tenant: &TenantId, action: &str, target: &str, outcome: &str) {
    let record = NewAuditRecord {
        tenant,
        ts_ms: now_ms(),
        api_key_id: None,
        action,
        target,
        outcome,
        status: 0,
    };
    if let Err(e) = st.db.append_audit(&record).await {
        tracing::error!(%tenant, action, error = %e, "the action log could not record a key service call");
    }
}

/// Runs `call` until it succeeds or fails for a reason other than an unreachable service,
/// at most [`ATTEMPTS`] times.
async fn with_retries<T, F, Fut>(mut call: F) -> Result<T, KmsError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, KmsError>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Err(e) if e.is_retryable() && attempt < ATTEMPTS => {
                tracing::warn!(attempt, error = %e, "key service unreachable; retrying");
                tokio::time::sleep(RETRY_PAUSE * attempt).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// A version's key service and access, opened.
fn open_version<'a>(
    st: &'a AppState,
    tenant: &TenantId,
    v: &StoredKeyVersion,
) -> ApiResult<(&'a dyn KeyService, KeyAccess)> {
    let service = st.customer_keys.services.get(&v.provider).ok_or_else(|| {
        ApiError::new(
            ErrorCode::KeyServiceUnavailable,
            format!(
                "{}: key service {:?} is not configured on this replica",
                describe(v),
                v.provider
            ),
        )
    })?;
    let json = st
        .credential_sealer
        .open_bytes(&access_aad(tenant, v.version), &v.sealed_access)
        .map_err(|e| ApiError::internal(format!("{}: stored access: {e}", describe(v))))?;
    let access: KeyAccess = serde_json::from_slice(&json)
        .map_err(|e| ApiError::internal(format!("{}: stored access: {e}", describe(v))))?;
    Ok((service.as_ref(), access))
}

/// A new version `version` of `tenant`'s key at `provider`, checked with a round trip.
async fn checked_version(
    st: &AppState,
    tenant: &TenantId,
    version: i64,
    provider: &str,
    mut access: KeyAccess,
) -> ApiResult<StoredKeyVersion> {
    let service = st.customer_keys.services.get(provider).ok_or_else(|| {
        let names: Vec<&str> = st.customer_keys.services.list().map(|(n, _)| n).collect();
        ApiError::invalid(format!(
            "no key service {provider:?} (this server offers: {})",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        ))
    })?;
    if let Some(local) = st.customer_keys.services.local(provider) {
        // The local service's keys are SPACE's to make: a tenant never names one.
        if !access.key_id.is_empty() {
            return Err(ApiError::invalid(
                "the local key service makes its keys: leave key_id out",
            ));
        }
        access.key_id = format!("{tenant}-v{version}-{:08x}", rand::random::<u32>());
        local
            .create(&access.key_id)
            .map_err(|e| ApiError::internal(format!("local key service: {e}")))?;
    }
    if access.key_id.is_empty() {
        return Err(ApiError::invalid(format!(
            "key_id is required for key service {provider:?}"
        )));
    }
    access
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let stored = StoredKeyVersion {
        version,
        provider: provider.to_owned(),
        key_id: access.key_id.clone(),
        sealed_access: String::new(),
        created_at_ms: now_ms(),
    };
    let context = check_context(tenant);
    let checked = with_retries(|| check_round_trip(service.as_ref(), &access, &context)).await;
    audit(
        st,
        tenant,
        "customer_key.check",
        &describe(&stored),
        outcome(&checked),
    )
    .await;
    checked.map_err(|e| match e {
        // What the caller sent does not fit the service: its request is wrong.
        KmsError::InvalidAccess(m) => ApiError::invalid(format!("{}: {m}", describe(&stored))),
        e => kms_error(&stored, e),
    })?;
    let json = zeroize::Zeroizing::new(serde_json::to_vec(&access).map_err(ApiError::internal)?);
    Ok(StoredKeyVersion {
        sealed_access: st
            .credential_sealer
            .seal_bytes(&access_aad(tenant, version), &json)?,
        ..stored
    })
}

async fn view_of(st: &AppState, key: &StoredCustomerKey) -> ApiResult<CustomerKeyView> {
    let counts = st.db.data_key_counts(&key.tenant).await?;
    let mut versions = Vec::with_capacity(key.versions.len());
    for v in &key.versions {
        // What kind of credentials and which token: from the sealed access (never shown).
        let (token, credentials) = match open_version(st, &key.tenant, v) {
            Ok((_, access)) => (access.token, access.credentials.kind().to_owned()),
            Err(_) => (None, "unknown".to_owned()),
        };
        versions.push(CustomerKeyVersion {
            version: v.version,
            provider: v.provider.clone(),
            key_id: v.key_id.clone(),
            token,
            credentials,
            data_keys: counts
                .iter()
                .find(|(version, _)| *version == v.version)
                .map_or(0, |(_, n)| *n),
            created_at_ms: v.created_at_ms,
        });
    }
    Ok(CustomerKeyView {
        current_version: key.current_version,
        versions,
        created_at_ms: key.created_at_ms,
        updated_at_ms: key.updated_at_ms,
    })
}

fn no_key(tenant: &TenantId) -> ApiError {
    ApiError::not_found(format!(
        "tenant {tenant} has no customer key (register one: PUT /v1/customer-key)"
    ))
}

async fn load(st: &AppState, tenant: &TenantId) -> ApiResult<StoredCustomerKey> {
    st.db
        .customer_key(tenant)
        .await?
        .ok_or_else(|| no_key(tenant))
}

/// The operator's key services.
pub fn services(st: &AppState) -> Vec<KeyServiceInfo> {
    st.customer_keys
        .services
        .list()
        .map(|(name, kind)| KeyServiceInfo {
            name: name.to_owned(),
            kind: kind.to_owned(),
        })
        .collect()
}

/// Registers the caller's customer key.
pub async fn register(
    st: &AppState,
    caller: &Caller,
    req: CustomerKeyRequest,
) -> ApiResult<CustomerKeyView> {
    if st.db.customer_key(&caller.id).await?.is_some() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "this tenant has a customer key: rotate it (POST /v1/customer-key/rotate), or remove it first",
        ));
    }
    let access = KeyAccess {
        key_id: req.key_id.unwrap_or_default(),
        token: req.token,
        credentials: req.credentials,
    };
    let first = checked_version(st, &caller.id, 1, &req.provider, access).await?;
    st.db.insert_customer_key(&caller.id, &first).await?;
    st.customer_keys.remember(&caller.id, Some(1));
    // What the tenant stored before is sealed under the new key too.
    let resealed = super::credentials::reseal_under_customer_key(st, &caller.id).await?;
    if resealed > 0 {
        tracing::info!(tenant = %caller.id, resealed, "credential values sealed under the new customer key");
    }
    view_of(st, &load(st, &caller.id).await?).await
}

/// The caller's customer key.
pub async fn get(st: &AppState, caller: &Caller) -> ApiResult<CustomerKeyView> {
    view_of(st, &load(st, &caller.id).await?).await
}

/// Checks the caller's customer key now (no cached check counts).
pub async fn check_now(st: &AppState, caller: &Caller) -> ApiResult<CustomerKeyView> {
    let key = load(st, &caller.id).await?;
    check(st, &key).await?;
    view_of(st, &key).await
}

/// Removes the caller's customer key: only once no data key is wrapped under it (else its
/// artifacts could never be opened again).
pub async fn remove(st: &AppState, caller: &Caller) -> ApiResult<()> {
    release_artifact_key(st, &caller.id).await?;
    match st.db.remove_customer_key(&caller.id).await? {
        CustomerKeyRemoval::Removed => {
            st.customer_keys.remember(&caller.id, None);
            Ok(())
        }
        CustomerKeyRemoval::NotFound => Err(no_key(&caller.id)),
        CustomerKeyRemoval::InUse(n) => Err(ApiError::new(
            ErrorCode::Conflict,
            format!("{n} artifacts are sealed under data keys of this customer key: delete them first (snapshots, suspended sandboxes, credentials)"),
        )),
    }
}

/// Forgets `tenant`'s artifact key once nothing can be sealed under it any more: no live
/// sandbox (which may checkpoint or hold checkpoints), no snapshot in object storage, no
/// persistent snapshot on a node. Otherwise it stays, and the removal that follows is
/// refused for it.
async fn release_artifact_key(st: &AppState, tenant: &TenantId) -> ApiResult<()> {
    let id = artifact_key_id(tenant);
    if st.db.data_key(tenant, &id).await?.is_none() {
        return Ok(());
    }
    let live = st
        .db
        .sandboxes(tenant, crate::db::SandboxFilter::Live)
        .await?;
    let stored = st.db.stored_persistents(tenant).await?;
    if !live.is_empty() || !stored.is_empty() {
        return Ok(());
    }
    for node in st.nodes.all() {
        if !node.tenant_snapshots(tenant).await?.is_empty() {
            return Ok(());
        }
    }
    withdraw_everywhere(st, tenant).await;
    st.db.delete_data_key(tenant, &id).await?;
    st.customer_keys.remember(tenant, None);
    Ok(())
}

/// Adds a version to the caller's customer key and re-wraps every data key under it.
pub async fn rotate(st: &AppState, caller: &Caller, req: RotateRequest) -> ApiResult<Rotation> {
    let key = load(st, &caller.id).await?;
    let current = key
        .current()
        .ok_or_else(|| ApiError::internal("the customer key has no current version"))?;
    let (_, mut access) = open_version(st, &caller.id, current)?;
    let provider = req.provider.unwrap_or_else(|| current.provider.clone());
    let provider_changed = provider != current.provider;
    if let Some(id) = req.key_id {
        access.key_id = id;
    } else if provider_changed || st.customer_keys.services.local(&provider).is_some() {
        access.key_id = String::new();
    }
    if req.token.is_some() || provider_changed {
        access.token = req.token;
    }
    if let Some(credentials) = req.credentials {
        access.credentials = credentials;
    } else if provider_changed {
        access.credentials = KeyCredentials::None;
    }
    let next = key.current_version + 1;
    let version = checked_version(st, &caller.id, next, &provider, access).await?;
    if !st
        .db
        .add_customer_key_version(&caller.id, key.current_version, &version)
        .await?
    {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "the customer key rotated meanwhile: read it again and retry",
        ));
    }
    st.customer_keys.remember(&caller.id, Some(next));
    let (rewrapped, not_rewrapped) = rewrap_all(st, &caller.id).await?;
    let key = load(st, &caller.id).await?;
    Ok(Rotation {
        customer_key: view_of(st, &key).await?,
        rewrapped,
        not_rewrapped,
    })
}

/// Re-wraps every data key of `tenant` not under its current version: `(done, failed)`.
async fn rewrap_all(st: &AppState, tenant: &TenantId) -> ApiResult<(u64, u64)> {
    let key = load(st, tenant).await?;
    let current = key
        .current()
        .ok_or_else(|| ApiError::internal("the customer key has no current version"))?;
    let (to_service, to_access) = open_version(st, tenant, current)?;
    let (mut done, mut failed) = (0u64, 0u64);
    let mut skip: std::collections::HashSet<String> = Default::default();
    loop {
        let batch = st
            .db
            .data_keys_not_under(
                tenant,
                key.current_version,
                REWRAP_BATCH + skip.len() as i64,
            )
            .await?;
        let batch: Vec<DataKeyRow> = batch
            .into_iter()
            .filter(|r| !skip.contains(&r.id))
            .collect();
        if batch.is_empty() {
            return Ok((done, failed));
        }
        for row in batch {
            let target = format!("data key {} ({})", row.id, row.artifact);
            let Some(from) = key.version(row.key_version) else {
                failed += 1;
                skip.insert(row.id);
                continue;
            };
            let context = data_key_context(tenant, &row.id);
            let unwrapped = match open_version(st, tenant, from) {
                Ok((service, access)) => match B64.decode(&row.wrapped) {
                    Ok(wrapped) => {
                        with_retries(|| unwrap_data_key(service, &access, &wrapped, &context)).await
                    }
                    Err(_) => Err(KmsError::WrappedKeyRejected),
                },
                Err(e) => Err(KmsError::Config(e.body.message)),
            };
            audit(
                st,
                tenant,
                "customer_key.unwrap",
                &target,
                outcome(&unwrapped),
            )
            .await;
            let Ok(data_key) = unwrapped else {
                failed += 1;
                skip.insert(row.id);
                continue;
            };
            let wrapped = with_retries(|| to_service.wrap(&to_access, &data_key, &context)).await;
            audit(st, tenant, "customer_key.wrap", &target, outcome(&wrapped)).await;
            let Ok(wrapped) = wrapped else {
                failed += 1;
                skip.insert(row.id);
                continue;
            };
            if st
                .db
                .rewrap_data_key(
                    &row.id,
                    row.key_version,
                    key.current_version,
                    &B64.encode(wrapped),
                )
                .await?
            {
                done += 1;
            }
        }
    }
}

/// Checks `key`'s current version with its key service (a round trip), remembering a pass.
async fn check(st: &AppState, key: &StoredCustomerKey) -> ApiResult<()> {
    let v = key
        .current()
        .ok_or_else(|| ApiError::internal("the customer key has no current version"))?;
    let (service, access) = open_version(st, &key.tenant, v)?;
    let context = check_context(&key.tenant);
    let result = with_retries(|| check_round_trip(service, &access, &context)).await;
    audit(
        st,
        &key.tenant,
        "customer_key.check",
        &describe(v),
        outcome(&result),
    )
    .await;
    match result {
        Ok(()) => {
            st.customer_keys.remember(&key.tenant, Some(v.version));
            Ok(())
        }
        Err(e) => {
            st.customer_keys.remember(&key.tenant, None);
            Err(kms_error(v, e))
        }
    }
}

/// The revocation gate: `Ok` if `tenant` has no customer key, or its key passed a check
/// within the check TTL (else it is checked now). Every start, resume, restore and
/// create-from-snapshot of the tenant passes here first.
pub async fn require_usable(st: &AppState, tenant: &TenantId) -> ApiResult<()> {
    let Some(key) = st.db.customer_key(tenant).await? else {
        return Ok(());
    };
    if st
        .customer_keys
        .passed_recently(tenant, key.current_version)
    {
        return Ok(());
    }
    check(st, &key).await
}

/// The leader's watch over customer keys (each reconciler pass): every tenant's key is
/// checked once its last passed check is older than the check TTL. A usable key has the
/// loan of the tenant's artifact key renewed on the nodes of its live sandboxes (a node that
/// restarted gets it back). A key found unavailable has the artifact key withdrawn from every node, and the
/// tenant's credential values dropped from them at once — they are under data keys nobody
/// can open any more — instead of at the nodes' next sync. A key service that does not
/// answer changes nothing (the loans run out by themselves).
pub async fn watch(st: &AppState) -> ApiResult<()> {
    for tenant in st.db.tenants_with_customer_keys().await? {
        if !st.customer_keys.watch_due(&tenant) {
            continue;
        }
        match require_usable(st, &tenant).await {
            Ok(()) => lend_to_its_nodes(st, &tenant).await,
            Err(e) if e.body.code == ErrorCode::KeyUnavailable => {
                withdraw_everywhere(st, &tenant).await;
                let dropped = super::credentials::drop_from_nodes(st, &tenant).await?;
                tracing::warn!(%tenant, dropped, reason = %e.body.message, "customer key unavailable: the tenant's artifact key withdrawn and its credential values dropped from every node");
            }
            Err(e) => {
                tracing::warn!(%tenant, error = %e.body.message, "customer key could not be checked")
            }
        }
    }
    Ok(())
}

/// Renews the loan of `tenant`'s artifact key on the nodes its live sandboxes are on (and
/// no other: a node holds a tenant's key only while it holds the tenant's sandboxes).
async fn lend_to_its_nodes(st: &AppState, tenant: &TenantId) {
    let nodes: std::collections::BTreeSet<String> = match st
        .db
        .sandboxes(tenant, crate::db::SandboxFilter::Live)
        .await
    {
        Ok(rows) => rows
            .into_iter()
            .filter(|r| r.suspended_snapshot.is_none())
            .map(|r| r.node)
            .collect(),
        Err(e) => {
            tracing::warn!(%tenant, error = %e, "cannot list the tenant's sandboxes to renew its loans");
            return;
        }
    };
    if nodes.is_empty() {
        // Nothing to renew; and no artifact key is made for a tenant with no sandbox.
        return;
    }
    let key = match artifact_key(st, tenant).await {
        Ok(Some(key)) => key,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(%tenant, error = %e.body.message, "cannot renew the loans of the tenant's artifact key");
            return;
        }
    };
    let loan = st.customer_keys.artifact_key_loan();
    let key = &key;
    let lent = nodes.iter().map(|name| async move {
        let result = match st.nodes.get(name) {
            Ok(node) => node.lend_artifact_key(tenant, key, loan).await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(%tenant, node = %name, error = %e, "node missed the renewal of an artifact key loan");
        }
    });
    futures::future::join_all(lent).await;
}

async fn withdraw_everywhere(st: &AppState, tenant: &TenantId) {
    let tenant = Arc::new(tenant.clone());
    super::credentials::to_every_node(st, "artifact key", move |node| {
        let tenant = tenant.clone();
        async move { node.withdraw_artifact_key(&tenant).await }
    })
    .await;
}

/// `tenant`'s artifact key (made, wrapped under its customer key, at first need), or `None`
/// if it has no customer key. Kept unwrapped in this replica's memory for the check TTL.
async fn artifact_key(st: &AppState, tenant: &TenantId) -> ApiResult<Option<DataKey>> {
    if let Some(key) = st.customer_keys.cached_artifact_key(tenant) {
        return Ok(Some(key));
    }
    let Some(customer_key) = st.db.customer_key(tenant).await? else {
        return Ok(None);
    };
    let id = artifact_key_id(tenant);
    let key = match st.db.data_key(tenant, &id).await? {
        Some(_) => open_data_key(st, tenant, &id).await?,
        None => {
            let made =
                wrap_new_data_key(st, &customer_key, id.clone(), "sandbox artifacts at rest").await;
            match made {
                Ok(key) => key,
                // Another replica made it first: theirs is the one.
                Err(_) if st.db.data_key(tenant, &id).await?.is_some() => {
                    open_data_key(st, tenant, &id).await?
                }
                Err(e) => return Err(e),
            }
        }
    };
    st.customer_keys.cache_artifact_key(tenant, &key);
    Ok(Some(key))
}

/// Lends `tenant`'s artifact key to `node` before an operation that may write or read the
/// tenant's artifacts at rest there (create, resume, restore, fork, checkpoint, suspend).
/// `Ok(true)`: the tenant has a customer key, and the sandbox is to be sealed at rest;
/// `Ok(false)`: it has none.
pub async fn lend_artifact_key(
    st: &AppState,
    tenant: &TenantId,
    node: &dyn space_node_proto::api::NodeApi,
) -> ApiResult<bool> {
    let Some(key) = artifact_key(st, tenant).await? else {
        return Ok(false);
    };
    node.lend_artifact_key(tenant, &key, st.customer_keys.artifact_key_loan())
        .await?;
    Ok(true)
}

/// A fresh data key for `artifact` of `tenant`, wrapped under its customer key's current
/// version and stored wrapped: `(id, plaintext)`. `None`: the tenant has no customer key
/// (its artifacts are not sealed under one).
pub async fn new_data_key(
    st: &AppState,
    tenant: &TenantId,
    artifact: &str,
) -> ApiResult<Option<(String, DataKey)>> {
    let Some(key) = st.db.customer_key(tenant).await? else {
        return Ok(None);
    };
    let id = format!("dk-{}", hex::encode(rand::random::<[u8; 16]>()));
    let data_key = wrap_new_data_key(st, &key, id.clone(), artifact).await?;
    Ok(Some((id, data_key)))
}

/// A fresh data key `id` for `artifact`, wrapped under `key`'s current version and stored
/// wrapped.
async fn wrap_new_data_key(
    st: &AppState,
    key: &StoredCustomerKey,
    id: String,
    artifact: &str,
) -> ApiResult<DataKey> {
    let tenant = &key.tenant;
    let v = key
        .current()
        .ok_or_else(|| ApiError::internal("the customer key has no current version"))?;
    let (service, access) = open_version(st, tenant, v)?;
    let data_key = DataKey::generate();
    let context = data_key_context(tenant, &id);
    let wrapped = with_retries(|| service.wrap(&access, &data_key, &context)).await;
    let target = format!("data key {id} ({artifact})");
    audit(st, tenant, "customer_key.wrap", &target, outcome(&wrapped)).await;
    let wrapped = wrapped.map_err(|e| kms_error(v, e))?;
    st.db
        .insert_data_key(&DataKeyRow {
            id,
            tenant: tenant.clone(),
            key_version: v.version,
            wrapped: B64.encode(wrapped),
            artifact: artifact.to_owned(),
            created_at_ms: now_ms(),
        })
        .await?;
    Ok(data_key)
}

/// Data key `id` of `tenant`, unwrapped by the customer key version that wrapped it.
pub async fn open_data_key(st: &AppState, tenant: &TenantId, id: &str) -> ApiResult<DataKey> {
    let row = st
        .db
        .data_key(tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("data key {id}")))?;
    let key = load(st, tenant).await?;
    let v = key.version(row.key_version).ok_or_else(|| {
        ApiError::internal(format!(
            "data key {id} names version {} of a customer key that has none",
            row.key_version
        ))
    })?;
    let (service, access) = open_version(st, tenant, v)?;
    let wrapped = B64
        .decode(&row.wrapped)
        .map_err(|_| kms_error(v, KmsError::WrappedKeyRejected))?;
    let context = data_key_context(tenant, id);
    let result = with_retries(|| unwrap_data_key(service, &access, &wrapped, &context)).await;
    let target = format!("data key {id} ({})", row.artifact);
    audit(st, tenant, "customer_key.unwrap", &target, outcome(&result)).await;
    result.map_err(|e| kms_error(v, e))
}

/// Forgets data key `id` once its artifact is gone.
pub async fn forget_data_key(st: &AppState, tenant: &TenantId, id: &str) -> ApiResult<()> {
    st.db.delete_data_key(tenant, id).await?;
    Ok(())
}

//! The credential manager: the one object the node and the gateway use. It keeps every
//! credential's metadata in memory (loaded from the backend at start, updated on put and
//! delete), resolves requests ([`crate::resolve`]), applies rate limits
//! ([`crate::ratelimit`]), fetches values through a short TTL cache ([`crate::cache`]),
//! rewrites requests ([`crate::inject`]) and records everything in the audit log
//! ([`crate::audit`]).
//!
//! Audit failures fail closed: if an event cannot be written, the request is denied
//! ([`DenyReason::AuditUnavailable`]) — credentials are not used unaudited.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use http::request::Parts;
use space_core::id::{SandboxId, TenantId};

use crate::audit::{AuditDecision, AuditEvent, AuditKind, AuditLog};
use crate::backend::{BackendError, SecretBackend};
use crate::cache::{ValueCache, DEFAULT_CACHE_TTL};
use crate::egress::Hostname;
use crate::inject::{self, InjectionPlan, KnownPlaceholder, PlannedInjection};
use crate::lock;
use crate::model::{Credential, CredentialId, CredentialName, ProjectId, ValidationError};
use crate::placeholder::{Placeholder, PlaceholderKey};
use crate::ratelimit::RateLimiter;
use crate::resolve::{
    self, CredentialRef, Denial, DenyReason, Entry, Grant, RequestContext, Resolution,
};
use crate::rule::{CompiledInjection, RateLimit};
use crate::scrub::Scrubber;
use crate::secret::{SecretError, SecretValue};
use crate::store::MAX_STORED_CREDENTIALS;

/// Most credentials one manager holds (all tenants together).
pub const MAX_CREDENTIALS: usize = MAX_STORED_CREDENTIALS;

/// Tunables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// How long a fetched value is reused (see [`crate::cache`]).
    pub cache_ttl: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            cache_ttl: DEFAULT_CACHE_TTL,
        }
    }
}

/// Why a management operation (load, put, delete) failed.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The credential is not acceptable.
    #[error("invalid credential: {0}")]
    Invalid(#[from] ValidationError),
    /// The value is not acceptable for this credential.
    #[error("invalid value: {0}")]
    Value(#[from] SecretError),
    /// Another credential has the same name in the same scope.
    #[error("credential {existing} is already named {name} in scope {scope}")]
    Duplicate {
        /// The name.
        name: CredentialName,
        /// The scope.
        scope: String,
        /// The credential that has it.
        existing: CredentialId,
    },
    /// No such credential.
    #[error("credential {0} not found")]
    NotFound(CredentialId),
    /// Too many credentials.
    #[error("more than {MAX_CREDENTIALS} credentials")]
    TooMany,
}

/// The credential manager (see the module doc).
pub struct CredentialManager {
    backend: Arc<dyn SecretBackend>,
    entries: RwLock<Arc<Vec<Arc<Entry>>>>,
    cache: Mutex<ValueCache>,
    /// One async lock per credential: concurrent misses fetch once; put waits for fetches.
    fetch_locks: Mutex<HashMap<CredentialId, Arc<tokio::sync::Mutex<()>>>>,
    limiter: Mutex<RateLimiter>,
    placeholder_key: PlaceholderKey,
    audit: Option<Arc<AuditLog>>,
    /// Serialises put and delete (uniqueness check, backend write, metadata update).
    write_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for CredentialManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialManager")
            .field("backend", &self.backend.kind())
            .field("credentials", &self.snapshot().len())
            .field("audit", &self.audit)
            .finish()
    }
}

fn compile(credential: Credential) -> Result<Arc<Entry>, ValidationError> {
    credential.validate()?;
    let rule = credential.rule.compile()?;
    Ok(Arc::new(Entry { credential, rule }))
}

/// Checks what [`CredentialManager::put`] checks of one credential and its value, without a
/// manager: every field, the rule, and a header-safe value for a header injection. The
/// control plane checks a credential this way before it enters the catalog, so a node
/// never refuses one it is given.
pub fn check_storable(credential: &Credential, value: &SecretValue) -> Result<(), ManagerError> {
    let entry = compile(credential.clone())?;
    if matches!(entry.rule.injection, CompiledInjection::Header { .. }) {
        value.check_header_safe()?;
    }
    Ok(())
}

fn duplicate_of<'a>(entries: &'a [Arc<Entry>], c: &Credential) -> Option<&'a Arc<Entry>> {
    entries.iter().find(|e| {
        e.credential.id != c.id && e.credential.name == c.name && e.credential.scope == c.scope
    })
}

/// What [`CredentialManager::authorize_request`] let through.
#[derive(Debug, Default)]
pub struct Authorized {
    /// The credentials injected (none: the request goes as the guest sent it).
    pub credentials: Vec<CredentialRef>,
    /// Masks their values in the response (`None`: nothing to mask).
    pub scrubber: Option<Arc<Scrubber>>,
}

impl CredentialManager {
    /// Loads every credential's metadata from `backend`. Fails on any invalid credential or
    /// two credentials with the same name and scope (fail closed: fix the store first).
    pub async fn load(
        backend: Arc<dyn SecretBackend>,
        placeholder_key: PlaceholderKey,
        config: ManagerConfig,
    ) -> Result<Self, ManagerError> {
        let listed = backend.list_metadata().await?;
        if listed.len() > MAX_CREDENTIALS {
            return Err(ManagerError::TooMany);
        }
        let mut entries: Vec<Arc<Entry>> = Vec::with_capacity(listed.len());
        for credential in listed {
            if let Some(dup) = duplicate_of(&entries, &credential) {
                return Err(ManagerError::Duplicate {
                    name: credential.name.clone(),
                    scope: credential.scope.to_string(),
                    existing: dup.credential.id.clone(),
                });
            }
            entries.push(compile(credential)?);
        }
        tracing::info!(
            backend = backend.kind(),
            credentials = entries.len(),
            "credential manager loaded"
        );
        Ok(Self {
            backend,
            entries: RwLock::new(Arc::new(entries)),
            cache: Mutex::new(ValueCache::new(config.cache_ttl)),
            fetch_locks: Mutex::new(HashMap::new()),
            limiter: Mutex::new(RateLimiter::new()),
            placeholder_key,
            audit: None,
            write_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Records decisions in `audit`.
    pub fn with_audit(mut self, audit: Arc<AuditLog>) -> Self {
        self.audit = Some(audit);
        self
    }

    fn snapshot(&self) -> Arc<Vec<Arc<Entry>>> {
        Arc::clone(&self.entries.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn replace_entries(&self, entries: Vec<Arc<Entry>>) {
        *self.entries.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(entries);
    }

    fn fetch_lock(&self, id: &CredentialId) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(lock(&self.fetch_locks).entry(id.clone()).or_default())
    }

    /// Every credential's metadata, ordered by tenant, name and scope.
    pub fn list(&self) -> Vec<Credential> {
        let mut out: Vec<Credential> = self
            .snapshot()
            .iter()
            .map(|e| e.credential.clone())
            .collect();
        out.sort_by(|a, b| {
            (a.scope.tenant(), &a.name, a.scope.specificity(), &a.id).cmp(&(
                b.scope.tenant(),
                &b.name,
                b.scope.specificity(),
                &b.id,
            ))
        });
        out
    }

    /// One credential's metadata.
    pub fn get(&self, id: &CredentialId) -> Option<Credential> {
        self.snapshot()
            .iter()
            .find(|e| &e.credential.id == id)
            .map(|e| e.credential.clone())
    }

    /// Creates or replaces (same id) a credential. The value must be header-safe if the
    /// credential is injected as a header; names are unique per scope.
    pub async fn put(
        &self,
        credential: Credential,
        value: SecretValue,
    ) -> Result<(), ManagerError> {
        let entry = compile(credential)?;
        if matches!(entry.rule.injection, CompiledInjection::Header { .. }) {
            value.check_header_safe()?;
        }
        let c = &entry.credential;
        let _write = self.write_lock.lock().await;
        let entries = self.snapshot();
        if let Some(dup) = duplicate_of(&entries, c) {
            return Err(ManagerError::Duplicate {
                name: c.name.clone(),
                scope: c.scope.to_string(),
                existing: dup.credential.id.clone(),
            });
        }
        let replacing = entries.iter().any(|e| e.credential.id == c.id);
        if !replacing && entries.len() >= MAX_CREDENTIALS {
            return Err(ManagerError::TooMany);
        }
        {
            let fetch_lock = self.fetch_lock(&c.id);
            let _fetch = fetch_lock.lock().await;
            self.backend.put(c, &value).await?;
            lock(&self.cache).remove(&c.id);
        }
        let mut next: Vec<Arc<Entry>> = entries
            .iter()
            .filter(|e| e.credential.id != c.id)
            .cloned()
            .collect();
        tracing::info!(credential = %c.id, name = %c.name, scope = %c.scope, backend = self.backend.kind(), replaced = replacing, "credential stored");
        next.push(Arc::clone(&entry));
        self.replace_entries(next);
        Ok(())
    }

    /// Deletes a credential.
    pub async fn delete(&self, id: &CredentialId) -> Result<(), ManagerError> {
        let _write = self.write_lock.lock().await;
        let entries = self.snapshot();
        if !entries.iter().any(|e| &e.credential.id == id) {
            return Err(ManagerError::NotFound(id.clone()));
        }
        {
            let fetch_lock = self.fetch_lock(id);
            let _fetch = fetch_lock.lock().await;
            match self.backend.delete(id).await {
                Ok(()) | Err(BackendError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            lock(&self.cache).remove(id);
        }
        lock(&self.fetch_locks).remove(id);
        lock(&self.limiter).remove(id);
        self.replace_entries(
            entries
                .iter()
                .filter(|e| &e.credential.id != id)
                .cloned()
                .collect(),
        );
        tracing::info!(credential = %id, "credential deleted");
        Ok(())
    }

    /// The placeholders the node puts into `sandbox`'s environment: one per credential name
    /// visible to the sandbox (most specific scope) whose rule asks for one, in name order.
    pub fn placeholders(
        &self,
        tenant: &TenantId,
        project: Option<&ProjectId>,
        sandbox: &SandboxId,
    ) -> Vec<(CredentialName, Placeholder)> {
        let entries = self.snapshot();
        let Ok(winners) = resolve::winners(&entries, tenant, project, sandbox) else {
            return Vec::new();
        };
        winners
            .into_iter()
            .filter(|(_, e)| e.rule.placeholder)
            .map(|(name, _)| {
                (
                    name.clone(),
                    self.placeholder_key.placeholder(sandbox, name),
                )
            })
            .collect()
    }

    /// Whether a credential visible to `sandbox` — for each name, the one of the most specific
    /// scope, as [`CredentialManager::resolve`] picks it — has a host pattern matching `host`.
    /// Expired credentials count: requests to their hosts must reach [`Self::resolve`] and be
    /// refused, not go by without them.
    ///
    /// For the gateway deciding whether to terminate a connection: it reads the metadata in
    /// memory only (no backend call, no audit event, no rate-limit token). Should two
    /// credentials share a name and scope (which [`Self::put`] and [`Self::load`] prevent),
    /// every credential covering the sandbox counts, so that the requests reach
    /// [`Self::resolve`], which refuses them.
    pub fn applies_to_host(
        &self,
        tenant: &TenantId,
        project: Option<&ProjectId>,
        sandbox: &SandboxId,
        host: &Hostname,
    ) -> bool {
        let entries = self.snapshot();
        match resolve::winners(&entries, tenant, project, sandbox) {
            Ok(winners) => winners.values().any(|e| e.rule.matches_host(host)),
            Err(_) => entries.iter().any(|e| {
                e.credential.scope.covers(tenant, project, sandbox) && e.rule.matches_host(host)
            }),
        }
    }

    /// Decides which credentials `ctx` gets (see [`crate::resolve`]), charges their rate
    /// limits and audits the outcome. Call once per request: it consumes rate-limit tokens.
    pub fn resolve(&self, ctx: &RequestContext<'_>) -> Resolution {
        let entries = self.snapshot();
        let resolution = match resolve::applicable(&entries, ctx) {
            Err(denial) => Resolution::Deny(denial),
            Ok(applicable) => {
                let limited: Vec<(&Arc<Entry>, RateLimit)> = applicable
                    .iter()
                    .filter_map(|e| e.rule.rate_limit.map(|l| (e, l)))
                    .collect();
                let wanted: Vec<(&CredentialId, RateLimit)> = limited
                    .iter()
                    .map(|(e, l)| (&e.credential.id, *l))
                    .collect();
                let charged = lock(&self.limiter).try_acquire_all(&wanted, ctx.now_ms);
                match charged.map_err(|i| limited.get(i)) {
                    Err(Some((e, l))) => Resolution::Deny(Denial::of(
                        &e.credential,
                        DenyReason::RateLimited {
                            requests: l.requests,
                            per_secs: l.per_secs,
                        },
                    )),
                    // Unreachable (the index comes from `wanted`); fail closed regardless.
                    Err(None) => Resolution::Deny(Denial::bare(DenyReason::BadRequest(
                        "rate limiter returned an unknown credential".into(),
                    ))),
                    Ok(()) => Resolution::Allow(
                        applicable
                            .into_iter()
                            .map(|entry| Grant { entry })
                            .collect(),
                    ),
                }
            }
        };
        let events: Vec<AuditEvent> = match &resolution {
            Resolution::Deny(d) => vec![self.deny_event(ctx, d)],
            Resolution::Allow(grants) => grants
                .iter()
                .map(|g| {
                    event(
                        ctx,
                        AuditKind::Resolve,
                        AuditDecision::Allow,
                        Some(&CredentialRef::of(g.credential())),
                        None,
                    )
                })
                .collect(),
        };
        if let Err(denial) = self.record(ctx, &events) {
            return Resolution::Deny(denial);
        }
        if let Resolution::Deny(d) = &resolution {
            log_denial(ctx, d);
        }
        resolution
    }

    /// The gateway's entry point: resolves `ctx`, fetches the values, and rewrites `parts`
    /// for upstream (see [`crate::inject`]). `ctx.method` and `ctx.path` must be the
    /// request's. Returns the credentials injected (none: forward unchanged) with the
    /// scrubber their values must be masked from the response with, or why the request
    /// must be refused (then `parts` must not be sent). Everything is audited.
    pub async fn authorize_request(
        &self,
        ctx: &RequestContext<'_>,
        parts: &mut Parts,
    ) -> Result<Authorized, Denial> {
        if parts.method != *ctx.method || parts.uri.path() != ctx.path {
            let denial = Denial::bare(DenyReason::BadRequest(
                "request method or path differs from its context".into(),
            ));
            return Err(self.deny(ctx, denial));
        }
        let grants = match self.resolve(ctx) {
            Resolution::Allow(grants) => grants,
            Resolution::Deny(denial) => return Err(denial),
        };
        let mentions = inject::mentions_placeholder(parts);
        if grants.is_empty() && !mentions {
            return Ok(Authorized::default());
        }
        let mut plan = InjectionPlan::default();
        for grant in &grants {
            let c = grant.credential();
            let value = match self.value(c, ctx.now_ms).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(credential = %c.id, name = %c.name, backend = self.backend.kind(), error = %e, "credential value unavailable");
                    return Err(self.deny(
                        ctx,
                        Denial::of(c, DenyReason::ValueUnavailable(e.to_string())),
                    ));
                }
            };
            plan.injections.push(PlannedInjection {
                credential: CredentialRef::of(c),
                injection: grant.entry.rule.injection.clone(),
                value,
            });
        }
        if mentions {
            plan.placeholders = self.known_placeholders(ctx, &grants);
        }
        match inject::apply(parts, &plan) {
            Err(denial) => Err(self.deny(ctx, denial)),
            Ok(injected) => {
                let events: Vec<AuditEvent> = injected
                    .iter()
                    .map(|c| event(ctx, AuditKind::Inject, AuditDecision::Allow, Some(c), None))
                    .collect();
                self.record(ctx, &events)?;
                for c in &injected {
                    tracing::debug!(sandbox = %ctx.sandbox, host = %ctx.host, credential = %c.id, name = %c.name, "credential injected");
                }
                let scrubber = Scrubber::new(
                    plan.injections
                        .iter()
                        .filter(|i| injected.contains(&i.credential))
                        .map(|i| i.value.expose().as_bytes()),
                );
                Ok(Authorized {
                    credentials: injected,
                    scrubber,
                })
            }
        }
    }

    /// The sandbox's placeholders, each marked with its grant for this request, if any.
    fn known_placeholders(
        &self,
        ctx: &RequestContext<'_>,
        grants: &[Grant],
    ) -> Vec<KnownPlaceholder> {
        let entries = self.snapshot();
        let Ok(winners) = resolve::winners(&entries, ctx.tenant, ctx.project, ctx.sandbox) else {
            return Vec::new();
        };
        // The sandbox's own placeholder of each credential, and the ones its inherited
        // processes hold (of the sandboxes its memory came from), all standing for it.
        let holders: Vec<&SandboxId> = std::iter::once(ctx.sandbox)
            .chain(ctx.inherited_from)
            .collect();
        winners
            .into_values()
            .filter(|e| e.rule.placeholder)
            .flat_map(|e| {
                let granted = grants
                    .iter()
                    .position(|g| g.credential().id == e.credential.id);
                holders.iter().map(move |holder| KnownPlaceholder {
                    placeholder: self.placeholder_key.placeholder(holder, &e.credential.name),
                    credential: CredentialRef::of(&e.credential),
                    granted,
                })
            })
            .collect()
    }

    /// Every credential with its value. For one use: handing the credentials a node kept
    /// on its own (before the control plane kept a catalog) to that catalog, in the same
    /// process. No protocol carries a value out of a node.
    pub async fn export(&self) -> Result<Vec<(Credential, SecretValue)>, BackendError> {
        let mut out = Vec::new();
        for entry in self.snapshot().iter() {
            let value = self.backend.get(&entry.credential).await?;
            out.push((entry.credential.clone(), value));
        }
        Ok(out)
    }

    /// A credential's value, from the cache or (once per TTL, one fetch at a time) the backend.
    async fn value(
        &self,
        credential: &Credential,
        now_ms: i64,
    ) -> Result<Arc<SecretValue>, BackendError> {
        let id = &credential.id;
        if let Some(v) = lock(&self.cache).get(id, now_ms) {
            return Ok(v);
        }
        let fetch_lock = self.fetch_lock(id);
        let _fetch = fetch_lock.lock().await;
        if let Some(v) = lock(&self.cache).get(id, now_ms) {
            return Ok(v);
        }
        let value = Arc::new(self.backend.get(credential).await?);
        lock(&self.cache).insert(id.clone(), Arc::clone(&value), now_ms);
        Ok(value)
    }

    fn deny_event(&self, ctx: &RequestContext<'_>, d: &Denial) -> AuditEvent {
        event(
            ctx,
            AuditKind::Deny,
            AuditDecision::Deny,
            d.credential.as_ref(),
            Some(d.reason.to_string()),
        )
    }

    /// Audits and logs a denial; returns it (or the audit failure, which is also a denial).
    fn deny(&self, ctx: &RequestContext<'_>, denial: Denial) -> Denial {
        let ev = self.deny_event(ctx, &denial);
        log_denial(ctx, &denial);
        match self.record(ctx, &[ev]) {
            Ok(()) => denial,
            Err(audit_failure) => audit_failure,
        }
    }

    /// Audits and logs that a stream sandbox `sandbox` sent to `dst` (an address a CIDR rule
    /// allows, forwarded as bytes) carried a placeholder, and was cut.
    pub fn deny_placeholder_in_stream(
        &self,
        tenant: &TenantId,
        sandbox: &SandboxId,
        dst: std::net::SocketAddr,
        now_ms: i64,
    ) {
        let reason = DenyReason::PlaceholderToAddress;
        tracing::info!(%sandbox, %dst, code = reason.code(), "credential placeholder in a stream to an address; connection cut");
        let Some(audit) = &self.audit else {
            return;
        };
        let ev = AuditEvent {
            ts_ms: now_ms,
            event: AuditKind::Deny,
            tenant: tenant.clone(),
            sandbox: sandbox.clone(),
            credential_id: None,
            credential_name: None,
            host: dst.to_string(),
            method: "-".to_owned(),
            path: "-".to_owned(),
            decision: AuditDecision::Deny,
            reason: Some(reason.to_string()),
            repeated: None,
            first_ms: None,
        };
        if let Err(e) = audit.append(&ev) {
            tracing::error!(%sandbox, error = %e, "audit log write failed");
        }
    }

    /// Appends events; an audit failure becomes a denial (fail closed).
    fn record(&self, ctx: &RequestContext<'_>, events: &[AuditEvent]) -> Result<(), Denial> {
        let Some(audit) = &self.audit else {
            return Ok(());
        };
        for ev in events {
            if let Err(e) = audit.append(ev) {
                tracing::error!(sandbox = %ctx.sandbox, host = %ctx.host, error = %e, "audit log write failed; denying the request");
                return Err(Denial::bare(DenyReason::AuditUnavailable(e.to_string())));
            }
        }
        Ok(())
    }
}

fn log_denial(ctx: &RequestContext<'_>, d: &Denial) {
    tracing::info!(
        sandbox = %ctx.sandbox,
        host = %ctx.host,
        method = %ctx.method,
        credential = ?d.credential.as_ref().map(|c| c.id.as_str()),
        reason = %d.reason,
        code = d.reason.code(),
        "credential request denied"
    );
}

fn event(
    ctx: &RequestContext<'_>,
    kind: AuditKind,
    decision: AuditDecision,
    credential: Option<&CredentialRef>,
    reason: Option<String>,
) -> AuditEvent {
    AuditEvent {
        ts_ms: ctx.now_ms,
        event: kind,
        tenant: ctx.tenant.clone(),
        sandbox: ctx.sandbox.clone(),
        credential_id: credential.map(|c| c.id.clone()),
        credential_name: credential.map(|c| c.name.clone()),
        host: ctx.host.as_str().to_owned(),
        method: ctx.method.as_str().to_owned(),
        path: ctx.path.to_owned(),
        decision,
        reason,
        repeated: None,
        first_ms: None,
    }
}

//! Which credentials a request gets, or why it is denied. Pure: metadata and the request
//! context in, a decision out (the rate limit, which has state, is applied by the manager).
//!
//! For a request from sandbox S (of tenant T, maybe in project P) to host H:
//! 1. **Scope.** Credentials whose scope covers S are grouped by name; in each group the most
//!    specific scope wins (sandbox > project > tenant) and the others are ignored *entirely*
//!    for this sandbox: an override replaces the broader credential, with its own hosts and
//!    rules, rather than adding to it. A credential never crosses tenants.
//! 2. **Host.** A winner applies to the request only if one of its host patterns matches H.
//! 3. **TRACE/TRACK** are denied outright if any winner matches H, whatever its method list.
//! 4. **Method and path.** A winner restricted to other methods or paths does not apply: the
//!    request goes on without it. If a path-restricted winner would be judged on a
//!    non-canonical path (dot segments, encoded slashes, `//`), the request is denied: we do
//!    not guess how the upstream normalises it.
//! 5. **Expiry, TLS.** An applicable credential that has expired, or that requires TLS on a
//!    cleartext request, denies the request (fail closed) rather than letting it go without
//!    the credential.
//! 6. **Conflicts.** Two applicable credentials that write the same header (case-insensitive;
//!    HTTP Basic counts as `Authorization`) or the same query parameter deny the request:
//!    neither silently wins.
//!
//! Several credentials with different targets may apply to one request; they are returned
//! in name order. Checks run in name order and the first problem found is the reason given.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use http::Method;
use serde::Serialize;
use space_core::id::{SandboxId, TenantId};

use crate::egress::Hostname;
use crate::model::{Credential, CredentialId, CredentialName, ProjectId};
use crate::pattern::path_problem;
use crate::rule::{CompiledRule, REFLECTING_METHODS};

/// A request as the gateway sees it. `host` is the name the gateway connected to (from SNI
/// or its own policy), never a header the guest chose; `path` is the URI path as sent,
/// without the query; `tls` says whether the guest's connection was TLS; `now_ms` is the
/// clock (milliseconds since the Unix epoch) used for expiry and rate limits.
#[derive(Debug, Clone, Copy)]
pub struct RequestContext<'a> {
    /// The sandbox's tenant.
    pub tenant: &'a TenantId,
    /// The sandbox's project, if any.
    pub project: Option<&'a ProjectId>,
    /// The sandbox.
    pub sandbox: &'a SandboxId,
    /// The sandboxes its memory was restored from, nearest first (a fork's parent, a
    /// checkpoint's sandbox): processes it inherited hold their placeholders, which stand
    /// for this sandbox's credentials of the same names.
    pub inherited_from: &'a [SandboxId],
    /// The upstream host.
    pub host: &'a Hostname,
    /// The request method.
    pub method: &'a Method,
    /// The request path (no query).
    pub path: &'a str,
    /// Whether the request arrived over TLS.
    pub tls: bool,
    /// Now, in milliseconds since the Unix epoch.
    pub now_ms: i64,
}

/// A credential named in a decision: id and name, never the value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct CredentialRef {
    /// Its id.
    pub id: CredentialId,
    /// Its name.
    pub name: CredentialName,
}

impl CredentialRef {
    pub(crate) fn of(c: &Credential) -> Self {
        Self {
            id: c.id.clone(),
            name: c.name.clone(),
        }
    }
}

impl fmt::Display for CredentialRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.id)
    }
}

/// Why a request is denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// The credential expired at this instant.
    Expired {
        /// Expiry, milliseconds since the Unix epoch.
        at_ms: i64,
    },
    /// The credential requires TLS and the request is cleartext.
    CleartextNotAllowed,
    /// The credential's rate limit is exhausted.
    RateLimited {
        /// Its budget.
        requests: u32,
        /// Per this many seconds.
        per_secs: u32,
    },
    /// TRACE or TRACK to a host a credential applies to.
    ReflectingMethod(Method),
    /// A path-restricted credential and a path we will not match.
    NonCanonicalPath(&'static str),
    /// Two credentials write the same place.
    Conflict {
        /// The other credential.
        other: CredentialName,
        /// What both write (`header authorization`, `query parameter key`).
        target: String,
    },
    /// Two credentials with the same name at the same scope (the manager prevents this).
    Ambiguous {
        /// The other credential.
        other: CredentialId,
    },
    /// A placeholder of this sandbox, in a request its credential is not allowed for.
    PlaceholderNotAllowed,
    /// A well-formed placeholder this sandbox has none of.
    UnknownPlaceholder,
    /// The placeholder prefix without a valid placeholder after it.
    MalformedPlaceholder,
    /// A placeholder in the path (a placeholder only goes where its credential is injected).
    PlaceholderInPath,
    /// A placeholder in a header or query parameter its credential does not write: an
    /// endpoint that echoes or stores request data would hand the secret back.
    PlaceholderOutOfPlace {
        /// Where it was (`header x-custom`, `query parameter q`).
        found_in: String,
    },
    /// A placeholder in a stream the gateway forwards without reading it as HTTP (to an
    /// address a CIDR rule allows): no rule can inject there, so nothing may stand in.
    PlaceholderToAddress,
    /// The value could not be fetched from the backend.
    ValueUnavailable(String),
    /// The value contains characters that cannot go into a header.
    ValueNotHeaderSafe,
    /// The audit log could not be written (credentials are not used unaudited).
    AuditUnavailable(String),
    /// The request does not match its context, or cannot be rewritten.
    BadRequest(String),
}

impl DenyReason {
    /// A short stable code (`expired`, `rate_limited`, ...) for metrics and clients.
    pub fn code(&self) -> &'static str {
        match self {
            DenyReason::Expired { .. } => "expired",
            DenyReason::CleartextNotAllowed => "cleartext_not_allowed",
            DenyReason::RateLimited { .. } => "rate_limited",
            DenyReason::ReflectingMethod(_) => "reflecting_method",
            DenyReason::NonCanonicalPath(_) => "non_canonical_path",
            DenyReason::Conflict { .. } => "conflict",
            DenyReason::Ambiguous { .. } => "ambiguous",
            DenyReason::PlaceholderNotAllowed => "placeholder_not_allowed",
            DenyReason::UnknownPlaceholder => "unknown_placeholder",
            DenyReason::MalformedPlaceholder => "malformed_placeholder",
            DenyReason::PlaceholderInPath => "placeholder_in_path",
            DenyReason::PlaceholderOutOfPlace { .. } => "placeholder_out_of_place",
            DenyReason::PlaceholderToAddress => "placeholder_to_address",
            DenyReason::ValueUnavailable(_) => "value_unavailable",
            DenyReason::ValueNotHeaderSafe => "value_not_header_safe",
            DenyReason::AuditUnavailable(_) => "audit_unavailable",
            DenyReason::BadRequest(_) => "bad_request",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::Expired { at_ms } => write!(f, "credential expired at {at_ms} ms"),
            DenyReason::CleartextNotAllowed => {
                f.write_str("credential requires TLS and the request is cleartext HTTP")
            }
            DenyReason::RateLimited { requests, per_secs } => write!(
                f,
                "credential rate limit of {requests} requests per {per_secs} s exhausted"
            ),
            DenyReason::ReflectingMethod(m) => {
                write!(f, "{m} is refused to hosts that receive credentials")
            }
            DenyReason::NonCanonicalPath(why) => {
                write!(f, "path restricted credential and a non-canonical path: {why}")
            }
            DenyReason::Conflict { other, target } => {
                write!(f, "conflicts with credential {other}: both write {target}")
            }
            DenyReason::Ambiguous { other } => {
                write!(f, "another credential ({other}) has the same name and scope")
            }
            DenyReason::PlaceholderNotAllowed => f.write_str(
                "request carries the credential's placeholder but the credential is not allowed for this request",
            ),
            DenyReason::UnknownPlaceholder => {
                f.write_str("request carries a placeholder this sandbox has no credential for")
            }
            DenyReason::MalformedPlaceholder => f.write_str("request carries a mangled placeholder"),
            DenyReason::PlaceholderInPath => f.write_str(
                "placeholder in the URL path (a placeholder only goes where its credential is injected)",
            ),
            DenyReason::PlaceholderOutOfPlace { found_in } => write!(
                f,
                "placeholder in {found_in}, which its credential does not write: a placeholder only goes where its rule injects the credential"
            ),
            DenyReason::PlaceholderToAddress => f.write_str(
                "placeholder in a stream to an address allowed only by a CIDR rule, where no credential is injected",
            ),
            DenyReason::ValueUnavailable(e) => write!(f, "credential value unavailable: {e}"),
            DenyReason::ValueNotHeaderSafe => {
                f.write_str("credential value contains characters not allowed in a header")
            }
            DenyReason::AuditUnavailable(e) => write!(f, "audit log unavailable: {e}"),
            DenyReason::BadRequest(e) => write!(f, "bad request: {e}"),
        }
    }
}

/// A denied request: the reason, and the credential concerned when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// The credential whose rule denied the request.
    pub credential: Option<CredentialRef>,
    /// Why.
    pub reason: DenyReason,
}

impl Denial {
    pub(crate) fn of(credential: &Credential, reason: DenyReason) -> Self {
        Self {
            credential: Some(CredentialRef::of(credential)),
            reason,
        }
    }

    pub(crate) fn bare(reason: DenyReason) -> Self {
        Self {
            credential: None,
            reason,
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.credential {
            Some(c) => write!(f, "credential {c}: {}", self.reason),
            None => write!(f, "{}", self.reason),
        }
    }
}

impl std::error::Error for Denial {}

/// A credential and its compiled rule, as the manager keeps them.
#[derive(Debug)]
pub struct Entry {
    /// Metadata.
    pub credential: Credential,
    /// The rule, checked.
    pub rule: CompiledRule,
}

/// A credential granted for a request.
#[derive(Debug, Clone)]
pub struct Grant {
    pub(crate) entry: Arc<Entry>,
}

impl Grant {
    /// The credential's metadata.
    pub fn credential(&self) -> &Credential {
        &self.entry.credential
    }
}

/// The outcome of resolving a request.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// Forward the request with these credentials (none: forward it unchanged).
    Allow(Vec<Grant>),
    /// Refuse the request.
    Deny(Denial),
}

impl Resolution {
    /// Whether the request may go on.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Resolution::Allow(_))
    }
}

/// For each name, the credential of the most specific scope covering the sandbox.
pub fn winners<'e>(
    entries: &'e [Arc<Entry>],
    tenant: &TenantId,
    project: Option<&ProjectId>,
    sandbox: &SandboxId,
) -> Result<BTreeMap<&'e CredentialName, &'e Arc<Entry>>, Denial> {
    let mut best: BTreeMap<&CredentialName, &Arc<Entry>> = BTreeMap::new();
    for e in entries {
        let c = &e.credential;
        if !c.scope.covers(tenant, project, sandbox) {
            continue;
        }
        match best.get(&c.name) {
            None => {
                best.insert(&c.name, e);
            }
            Some(current) => {
                let (mine, theirs) = (
                    c.scope.specificity(),
                    current.credential.scope.specificity(),
                );
                if mine > theirs {
                    best.insert(&c.name, e);
                } else if mine == theirs {
                    return Err(Denial::of(
                        c,
                        DenyReason::Ambiguous {
                            other: current.credential.id.clone(),
                        },
                    ));
                }
            }
        }
    }
    Ok(best)
}

/// Steps 1–6 of the module doc: the credentials that apply to the request, or why it is
/// denied. Rate limits are not applied here.
pub fn applicable(
    entries: &[Arc<Entry>],
    ctx: &RequestContext<'_>,
) -> Result<Vec<Arc<Entry>>, Denial> {
    let winners = winners(entries, ctx.tenant, ctx.project, ctx.sandbox)?;
    let for_host: Vec<&Arc<Entry>> = winners
        .into_values()
        .filter(|e| e.rule.matches_host(ctx.host))
        .collect();
    if for_host.is_empty() {
        return Ok(Vec::new());
    }
    if REFLECTING_METHODS.contains(&ctx.method.as_str()) {
        return Err(Denial::of(
            &for_host[0].credential,
            DenyReason::ReflectingMethod(ctx.method.clone()),
        ));
    }
    let mut out: Vec<Arc<Entry>> = Vec::new();
    for e in for_host {
        let c = &e.credential;
        if !e.rule.matches_method(ctx.method) {
            continue;
        }
        if e.rule.paths.is_some() {
            if let Some(why) = path_problem(ctx.path) {
                return Err(Denial::of(c, DenyReason::NonCanonicalPath(why)));
            }
        }
        if !e.rule.matches_path(ctx.path) {
            continue;
        }
        if let Some(at_ms) = c.expires_at_ms.filter(|_| c.is_expired(ctx.now_ms)) {
            return Err(Denial::of(c, DenyReason::Expired { at_ms }));
        }
        if e.rule.require_tls && !ctx.tls {
            return Err(Denial::of(c, DenyReason::CleartextNotAllowed));
        }
        let target = e.rule.injection.target();
        if let Some(other) = out.iter().find(|o| o.rule.injection.target() == target) {
            return Err(Denial::of(
                c,
                DenyReason::Conflict {
                    other: other.credential.name.clone(),
                    target: target.to_string(),
                },
            ));
        }
        out.push(Arc::clone(e));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Scope;
    use crate::testutil::{bearer_rule, credential, host};

    fn entry(c: Credential) -> Arc<Entry> {
        let rule = c.rule.compile().unwrap();
        Arc::new(Entry {
            credential: c,
            rule,
        })
    }

    #[test]
    fn same_name_same_scope_is_ambiguous_and_fails_closed() {
        let tenant = TenantId::generate();
        let sandbox = SandboxId::generate();
        let scope = Scope::Tenant {
            tenant: tenant.clone(),
        };
        let a = entry(credential(
            "api",
            scope.clone(),
            bearer_rule(&["a.example.com"]),
        ));
        let b = entry(credential("api", scope, bearer_rule(&["a.example.com"])));
        let h = host("a.example.com");
        let ctx = RequestContext {
            tenant: &tenant,
            project: None,
            sandbox: &sandbox,
            inherited_from: &[],
            host: &h,
            method: &Method::GET,
            path: "/",
            tls: true,
            now_ms: 0,
        };
        let d = applicable(&[a, b], &ctx).unwrap_err();
        assert_eq!(d.reason.code(), "ambiguous");
    }
}

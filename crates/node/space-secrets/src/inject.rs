//! Rewriting a request for upstream: pure functions on [`http::request::Parts`] and an
//! [`InjectionPlan`] (the granted credentials with their values, and the sandbox's
//! placeholders). The gateway calls this through
//! [`CredentialManager::authorize_request`](crate::CredentialManager::authorize_request).
//!
//! In order:
//! 1. **Placeholders are checked** on the request as the guest sent it: header values, the
//!    query string and the path are scanned for `space-placeholder-`. Every placeholder found
//!    must belong to a credential granted for *this* request, and sit **where that
//!    credential is injected**: in the header its rule writes (`Authorization` for basic
//!    auth), or as the value of the query parameter its rule writes. Anywhere else — another
//!    header, another parameter, a parameter name, the path — the request is denied (and
//!    audited), never forwarded with the stand-in or the secret: an endpoint that echoes,
//!    logs-and-shows or stores request data would otherwise hand the secret to the guest, at
//!    a place of its choosing. So are a placeholder of a credential not allowed here, one
//!    this sandbox has no credential for, and a mangled one. Bodies are not inspected: a
//!    placeholder there goes upstream as is (as the stand-in, never the secret).
//! 2. **The guest's own credentials are stripped**, when at least one credential is granted:
//!    `Authorization`, `Proxy-Authorization`, every header a granted credential writes, and
//!    every query parameter a granted credential writes (compared after percent-decoding, so
//!    `api%5Fkey` is `api_key`). The guest cannot add to, or shadow, what we inject. `Cookie`
//!    is *not* stripped (unless a credential writes it): cookies are session state the guest
//!    obtained from that host itself, and removing them would break ordinary logins while
//!    protecting nothing we inject. A request with no granted credential is left untouched.
//!    Every placeholder the first step let through is in what this removes: nothing is
//!    substituted, the value goes in only as the rule's own template.
//! 3. **Values are injected**: a header from the template, `Authorization: Basic …`, or a
//!    query parameter appended. Injected header values are marked sensitive (HTTP/2 HPACK
//!    never indexes them).
//!
//! TRACE/TRACK were already refused by the resolver when a credential applies.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::{PathAndQuery, Uri};
use zeroize::Zeroizing;

use crate::placeholder::{self, Placeholder, Token};
use crate::resolve::{CredentialRef, Denial, DenyReason};
use crate::rule::{is_unreserved, CompiledInjection};
use crate::secret::SecretValue;

/// One granted credential, with its value.
#[derive(Debug, Clone)]
pub struct PlannedInjection {
    /// Which credential.
    pub credential: CredentialRef,
    /// How it goes in.
    pub injection: CompiledInjection,
    /// Its value.
    pub value: Arc<SecretValue>,
}

/// A placeholder the sandbox knows, and the granted credential it stands for in this request.
#[derive(Debug, Clone)]
pub struct KnownPlaceholder {
    /// The placeholder text.
    pub placeholder: Placeholder,
    /// Its credential (the sandbox's winner for that name).
    pub credential: CredentialRef,
    /// Index into [`InjectionPlan::injections`] if the credential is granted for this request.
    pub granted: Option<usize>,
}

/// Everything [`apply`] needs: granted credentials with values, and the sandbox's placeholders
/// (may be left empty when the request mentions none).
#[derive(Debug, Clone, Default)]
pub struct InjectionPlan {
    /// Granted credentials, in name order.
    pub injections: Vec<PlannedInjection>,
    /// The sandbox's placeholders.
    pub placeholders: Vec<KnownPlaceholder>,
}

/// Whether the request mentions a placeholder anywhere we look (the cheap pre-check that
/// lets the manager skip computing the sandbox's placeholders).
pub fn mentions_placeholder(parts: &Parts) -> bool {
    parts
        .headers
        .values()
        .any(|v| placeholder::mentions_placeholder(v.as_bytes()))
        || parts
            .uri
            .path_and_query()
            .is_some_and(|pq| placeholder::mentions_placeholder(pq.as_str().as_bytes()))
}

/// Rewrites `parts` per the module doc. On success returns the credentials injected; on
/// denial `parts` may be partly rewritten and must be discarded.
pub fn apply(parts: &mut Parts, plan: &InjectionPlan) -> Result<Vec<CredentialRef>, Denial> {
    // 1. Check every placeholder, and where it is.
    for (name, value) in &parts.headers {
        let found_in = || format!("header {name}");
        check_tokens(
            value.as_bytes(),
            plan,
            |inj| inj.writes_header(name),
            found_in,
        )?;
    }
    if let Some(query) = parts.uri.query() {
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded = percent_decode(key);
            let found_in = || format!("query parameter {}", decoded.as_deref().unwrap_or(key));
            check_tokens(key.as_bytes(), plan, |_| false, found_in)?;
            let writes = |inj: &CompiledInjection| {
                matches!(inj, CompiledInjection::QueryParam { name }
                    if names_param(key, decoded.as_deref(), name))
            };
            check_tokens(value.as_bytes(), plan, writes, found_in)?;
        }
    }
    if placeholder::mentions_placeholder(parts.uri.path().as_bytes()) {
        check_tokens(parts.uri.path().as_bytes(), plan, |_| true, String::new)?;
        let credential = first_known(parts.uri.path().as_bytes(), plan);
        return Err(Denial {
            credential,
            reason: DenyReason::PlaceholderInPath,
        });
    }
    if plan.injections.is_empty() {
        return Ok(Vec::new());
    }

    // 2. Strip the guest's own credentials (and with them every placeholder step 1 let by).
    let headers = &mut parts.headers;
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::PROXY_AUTHORIZATION);
    let mut query_names: Vec<&str> = Vec::new();
    for inj in &plan.injections {
        match &inj.injection {
            CompiledInjection::Header { name, .. } => {
                headers.remove(name);
            }
            CompiledInjection::BasicAuth { .. } => {}
            CompiledInjection::QueryParam { name } => query_names.push(name),
        }
    }

    // 2 and 3 for the query: strip, append.
    let query_injections: Vec<&PlannedInjection> = plan
        .injections
        .iter()
        .filter(|i| matches!(i.injection, CompiledInjection::QueryParam { .. }))
        .collect();
    if !query_injections.is_empty() {
        rewrite_query(parts, &query_names, &query_injections)?;
    }

    // 3. Inject headers.
    let mut injected = Vec::with_capacity(plan.injections.len());
    for inj in &plan.injections {
        let deny = |reason| Denial {
            credential: Some(inj.credential.clone()),
            reason,
        };
        match &inj.injection {
            CompiledInjection::Header {
                name,
                prefix,
                suffix,
            } => {
                inj.value
                    .check_header_safe()
                    .map_err(|_| deny(DenyReason::ValueNotHeaderSafe))?;
                let mut text = Zeroizing::new(String::with_capacity(
                    prefix.len() + inj.value.len() + suffix.len(),
                ));
                text.push_str(prefix);
                text.push_str(inj.value.expose());
                text.push_str(suffix);
                let mut hv = HeaderValue::from_str(&text)
                    .map_err(|_| deny(DenyReason::ValueNotHeaderSafe))?;
                hv.set_sensitive(true);
                parts.headers.insert(name.clone(), hv);
            }
            CompiledInjection::BasicAuth { username } => {
                let mut pair =
                    Zeroizing::new(String::with_capacity(username.len() + 1 + inj.value.len()));
                pair.push_str(username);
                pair.push(':');
                pair.push_str(inj.value.expose());
                let mut text = Zeroizing::new(String::with_capacity(6 + pair.len() * 4 / 3 + 4));
                text.push_str("Basic ");
                BASE64.encode_string(pair.as_bytes(), &mut text);
                let mut hv = HeaderValue::from_str(&text)
                    .map_err(|_| deny(DenyReason::ValueNotHeaderSafe))?;
                hv.set_sensitive(true);
                parts.headers.insert(header::AUTHORIZATION, hv);
            }
            CompiledInjection::QueryParam { .. } => {}
        }
        injected.push(inj.credential.clone());
    }
    Ok(injected)
}

/// Checks the placeholders in `bytes`: each must be this sandbox's, of a credential granted
/// for the request whose injection `belongs` says writes this place (`found_in` names it).
fn check_tokens(
    bytes: &[u8],
    plan: &InjectionPlan,
    belongs: impl Fn(&CompiledInjection) -> bool,
    found_in: impl Fn() -> String,
) -> Result<(), Denial> {
    for token in placeholder::scan(bytes) {
        match token {
            Token::Malformed => return Err(Denial::bare(DenyReason::MalformedPlaceholder)),
            Token::Placeholder { text, .. } => {
                let Some(known) = lookup(plan, text) else {
                    return Err(Denial::bare(DenyReason::UnknownPlaceholder));
                };
                let deny = |reason| Denial {
                    credential: Some(known.credential.clone()),
                    reason,
                };
                let Some(granted) = known.granted.and_then(|i| plan.injections.get(i)) else {
                    return Err(deny(DenyReason::PlaceholderNotAllowed));
                };
                if !belongs(&granted.injection) {
                    return Err(deny(DenyReason::PlaceholderOutOfPlace {
                        found_in: found_in(),
                    }));
                }
            }
        }
    }
    Ok(())
}

fn lookup<'p>(plan: &'p InjectionPlan, text: &str) -> Option<&'p KnownPlaceholder> {
    plan.placeholders
        .iter()
        .find(|k| k.placeholder.as_str() == text)
}

fn first_known(bytes: &[u8], plan: &InjectionPlan) -> Option<CredentialRef> {
    placeholder::scan(bytes).iter().find_map(|t| match t {
        Token::Placeholder { text, .. } => lookup(plan, text).map(|k| k.credential.clone()),
        Token::Malformed => None,
    })
}

/// Rebuilds the query: drops the guest's parameters that granted credentials write,
/// appends injected parameters.
fn rewrite_query(
    parts: &mut Parts,
    strip: &[&str],
    inject: &[&PlannedInjection],
) -> Result<(), Denial> {
    let path = parts.uri.path();
    let mut query = Zeroizing::new(Vec::new());
    if let Some(q) = parts.uri.query() {
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let key = pair.split('=').next().unwrap_or_default();
            let decoded = percent_decode(key);
            if strip
                .iter()
                .any(|name| names_param(key, decoded.as_deref(), name))
            {
                continue;
            }
            if !query.is_empty() {
                query.push(b'&');
            }
            query.extend_from_slice(pair.as_bytes());
        }
    }
    for inj in inject {
        if let CompiledInjection::QueryParam { name } = &inj.injection {
            if !query.is_empty() {
                query.push(b'&');
            }
            query.extend_from_slice(name.as_bytes());
            query.push(b'=');
            percent_encode_into(inj.value.expose().as_bytes(), &mut query);
        }
    }
    let mut pq = Zeroizing::new(Vec::with_capacity(path.len() + 1 + query.len()));
    pq.extend_from_slice(path.as_bytes());
    if !query.is_empty() {
        pq.push(b'?');
        pq.extend_from_slice(&query);
    }
    let bad = |what: &str| {
        Denial::bare(DenyReason::BadRequest(format!(
            "cannot rebuild the URI: {what}"
        )))
    };
    let pq = PathAndQuery::try_from(pq.as_slice()).map_err(|_| bad("invalid path and query"))?;
    let mut uri_parts = parts.uri.clone().into_parts();
    uri_parts.path_and_query = Some(pq);
    parts.uri = Uri::from_parts(uri_parts).map_err(|_| bad("invalid URI"))?;
    Ok(())
}

/// Whether a query parameter `key` (`decoded`: percent-decoded) is parameter `name`: as
/// written or decoded (`api%5Fkey` is `api_key`). Both the placeholder check and the strip
/// ask this, so they never disagree on which parameter a credential writes.
fn names_param(key: &str, decoded: Option<&str>, name: &str) -> bool {
    key == name || decoded == Some(name)
}

/// Appends `bytes` percent-encoded (everything but RFC 3986 unreserved characters).
fn percent_encode_into(bytes: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        if is_unreserved(b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

/// Decodes a query component (`%XX`, and `+` as space); `None` if malformed or not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_is_strict() {
        assert_eq!(percent_decode("api%5Fkey").as_deref(), Some("api_key"));
        assert_eq!(percent_decode("a+b").as_deref(), Some("a b"));
        assert_eq!(percent_decode("%+1"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None);
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved() {
        let mut out = Vec::new();
        percent_encode_into("aZ0-._~ /?&=%é".as_bytes(), &mut out);
        assert_eq!(out, b"aZ0-._~%20%2F%3F%26%3D%25%C3%A9");
    }

    #[test]
    fn an_empty_plan_leaves_the_request_alone() {
        let (mut parts, ()) = http::Request::get("/x?a=1")
            .header("authorization", "Bearer mine")
            .body(())
            .unwrap()
            .into_parts();
        assert!(apply(&mut parts, &InjectionPlan::default())
            .unwrap()
            .is_empty());
        assert_eq!(parts.headers["authorization"], "Bearer mine");
        assert_eq!(parts.uri, "/x?a=1");
    }
}

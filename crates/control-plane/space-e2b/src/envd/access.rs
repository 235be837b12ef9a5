//! Who an envd request is for and whether it may act: the sandbox the dispatcher found in
//! its `Host` or `E2b-Sandbox-Id` ([`EnvdTarget`]), which must be live; its envd access token
//! (`X-Access-Token`, checked in constant time against the token derived for that sandbox
//! in its current token epoch, and refused once that epoch's validity ended); and the
//! acting user (`Authorization: Basic base64("<user>:")`, absent for the
//! sandbox's default user).
//!
//! An envd request carries no API key: the token is its only credential, and a token is
//! only ever handed to the tenant that owns the sandbox (create, connect, get). Another
//! tenant's sandbox id with its own token does not verify, so it gets 401, never data.

use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use base64::Engine as _;
use space_control::db::{DesiredState, SandboxRow};
use space_core::process::validate_user_name;
use space_core::{SandboxId, TenantId};

use super::signature::SignatureRefusal;
use crate::state::E2bState;

/// Header with the envd access token.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// The sandbox an envd request addresses (put into the request by the dispatcher).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvdTarget(pub SandboxId);

/// An envd request that may act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvdCaller {
    /// The sandbox.
    pub id: SandboxId,
    /// Its owner (the tenant SPACE's calls are scoped to).
    pub tenant: TenantId,
    /// The acting user; `None`: the sandbox's default user.
    pub user: Option<String>,
}

/// Why an envd request may not act.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No live sandbox has this id.
    #[error("sandbox {0} was not found")]
    SandboxNotFound(String),
    /// The access token is missing or wrong.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// The user named in `Authorization` is not acceptable.
    #[error("invalid user: want [a-z_][a-z0-9_-]*, at most 32 bytes")]
    BadUser,
    /// The database failed.
    #[error("internal error (see the server log)")]
    Internal,
}

/// How a request proves it may act on the sandbox.
pub enum Proof<'a> {
    /// `X-Access-Token` must be the sandbox's token.
    Token,
    /// Nothing: `/health` answers anyone.
    None,
    /// A signed URL for this operation (`/files` without `X-Access-Token`): the check of
    /// the signature against the sandbox's token.
    Signature(&'a (dyn Fn(&str) -> Result<(), SignatureRefusal> + Sync)),
}

/// The record of the live sandbox `target` names.
pub async fn live_sandbox_row(
    st: &E2bState,
    target: &EnvdTarget,
) -> Result<SandboxRow, AccessError> {
    st.app
        .db
        .sandbox_any_tenant(&target.0)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "looking up an envd request's sandbox");
            AccessError::Internal
        })?
        .filter(|row| row.desired_state == DesiredState::Running)
        .ok_or_else(|| AccessError::SandboxNotFound(target.0.to_string()))
}

/// Checks the request and names who it acts for.
pub async fn caller(
    st: &E2bState,
    target: &EnvdTarget,
    headers: &HeaderMap,
    proof: Proof<'_>,
) -> Result<EnvdCaller, AccessError> {
    let row = live_sandbox_row(st, target).await?;
    let now = space_control::db::now_ms();
    let token_ok = || {
        headers
            .get(ACCESS_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| st.tokens.verify(&target.0, row.tokens, now, t))
    };
    let refusal = match proof {
        Proof::None => None,
        Proof::Token if token_ok() => None,
        Proof::Token if headers.contains_key(ACCESS_TOKEN_HEADER) => Some(
            "invalid, expired or revoked access token (connect to the sandbox for a valid one)",
        ),
        Proof::Token => Some("missing access token: send X-Access-Token"),
        // A signed URL is made with the token: valid only while the token is.
        Proof::Signature(_) if !row.tokens.valid_at(now) => {
            Some(SignatureRefusal::Expired.message())
        }
        Proof::Signature(check) => check(&st.envd_token(&target.0, row.tokens))
            .err()
            .map(SignatureRefusal::message),
    };
    if let Some(message) = refusal {
        return Err(AccessError::Unauthenticated(message));
    }
    Ok(EnvdCaller {
        id: target.0.clone(),
        tenant: row.tenant_id,
        user: basic_user(headers)?,
    })
}

/// The user of `Authorization: Basic base64("<user>:")`; `None` without the header.
pub fn basic_user(headers: &HeaderMap) -> Result<Option<String>, AccessError> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| AccessError::BadUser)?.trim();
    let (scheme, encoded) = value.split_once(' ').ok_or(AccessError::BadUser)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(AccessError::BadUser);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| AccessError::BadUser)?;
    let text = String::from_utf8(decoded).map_err(|_| AccessError::BadUser)?;
    let user = text.split_once(':').map_or(text.as_str(), |(u, _)| u);
    user_name(user)
}

/// A user name from a request: empty means the default user.
pub fn user_name(user: &str) -> Result<Option<String>, AccessError> {
    if user.is_empty() {
        return Ok(None);
    }
    validate_user_name(user).map_err(|_| AccessError::BadUser)?;
    Ok(Some(user.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn basic_auth_names_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h), Ok(None));
        // base64("root:")
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic cm9vdDo="));
        assert_eq!(basic_user(&h), Ok(Some("root".into())));
        // base64(":") — no user: the default.
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic Og=="));
        assert_eq!(basic_user(&h), Ok(None));
        // base64("../etc:")
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_static("Basic Li4vZXRjOg=="),
        );
        assert_eq!(basic_user(&h), Err(AccessError::BadUser));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(basic_user(&h), Err(AccessError::BadUser));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic !!!"));
        assert_eq!(basic_user(&h), Err(AccessError::BadUser));
    }
}

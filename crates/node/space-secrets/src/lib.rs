//! The credential manager: secrets live outside every sandbox and reach upstream servers
//! only through the egress gateway, which injects them into requests to allowed hosts.
//!
//! The guest is hostile and never sees a value. The gateway terminates the guest's TLS
//! connection to an allowed host, asks [`CredentialManager::authorize_request`] what to do with
//! each request, and forwards the rewritten request (or refuses it). A guest that needs
//! something in its environment gets a placeholder instead of the value.
//!
//! Modules, from data to decisions:
//! - [`model`]: ids, names, scopes and credential metadata (never the value);
//! - [`rule`]: where a credential may go and how it is injected; [`pattern`]: path patterns;
//! - [`secret`]: [`SecretValue`], the only type holding a value (zeroized, redacted, bounded);
//! - [`backend`]: the [`SecretBackend`] trait; [`store`]: encrypted files on the node
//!   ([`crypto`], [`keyfile`], [`fsutil`]); [`command`]: an external credential helper;
//!   [`memory`]: in memory;
//! - [`resolve`]: which credentials a request gets; [`ratelimit`]: per-credential budgets;
//!   [`cache`]: short-lived value cache;
//! - [`placeholder`]: per-sandbox stand-ins for values; [`inject`]: rewriting the request;
//!   [`scrub`]: masking injected values in the responses;
//! - [`audit`]: the JSON-lines audit log;
//! - [`manager`]: [`CredentialManager`], tying them together.
//!
//! Invariant: no log line, error message, `Debug` or `Display` output and no audit event ever
//! contains a secret value.

pub mod audit;
pub mod backend;
pub mod cache;
pub mod command;
pub mod crypto;
pub mod fsutil;
pub mod inject;
pub mod keyfile;
pub mod manager;
pub mod memory;
pub mod model;
pub mod pattern;
pub mod placeholder;
pub mod ratelimit;
pub mod resolve;
pub mod rule;
pub mod scrub;
pub mod secret;
pub mod store;

/// Host names and host patterns, shared with the egress policy.
pub use space_core::egress;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;

/// Locks `m`; a panic while it was held left its data consistent (every update under the
/// crate's locks is one complete step), so poisoning is ignored.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use audit::{AuditDecision, AuditEvent, AuditFilter, AuditKind, AuditLog};
pub use backend::{BackendError, SecretBackend};
pub use command::{CommandBackend, CommandConfig};
pub use egress::{DomainPattern, Hostname};
pub use manager::{Authorized, CredentialManager, ManagerConfig, ManagerError};
pub use memory::MemoryBackend;
pub use model::{Credential, CredentialId, CredentialName, ProjectId, Scope, ValidationError};
pub use placeholder::{Placeholder, PlaceholderKey};
pub use resolve::{CredentialRef, Denial, DenyReason, RequestContext, Resolution};
pub use rule::{CredentialRule, Injection, RateLimit};
pub use secret::{SecretError, SecretValue};
pub use store::EncryptedFileStore;

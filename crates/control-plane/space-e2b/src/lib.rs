//! The E2B-compatible API: what the official E2B SDKs call — the REST control API and the
//! in-sandbox API ("envd": Connect-RPC, `/files`, `/health`) — served by SPACE and translated
//! to its own operations, so agents written against E2B run on SPACE unchanged. The facts
//! it is built on, read from the pinned SDKs' own source, are in `docs/e2b-compat.md`.
//!
//! - [`surface`]: [`E2bApi`], served beside SPACE's own API on the same listener; every
//!   request is first classified by [`dispatch`] (by `Host` and `E2b-Sandbox-*` headers,
//!   before any authentication).
//! - [`rest`]: the REST API (`X-API-Key`), onto the same functions as `/v1`.
//! - [`envd`]: envd's services, onto the sandbox's guest channel.
//! - [`ports`]: host-routed ports, onto TCP connections the guest daemon opens.
//! - [`connect`]: the Connect protocol's wire format and its server side over axum.
//! - [`token`]: each sandbox's envd access token, derived from a node key.
//! - [`build_store`]: E2B template builds asked for and their uploads (object store, else
//!   this replica's disk).
//!
//! Architecture invariant (as for `space-control`): this crate reaches guests only through
//! `space_guest_client::Node`, via SPACE's application state; it holds no state of its own that a
//! restart would lose (tokens are derived, not stored).

pub mod build_store;
pub mod connect;
pub mod dispatch;
pub mod envd;
pub mod ports;
pub mod rest;
pub mod state;
pub mod surface;
pub mod template_files;
pub mod timestamp;
pub mod token;

pub use surface::{E2bApi, E2bConfig};

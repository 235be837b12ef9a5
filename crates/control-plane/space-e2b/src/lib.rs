//! The E2B-compatible API (issue 5): what the official E2B SDKs call — the REST control API
//! and the in-sandbox API ("envd", Connect-RPC over HTTP) — served by SPACE and translated
//! to its native operations. The plan, from the pinned SDKs' own source, is in
//! `docs/e2b-compat.md`.
//!
//! Built so far: [`connect`], the Connect protocol's wire format (envelopes, error codes and
//! bodies), pure and bounded; [`rest`], the REST API's wire types (and the list query and its
//! page cursor) and their mapping from SPACE's; [`envd`], the `process.Process` and
//! `filesystem.Filesystem` messages;
//! [`dispatch`], which API a request is for (by `Host` and `E2b-Sandbox-*` headers, before
//! authentication); [`token`], the derived envd access tokens.
//!
//! Not built yet: the REST and envd handlers, their wiring into `space-control`, the SDK
//! test suite.

pub mod connect;
pub mod dispatch;
pub mod envd;
pub mod rest;
pub mod timestamp;
pub mod token;

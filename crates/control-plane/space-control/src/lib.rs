//! Control plane: HTTP API, authentication, database, reconciler.
//!
//! - [`api`]: the `/v1` HTTP API (axum) and its OpenAPI document: parsing, rendering, and
//!   one call into [`service`] per request.
//! - [`service`]: the operations both API surfaces (`/v1`, E2B) call.
//! - [`background`]: periodic work (heartbeat, sweeps, reconciler) until shutdown.
//! - [`cluster`]: the cluster CA, the membership service nodes call, the liveness sweep.
//! - [`db`]: desired state, tenants and API keys (SQLite or PostgreSQL).
//! - [`reconciler`]: converges the nodes' live state to the desired state (TTL, orphans,
//!   creates a dead replica left), on the leading replica.
//! - [`replica`]: this process as one replica of many: its heartbeat, who leads.
//! - [`scheduler`]: where a new sandbox goes among nodes (pure placement rules).
//! - [`server`]: runs it all ([`serve`], or [`Server`] for tests and the CLI).
//! - [`tls`]: the optional TLS listener beside the plaintext one.
//!
//! Architecture invariants: the database holds desired state and the node live state; every
//! `/v1` request is authenticated and sees only its tenant's sandboxes; API keys are stored
//! only as hashes and never logged; a mutating request repeated with the same
//! `Idempotency-Key` does its work once ([`api::idempotency`]).

pub mod api;
pub mod background;
pub mod bootstrap;
pub mod cluster;
pub mod db;
pub mod keys;
pub mod nodes;
pub mod quotas;
pub mod reconciler;
pub mod replica;
pub mod scheduler;
pub mod server;
pub mod service;
pub use space_tls as tls;

pub use api::{build_app, AppState};
pub use server::{serve, ApiSurface, Server, ServerConfig, SurfaceContext};

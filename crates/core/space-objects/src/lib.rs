//! Object storage: where what moves between nodes lives — the artifacts of suspended
//! sandboxes' snapshots, and published templates and kernel bundles — addressed by key and
//! verified by size and SHA-256 whichever way it goes.
//!
//! Backends, through the `object_store` crate: an S3-compatible service (AWS S3, MinIO,
//! Ceph RGW, Garage) for clusters, a local directory for the single-machine default.
//!
//! - [`config`]: which store, from a small JSON file (S3 secrets from files, never argv).
//! - [`key`]: object keys, validated, and the layout (`snapshots/…`, `templates/…`).
//! - [`store`]: [`Objects`]: upload a file or stream (multipart past a threshold, hashed
//!   as it goes), download verifying size and digest (a mismatch leaves no file), head,
//!   delete, list.
//!
//! **Invariant:** nothing read back from the store is trusted before its size and digest
//! match what was recorded when it was written; an artifact that does not match is an
//! error naming it, and nothing of it is kept.

pub mod config;
pub mod key;
pub mod store;

pub use config::{ObjectStoreConfig, S3Config};
pub use key::ObjectKey;
pub use store::{Artifact, Objects, ObjectsError};

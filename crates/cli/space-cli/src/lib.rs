//! The `space` command's library half: the typed HTTP client of the SPACE API.
//!
//! [`client::SpaceClient`] has one method per endpoint; integration tests and `space bench`
//! use it too, so the CLI and the tests speak to the server the same way.

pub mod client;
pub mod ndjson;
pub mod stats;

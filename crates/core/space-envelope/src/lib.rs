//! Envelope encryption of what SPACE keeps at rest for a tenant (issue 17): each artifact
//! (a snapshot's memory file, its disk delta, a credential) is encrypted under a data key of
//! its own, and only that key, wrapped by the tenant's key in its KMS, is stored beside it.
//!
//! - [`DataKey`]: a fresh random 256-bit key, wiped from memory when dropped, never printed.
//! - [`sealed`]: the on-disk format of one artifact: a header naming the artifact, then its
//!   bytes in chunks, each sealed with AES-256-GCM under the STREAM construction, so
//!   a multi-GiB memory file is sealed and opened with one chunk in memory, and a flipped
//!   byte, a swapped, dropped, repeated or appended chunk, a truncation, or a file moved to
//!   another artifact's name is refused.
//!
//! Pure: bytes in, bytes out (`std::io` readers and writers); no keys are fetched here.

pub mod data_key;
pub mod sealed;

pub use data_key::DataKey;
pub use sealed::{
    is_sealed_file, open, open_file, seal, seal_file, sealed_artifact_id, sealed_len,
    EnvelopeError, DEFAULT_CHUNK,
};

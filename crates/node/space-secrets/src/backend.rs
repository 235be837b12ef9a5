//! Where values (and their metadata) are kept: the [`SecretBackend`] trait and its error.
//!
//! The trait is asynchronous. The gateway serves requests on an async runtime, and one of the
//! backends runs an external program that may take seconds (bounded by its timeout): a
//! synchronous call would park a runtime worker for that long. Futures are boxed
//! ([`BoxFuture`]) so that the manager can hold any backend as `Arc<dyn SecretBackend>`,
//! chosen by configuration at run time. The request path stays cheap because the manager
//! keeps metadata in memory and caches values for a short TTL (see [`crate::cache`]): a
//! backend is asked for a value only on the first use and after the TTL.
//!
//! Implementations: [`crate::store::EncryptedFileStore`] (encrypted files on the node) and
//! [`crate::command::CommandBackend`] (an external credential helper).

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;

use crate::command::CommandError;
use crate::keyfile::KeyFileError;
use crate::model::{Credential, CredentialId, ValidationError};
use crate::secret::{SecretError, SecretValue};

/// A boxed, sendable future (what [`SecretBackend`] methods return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a backend operation failed. Never contains a secret value.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No such credential.
    #[error("credential {0} not found")]
    NotFound(CredentialId),
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A stored file cannot be parsed.
    #[error("{path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A stored file fails authentication: changed, swapped with another credential's file,
    /// or encrypted under another key.
    #[error(
        "{path} failed authentication (tampered with, swapped, or encrypted under another key)"
    )]
    Tampered {
        /// The file.
        path: PathBuf,
    },
    /// The key file cannot be used.
    #[error(transparent)]
    Key(#[from] KeyFileError),
    /// The credential helper failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// The value is not acceptable.
    #[error(transparent)]
    Value(#[from] SecretError),
    /// The metadata is not acceptable.
    #[error("invalid credential: {0}")]
    Invalid(#[from] ValidationError),
    /// The backend holds more credentials than it may.
    #[error("backend holds more than {0} credentials")]
    TooMany(usize),
    /// A blocking task died (a bug).
    #[error("backend task failed: {0}")]
    Task(String),
}

/// A place that keeps credential values and metadata. All methods may block on I/O or a
/// subprocess, so they are async; none ever logs a value.
pub trait SecretBackend: Send + Sync {
    /// A short name for logs (`file`, `command`).
    fn kind(&self) -> &'static str;

    /// The value of `credential` (the metadata is passed so that a helper can be told the
    /// credential's name and scope).
    fn get<'a>(
        &'a self,
        credential: &'a Credential,
    ) -> BoxFuture<'a, Result<SecretValue, BackendError>>;

    /// Creates or replaces `credential` (same id) with `value`.
    fn put<'a>(
        &'a self,
        credential: &'a Credential,
        value: &'a SecretValue,
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Deletes a credential; [`BackendError::NotFound`] if there is none.
    fn delete<'a>(&'a self, id: &'a CredentialId) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Every credential's metadata (authenticated where the backend can), in no particular
    /// order.
    fn list_metadata(&self) -> BoxFuture<'_, Result<Vec<Credential>, BackendError>>;
}

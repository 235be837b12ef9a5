//! An in-memory backend: for tests (of this crate and of the gateway) and for nodes that
//! deliberately keep credentials only for their lifetime. Values are wiped when removed or
//! when the backend is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::backend::{BackendError, BoxFuture, SecretBackend};
use crate::model::{Credential, CredentialId};
use crate::secret::SecretValue;

/// Credentials in a map (see the module doc).
#[derive(Default)]
pub struct MemoryBackend {
    entries: Mutex<HashMap<CredentialId, (Credential, SecretValue)>>,
    gets: AtomicUsize,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("credentials", &self.lock().len())
            .finish()
    }
}

impl MemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many times [`SecretBackend::get`] was called (tests check the cache with it).
    pub fn get_count(&self) -> usize {
        self.gets.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CredentialId, (Credential, SecretValue)>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SecretBackend for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn get<'a>(
        &'a self,
        credential: &'a Credential,
    ) -> BoxFuture<'a, Result<SecretValue, BackendError>> {
        Box::pin(async move {
            self.gets.fetch_add(1, Ordering::Relaxed);
            self.lock()
                .get(&credential.id)
                .map(|(_, v)| v.duplicate())
                .ok_or_else(|| BackendError::NotFound(credential.id.clone()))
        })
    }

    fn put<'a>(
        &'a self,
        credential: &'a Credential,
        value: &'a SecretValue,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            credential.validate()?;
            self.lock().insert(
                credential.id.clone(),
                (credential.clone(), value.duplicate()),
            );
            Ok(())
        })
    }

    fn delete<'a>(&'a self, id: &'a CredentialId) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.lock()
                .remove(id)
                .map(drop)
                .ok_or_else(|| BackendError::NotFound(id.clone()))
        })
    }

    fn list_metadata(&self) -> BoxFuture<'_, Result<Vec<Credential>, BackendError>> {
        Box::pin(async move { Ok(self.lock().values().map(|(c, _)| c.clone()).collect()) })
    }
}

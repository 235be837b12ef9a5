//! Key services: where customers' keys live, and the one thing SPACE asks of them — wrap a
//! data key under the customer's key, and unwrap it again.
//!
//! Tenant data at rest is sealed under data keys of its own ([`space_envelope`]); only the
//! data key *wrapped* by the tenant's customer key is ever stored. A customer key is a key at
//! one of the operator's key services ([`config`]), named by a [`KeyAccess`]:
//! - [`kmip`]: a KMIP server, which encrypts and decrypts with the key inside it (the key
//!   never leaves the server);
//! - [`pkcs11`]: an HSM through its PKCS#11 module (AES-GCM inside the token);
//! - [`command`]: an external helper, for cloud KMSs;
//! - [`local`]: the built-in local service, master keys in files outside the data
//!   directory (the weaker choice: for offline and single-machine use).
//!
//! Every wrap is bound to a *context* (the caller's: tenant and data key id), as AEAD
//! associated data, so a wrapped key copied to another tenant's or artifact's record does not
//! unwrap. The control plane is the only process that talks to key services; plaintext data
//! keys go from it to a node's sandbox manager for one operation, in memory.

pub mod access;
pub mod command;
pub mod config;
pub mod error;
pub mod kmip;
pub mod local;
pub mod pkcs11;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use access::{KeyAccess, KeyCredentials};
pub use config::{KmsConfig, ProviderConfig};
pub use error::{KmsError, Unavailable};
pub use space_envelope::DataKey;

/// A boxed future (the trait is used as `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Most bytes of a wrapped data key (a helper's format is its own; ours are 60-72).
pub const MAX_WRAPPED_LEN: usize = 4096;

/// One key service.
pub trait KeyService: Send + Sync {
    /// The kind (`kmip`, `pkcs11`, `command`, `local`).
    fn kind(&self) -> &'static str;

    /// `data_key` wrapped under the key `access` names, bound to `context`.
    fn wrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        data_key: &'a DataKey,
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, KmsError>>;

    /// The data key in `wrapped`, if the key `access` names unwraps it for `context`.
    fn unwrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        wrapped: &'a [u8],
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<DataKey, KmsError>>;
}

/// The operator's key services, by name.
#[derive(Clone, Default)]
pub struct KeyServices {
    services: BTreeMap<String, Arc<dyn KeyService>>,
    /// The local ones again, for what only they do (make, disable, destroy keys).
    locals: BTreeMap<String, Arc<local::LocalService>>,
}

impl std::fmt::Debug for KeyServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.services.iter().map(|(n, s)| (n, s.kind())))
            .finish()
    }
}

impl KeyServices {
    /// The services `config` describes. A PKCS#11 module is loaded here, once per process;
    /// a KMIP server's CA file is read here.
    pub fn from_config(config: &KmsConfig) -> Result<KeyServices, KmsError> {
        config.validate()?;
        let mut services: BTreeMap<String, Arc<dyn KeyService>> = BTreeMap::new();
        let mut locals = BTreeMap::new();
        for (name, provider) in &config.providers {
            let service: Arc<dyn KeyService> = match provider {
                ProviderConfig::Kmip {
                    address,
                    server_name,
                    ca_file,
                    timeout_ms,
                } => Arc::new(kmip::KmipService::new(
                    address,
                    server_name.as_deref(),
                    ca_file,
                    timeout_ms.map(std::time::Duration::from_millis),
                )?),
                ProviderConfig::Pkcs11 { module, token } => {
                    Arc::new(pkcs11::Pkcs11Service::new(module, token.clone())?)
                }
                ProviderConfig::Command {
                    program,
                    args,
                    timeout_ms,
                } => Arc::new(command::CommandService::new(
                    program.clone(),
                    args.clone(),
                    timeout_ms.map(std::time::Duration::from_millis),
                )?),
                ProviderConfig::Local { master_key_dir } => {
                    let service = Arc::new(local::LocalService::new(master_key_dir.clone()));
                    locals.insert(name.clone(), service.clone());
                    service
                }
            };
            services.insert(name.clone(), service);
        }
        Ok(KeyServices { services, locals })
    }

    /// The local key service called `name`, if that is what it is.
    pub fn local(&self, name: &str) -> Option<&Arc<local::LocalService>> {
        self.locals.get(name)
    }

    /// The service called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn KeyService>> {
        self.services.get(name)
    }

    /// The services' names and kinds.
    pub fn list(&self) -> impl Iterator<Item = (&str, &'static str)> {
        self.services.iter().map(|(n, s)| (n.as_str(), s.kind()))
    }
}

/// The data key in `wrapped`: [`KeyService::unwrap`], and when that fails in a way that
/// does not say why (KMIP servers and PKCS#11 tokens commonly report a GCM tag mismatch as a
/// general failure), a round trip of a throwaway key tells the two causes apart: if the
/// service wraps and unwraps that, it is healthy and `wrapped` was refused
/// ([`KmsError::WrappedKeyRejected`]); otherwise the first error stands. What callers use.
pub async fn unwrap_data_key(
    service: &dyn KeyService,
    access: &KeyAccess,
    wrapped: &[u8],
    context: &[u8],
) -> Result<DataKey, KmsError> {
    match service.unwrap(access, wrapped, context).await {
        Err(e @ (KmsError::Unreachable(_) | KmsError::Protocol(_))) => {
            match check_round_trip(service, access, context).await {
                Ok(()) => Err(KmsError::WrappedKeyRejected),
                Err(_) => Err(e),
            }
        }
        other => other,
    }
}

/// Whether the key `access` names can wrap and unwrap now: one round trip of a throwaway
/// data key (what registration and rotation prove before they rely on a key).
pub async fn check_round_trip(
    service: &dyn KeyService,
    access: &KeyAccess,
    context: &[u8],
) -> Result<(), KmsError> {
    let probe = DataKey::generate();
    let wrapped = service.wrap(access, &probe, context).await?;
    let back = service.unwrap(access, &wrapped, context).await?;
    if back.expose() != probe.expose() {
        return Err(KmsError::Protocol(
            "a wrapped key unwrapped to different bytes".into(),
        ));
    }
    Ok(())
}

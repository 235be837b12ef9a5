//! The PKCS#11 key service: a customer's key is an AES secret key on a token of the
//! operator's PKCS#11 module (an HSM's, a cloud HSM's, SoftHSM2's), found by its label, and a
//! data key is encrypted inside the token with `CKM_AES_GCM` (a fresh 96-bit IV, the context
//! as additional data, a 128-bit tag). The key never leaves the token.
//!
//! A wrapped data key is `IV (12) ‖ ciphertext and tag (48)`.
//!
//! PKCS#11 logins belong to the whole application, not to a session: once one customer key's
//! PIN logged a token in, every session of the process could use that token's keys. So calls
//! are serialised per module, and each logs in with its own customer key's PIN and logs out
//! when done: a wrong PIN never rides on another call's login.

use std::path::Path;
use std::sync::{Arc, Mutex};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::aead::GcmParams;
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::types::AuthPin;
use rand::RngCore;
use zeroize::Zeroizing;

use crate::error::{KmsError, Unavailable};
use crate::{BoxFuture, DataKey, KeyAccess, KeyCredentials, KeyService};

const IV_LEN: usize = 12;
const TAG_BITS: u64 = 128;

/// The PKCS#11 key service.
pub struct Pkcs11Service {
    module: Pkcs11,
    default_token: Option<String>,
    /// One call at a time (see the module doc).
    calls: Arc<Mutex<()>>,
}

impl Pkcs11Service {
    /// Loads and initialises `module` (once per process and module).
    pub fn new(module: &Path, default_token: Option<String>) -> Result<Pkcs11Service, KmsError> {
        let config = |e: CkError| KmsError::Config(format!("PKCS#11 {}: {e}", module.display()));
        let pkcs11 = Pkcs11::new(module).map_err(config)?;
        pkcs11
            .initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK))
            .map_err(config)?;
        Ok(Pkcs11Service {
            module: pkcs11,
            default_token,
            calls: Arc::new(Mutex::new(())),
        })
    }

    /// Runs `op` with the customer key's token logged in with its PIN, and the key's handle.
    async fn with_key<T, F>(&self, access: &KeyAccess, op: F) -> Result<T, KmsError>
    where
        T: Send + 'static,
        F: FnOnce(&Session, ObjectHandle) -> Result<T, KmsError> + Send + 'static,
    {
        let KeyCredentials::Pin { pin } = &access.credentials else {
            return Err(KmsError::InvalidAccess(
                "a PKCS#11 key needs pin credentials".into(),
            ));
        };
        let token = access
            .token
            .clone()
            .or_else(|| self.default_token.clone())
            .ok_or_else(|| {
                KmsError::InvalidAccess("name the key's token (this service has no default)".into())
            })?;
        let pin = pin.clone();
        let label = access.key_id.clone();
        let module = self.module.clone();
        let calls = self.calls.clone();
        tokio::task::spawn_blocking(move || {
            let _one_at_a_time = calls.lock().unwrap_or_else(|p| p.into_inner());
            let session = open(&module, &token)?;
            // Another call of ours always logs out; a login left by anything else is ended
            // so that this call's own PIN is the one checked.
            let _ = session.logout();
            session
                .login(UserType::User, Some(&AuthPin::new(pin.as_str().into())))
                .map_err(|e| match e {
                    CkError::Pkcs11(
                        RvError::PinIncorrect | RvError::PinLocked | RvError::PinExpired,
                        _,
                    ) => KmsError::KeyUnavailable {
                        reason: Unavailable::NotPermitted,
                        detail: format!("token {token:?} refused the PIN"),
                    },
                    other => device(other),
                })?;
            let result = find_key(&session, &label).and_then(|key| op(&session, key));
            let _ = session.logout();
            result
        })
        .await
        .map_err(|e| KmsError::Unreachable(format!("PKCS#11 call did not finish: {e}")))?
    }
}

/// A read-only session on the token labelled `token`.
fn open(module: &Pkcs11, token: &str) -> Result<Session, KmsError> {
    for slot in module.get_slots_with_token().map_err(device)? {
        let info = module.get_token_info(slot).map_err(device)?;
        if info.label().trim_end() == token {
            return module.open_ro_session(slot).map_err(device);
        }
    }
    Err(KmsError::KeyUnavailable {
        reason: Unavailable::NotFound,
        detail: format!("no token labelled {token:?}"),
    })
}

/// The one AES secret key labelled `label`.
fn find_key(session: &Session, label: &str) -> Result<ObjectHandle, KmsError> {
    let found = session
        .find_objects(&[
            Attribute::Class(ObjectClass::SECRET_KEY),
            Attribute::Label(label.as_bytes().to_vec()),
        ])
        .map_err(device)?;
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(KmsError::KeyUnavailable {
            reason: Unavailable::NotFound,
            detail: format!("no secret key labelled {label:?} (destroyed?)"),
        }),
        _ => Err(KmsError::InvalidAccess(format!(
            "more than one secret key is labelled {label:?}"
        ))),
    }
}

/// What the token said, as our error.
fn device(e: CkError) -> KmsError {
    match e {
        CkError::Pkcs11(RvError::KeyHandleInvalid | RvError::ObjectHandleInvalid, _) => {
            KmsError::KeyUnavailable {
                reason: Unavailable::NotFound,
                detail: e.to_string(),
            }
        }
        CkError::Pkcs11(RvError::KeyFunctionNotPermitted | RvError::KeyTypeInconsistent, _) => {
            KmsError::KeyUnavailable {
                reason: Unavailable::Revoked,
                detail: "the key may not encrypt and decrypt with AES-GCM".into(),
            }
        }
        CkError::Pkcs11(RvError::UserNotLoggedIn, _) => KmsError::KeyUnavailable {
            reason: Unavailable::NotPermitted,
            detail: e.to_string(),
        },
        CkError::Pkcs11(RvError::EncryptedDataInvalid | RvError::EncryptedDataLenRange, _) => {
            KmsError::WrappedKeyRejected
        }
        other => KmsError::Unreachable(format!("PKCS#11: {other}")),
    }
}

impl KeyService for Pkcs11Service {
    fn kind(&self) -> &'static str {
        "pkcs11"
    }

    fn wrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        data_key: &'a DataKey,
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, KmsError>> {
        let plain = Zeroizing::new(data_key.expose().to_vec());
        let context = context.to_vec();
        Box::pin(async move {
            self.with_key(access, move |session, key| {
                let mut iv = [0u8; IV_LEN];
                rand::rngs::OsRng.fill_bytes(&mut iv);
                let mut iv_param = iv;
                let params =
                    GcmParams::new(&mut iv_param, &context, TAG_BITS.into()).map_err(device)?;
                let sealed = session
                    .encrypt(&Mechanism::AesGcm(params), key, &plain)
                    .map_err(device)?;
                let mut out = iv.to_vec();
                out.extend_from_slice(&sealed);
                Ok(out)
            })
            .await
        })
    }

    fn unwrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        wrapped: &'a [u8],
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<DataKey, KmsError>> {
        let wrapped = wrapped.to_vec();
        let context = context.to_vec();
        Box::pin(async move {
            if wrapped.len() <= IV_LEN {
                return Err(KmsError::WrappedKeyRejected);
            }
            self.with_key(access, move |session, key| {
                let (iv, sealed) = wrapped.split_at(IV_LEN);
                let mut iv = iv.to_vec();
                let params = GcmParams::new(&mut iv, &context, TAG_BITS.into()).map_err(device)?;
                let plain = Zeroizing::new(
                    session
                        .decrypt(&Mechanism::AesGcm(params), key, sealed)
                        .map_err(device)?,
                );
                DataKey::from_bytes(&plain).ok_or(KmsError::WrappedKeyRejected)
            })
            .await
        })
    }
}

//! The command key service: an external helper wraps and unwraps, for KMSs SPACE does not
//! speak itself (cloud KMSs, a vault's transit engine). It is run by [`space_helper`]
//! (process group, bounded output, timeout), once per operation, the operation (`wrap` or
//! `unwrap`) appended to the configured arguments; one JSON object on standard input, one on
//! standard output:
//!
//! ```text
//! wrap    in:  {"key_id": "…", "context": "<base64>", "plaintext": "<base64, 32 bytes>"}
//!         out: {"ciphertext": "<base64>"}
//! unwrap  in:  {"key_id": "…", "context": "<base64>", "ciphertext": "<base64>"}
//!         out: {"plaintext": "<base64, 32 bytes>"}
//! either  out: {"error": {"code": "not_found" | "revoked" | "not_permitted" | "rejected",
//!                         "message": "…"}}
//! ```
//!
//! `context` must be bound to the ciphertext (a cloud KMS's encryption context or AAD): an
//! unwrap with another context must fail (`rejected`). An answer in `error` is the key
//! service's verdict and is not retried; a helper that exits unsuccessfully, or does not
//! answer in time, counts as the service being unreachable (retried).

use std::path::PathBuf;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use space_helper::{HelperCommand, HelperError, DEFAULT_HELPER_TIMEOUT};
use zeroize::Zeroizing;

use crate::error::{sanitize, KmsError, Unavailable};
use crate::{BoxFuture, DataKey, KeyAccess, KeyService, MAX_WRAPPED_LEN};

/// Most bytes read from the helper.
const MAX_OUTPUT: usize = 4 * MAX_WRAPPED_LEN;

/// The command key service.
pub struct CommandService {
    helper: HelperCommand,
}

#[derive(Serialize)]
struct Request<'a> {
    key_id: &'a str,
    context: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    plaintext: Option<Zeroizing<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ciphertext: Option<String>,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    ciphertext: Option<String>,
    #[serde(default)]
    plaintext: Option<Zeroizing<String>>,
    #[serde(default)]
    error: Option<HelperVerdict>,
}

#[derive(Deserialize)]
struct HelperVerdict {
    code: String,
    #[serde(default)]
    message: String,
}

impl CommandService {
    /// Runs `program args… <operation>`.
    pub fn new(
        program: PathBuf,
        args: Vec<String>,
        timeout: Option<Duration>,
    ) -> Result<CommandService, KmsError> {
        let helper = HelperCommand {
            program,
            args,
            timeout: timeout.unwrap_or(DEFAULT_HELPER_TIMEOUT),
        };
        helper
            .validate()
            .map_err(|e| KmsError::Config(e.to_string()))?;
        Ok(CommandService { helper })
    }

    async fn call(&self, operation: &str, request: &Request<'_>) -> Result<Answer, KmsError> {
        let input = Zeroizing::new(
            serde_json::to_vec(request).map_err(|e| KmsError::Protocol(e.to_string()))?,
        );
        let out = self
            .helper
            .run(operation, &input, MAX_OUTPUT)
            .await
            .map_err(|e| match e {
                HelperError::Config(m) => KmsError::Config(m),
                other => KmsError::Unreachable(other.to_string()),
            })?;
        // The output may hold a plaintext key: parse errors never quote it.
        let answer: Answer = serde_json::from_slice(&out).map_err(|_| {
            KmsError::Protocol(format!(
                "helper {operation}: the answer is not the protocol's JSON"
            ))
        })?;
        if let Some(verdict) = &answer.error {
            let detail = sanitize(&verdict.message);
            let reason = match verdict.code.as_str() {
                "not_found" => Unavailable::NotFound,
                "revoked" => Unavailable::Revoked,
                "not_permitted" => Unavailable::NotPermitted,
                "rejected" => return Err(KmsError::WrappedKeyRejected),
                _ => {
                    return Err(KmsError::Protocol(format!(
                        "helper {operation}: unknown error code {:?}",
                        sanitize(&verdict.code)
                    )))
                }
            };
            return Err(KmsError::KeyUnavailable { reason, detail });
        }
        Ok(answer)
    }
}

impl KeyService for CommandService {
    fn kind(&self) -> &'static str {
        "command"
    }

    fn wrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        data_key: &'a DataKey,
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, KmsError>> {
        Box::pin(async move {
            let request = Request {
                key_id: &access.key_id,
                context: B64.encode(context),
                plaintext: Some(Zeroizing::new(B64.encode(data_key.expose()))),
                ciphertext: None,
            };
            let answer = self.call("wrap", &request).await?;
            let wrapped = answer
                .ciphertext
                .and_then(|c| B64.decode(c).ok())
                .ok_or_else(|| KmsError::Protocol("helper wrap: no base64 ciphertext".into()))?;
            if wrapped.is_empty() || wrapped.len() > MAX_WRAPPED_LEN {
                return Err(KmsError::Protocol(format!(
                    "helper wrap: ciphertext must be 1 to {MAX_WRAPPED_LEN} bytes"
                )));
            }
            Ok(wrapped)
        })
    }

    fn unwrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        wrapped: &'a [u8],
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<DataKey, KmsError>> {
        Box::pin(async move {
            let request = Request {
                key_id: &access.key_id,
                context: B64.encode(context),
                plaintext: None,
                ciphertext: Some(B64.encode(wrapped)),
            };
            let answer = self.call("unwrap", &request).await?;
            let plain = answer
                .plaintext
                .and_then(|p| B64.decode(p.as_bytes()).ok().map(Zeroizing::new))
                .ok_or_else(|| KmsError::Protocol("helper unwrap: no base64 plaintext".into()))?;
            DataKey::from_bytes(&plain).ok_or_else(|| {
                KmsError::Protocol("helper unwrap: the plaintext is not a 32-byte key".into())
            })
        })
    }
}

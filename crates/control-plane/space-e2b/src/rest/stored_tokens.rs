//! Keeps sandbox tokens out of stored idempotent responses (issue 12, item 8): a create,
//! connect, resume or fork sent with an `Idempotency-Key` is stored without its
//! `envdAccessToken` and `trafficAccessToken` (each left as `null`), and a replay hands the
//! sandbox's tokens out again, as they are now: a token revoked since the first response is
//! never replayed, and the database never holds one.

use axum::body::Bytes;
use futures::future::BoxFuture;
use serde_json::{Map, Value};
use space_control::api::error::ApiError;
use space_control::api::idempotency::ResponseCredentials;
use space_core::{SandboxId, TenantId};

use crate::state::E2bState;

/// The token fields of a [`super::Sandbox`].
const TOKEN_FIELDS: [&str; 2] = ["envdAccessToken", "trafficAccessToken"];

/// [`ResponseCredentials`] of the E2B surface.
pub struct StoredTokens(pub E2bState);

/// A sandbox body's object and id, if `body` is one that carries tokens.
fn sandbox_body(body: &[u8]) -> Option<(Map<String, Value>, SandboxId)> {
    let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let id = object.get("sandboxID")?.as_str()?.parse().ok()?;
    TOKEN_FIELDS
        .iter()
        .any(|f| object.contains_key(*f))
        .then_some((object, id))
}

/// `body` with its token fields set to `null` (unchanged if it has none).
pub fn strip(body: Bytes) -> Bytes {
    let Some((mut object, _)) = sandbox_body(&body) else {
        return body;
    };
    for field in TOKEN_FIELDS {
        if let Some(value) = object.get_mut(field) {
            *value = Value::Null;
        }
    }
    // A map of JSON values always serializes.
    serde_json::to_vec(&object).map_or(body, Bytes::from)
}

/// A stored body with `tokens` (envd, traffic) in place of its `null`s; `None` (the sandbox
/// is gone) drops the fields, as a response without tokens has none.
pub fn fill(body: Bytes, tokens: Option<(String, String)>) -> Bytes {
    let Some((mut object, _)) = sandbox_body(&body) else {
        return body;
    };
    let tokens = tokens.map(|(envd, traffic)| [envd, traffic]);
    for (i, field) in TOKEN_FIELDS.iter().enumerate() {
        if object.get(*field) != Some(&Value::Null) {
            continue;
        }
        match &tokens {
            Some(tokens) => {
                object.insert((*field).to_owned(), Value::String(tokens[i].clone()));
            }
            None => {
                object.remove(*field);
            }
        }
    }
    serde_json::to_vec(&object).map_or(body, Bytes::from)
}

impl ResponseCredentials for StoredTokens {
    fn strip(&self, body: Bytes) -> Bytes {
        strip(body)
    }

    fn restore<'a>(
        &'a self,
        _tenant: &'a TenantId,
        body: Bytes,
    ) -> BoxFuture<'a, Result<Bytes, ApiError>> {
        Box::pin(async move {
            // The stored row is the tenant's own: the id in it is one of its sandboxes.
            let Some((_, id)) = sandbox_body(&body) else {
                return Ok(body);
            };
            let tokens = self.0.hand_out_tokens(&id).await?;
            Ok(fill(body, tokens.map(|t| (t.envd, t.traffic))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sbx-k3v9q0x2m1c8r7t4z5a6";

    fn body(v: Value) -> Bytes {
        Bytes::from(serde_json::to_vec(&v).unwrap())
    }

    fn json(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn stored_bodies_hold_no_token_and_replays_get_the_current_ones() {
        let id: SandboxId = ID.parse().unwrap();
        let original = body(serde_json::json!({
            "sandboxID": id.to_string(), "templateID": "base",
            "envdAccessToken": "secret-envd", "trafficAccessToken": "secret-traffic",
        }));
        let stored = strip(original);
        let text = String::from_utf8(stored.to_vec()).unwrap();
        assert!(!text.contains("secret"), "{text}");
        assert_eq!(json(&stored)["envdAccessToken"], Value::Null);
        let replayed = fill(
            stored.clone(),
            Some(("new-envd".into(), "new-traffic".into())),
        );
        assert_eq!(json(&replayed)["envdAccessToken"], "new-envd");
        assert_eq!(json(&replayed)["trafficAccessToken"], "new-traffic");
        assert_eq!(json(&replayed)["templateID"], "base");
        let gone = json(&fill(stored, None));
        assert!(gone.get("envdAccessToken").is_none() && gone.get("trafficAccessToken").is_none());
    }

    #[test]
    fn other_bodies_are_left_alone() {
        for b in [
            Bytes::from_static(b"not json"),
            body(serde_json::json!({"code": 404, "message": "envdAccessToken"})),
            body(serde_json::json!({"sandboxID": ID, "state": "running"})),
            body(serde_json::json!({"sandboxID": "not an id", "envdAccessToken": "t"})),
            body(serde_json::json!([{"sandboxID": ID, "envdAccessToken": "t"}])),
        ] {
            assert_eq!(strip(b.clone()), b);
            assert_eq!(fill(b.clone(), Some(("a".into(), "b".into()))), b);
        }
    }
}

//! Idempotency keys: one row per `(tenant, Idempotency-Key)`, claimed before a mutating
//! request runs and completed with its response (see [`crate::api::idempotency`]).
//!
//! The primary key makes the claim atomic: of two requests with the same key, exactly one
//! inserts the row. Every row carries a random `token` naming the request that claimed it,
//! so completing or releasing a row can never touch a newer claim of the same key.
//!
//! Response bodies are stored as TEXT (the schema is portable, and PostgreSQL's TEXT cannot
//! hold arbitrary bytes): UTF-8 bodies without NUL as they are, anything else hex-encoded.

use space_core::TenantId;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{Db, DbError};

/// Where a claimed key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdempotencyState {
    /// The request is running (or its server died; see the API module for when such a row
    /// counts as abandoned).
    InProgress,
    /// The response is stored.
    Done,
}

impl IdempotencyState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            IdempotencyState::InProgress => "in_progress",
            IdempotencyState::Done => "done",
        }
    }

    fn parse(s: &str) -> Result<Self, DbError> {
        match s {
            "in_progress" => Ok(IdempotencyState::InProgress),
            "done" => Ok(IdempotencyState::Done),
            other => Err(corrupt(format!("state {other:?}"))),
        }
    }
}

/// A stored response, replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status.
    pub status: u16,
    /// The headers that matter for a replay (lower-case names), in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// One row of `idempotency_keys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    /// Owner.
    pub tenant_id: TenantId,
    /// The client's key.
    pub key: String,
    /// Names the request that claimed the key.
    pub token: String,
    /// Method of that request.
    pub method: String,
    /// Path of that request.
    pub path: String,
    /// SHA-256 (hex) of method, path, query and body.
    pub fingerprint: String,
    /// Running or done.
    pub state: IdempotencyState,
    /// The response, once done.
    pub response: Option<StoredResponse>,
    /// When the key was claimed, ms since the Unix epoch.
    pub created_at_ms: i64,
    /// The replica that runs (or ran) the request; `None` for rows from before replicas
    /// were named.
    pub replica: Option<super::ReplicaId>,
}

/// What a request claims a key with.
#[derive(Debug, Clone, Copy)]
pub struct NewIdempotencyKey<'a> {
    /// Owner.
    pub tenant_id: &'a TenantId,
    /// The client's key.
    pub key: &'a str,
    /// Names this request (random).
    pub token: &'a str,
    /// Request method.
    pub method: &'a str,
    /// Request path.
    pub path: &'a str,
    /// SHA-256 (hex) of method, path, query and body.
    pub fingerprint: &'a str,
    /// Now, ms since the Unix epoch.
    pub now_ms: i64,
    /// The replica that runs the request.
    pub replica: &'a super::ReplicaId,
}

fn corrupt(reason: impl std::fmt::Display) -> DbError {
    DbError::Corrupt {
        table: "idempotency_keys",
        reason: reason.to_string(),
    }
}

const BODY_UTF8: &str = "utf8";
const BODY_HEX: &str = "hex";

/// A body as `(encoding, text)`.
fn encode_body(body: &[u8]) -> (&'static str, String) {
    match std::str::from_utf8(body) {
        Ok(s) if !s.contains('\0') => (BODY_UTF8, s.to_owned()),
        _ => (BODY_HEX, hex::encode(body)),
    }
}

fn decode_body(encoding: &str, text: String) -> Result<Vec<u8>, DbError> {
    match encoding {
        BODY_UTF8 => Ok(text.into_bytes()),
        BODY_HEX => hex::decode(text).map_err(corrupt),
        other => Err(corrupt(format!("body encoding {other:?}"))),
    }
}

const COLUMNS: &str = "tenant_id, idem_key, token, method, path, fingerprint, state, \
     response_status, response_headers, response_body_encoding, response_body, created_at_ms, \
     replica";

fn row_to_record(row: &AnyRow) -> Result<IdempotencyRecord, DbError> {
    let tenant: String = row.try_get("tenant_id")?;
    let state = IdempotencyState::parse(&row.try_get::<String, _>("state")?)?;
    let response = match state {
        IdempotencyState::InProgress => None,
        IdempotencyState::Done => {
            let status: Option<i64> = row.try_get("response_status")?;
            let headers: Option<String> = row.try_get("response_headers")?;
            let encoding: Option<String> = row.try_get("response_body_encoding")?;
            let body: Option<String> = row.try_get("response_body")?;
            let (Some(status), Some(headers), Some(encoding), Some(body)) =
                (status, headers, encoding, body)
            else {
                return Err(corrupt("a done row without its response"));
            };
            Some(StoredResponse {
                status: u16::try_from(status).map_err(corrupt)?,
                headers: serde_json::from_str(&headers).map_err(corrupt)?,
                body: decode_body(&encoding, body)?,
            })
        }
    };
    Ok(IdempotencyRecord {
        tenant_id: tenant.parse().map_err(corrupt)?,
        key: row.try_get("idem_key")?,
        token: row.try_get("token")?,
        method: row.try_get("method")?,
        path: row.try_get("path")?,
        fingerprint: row.try_get("fingerprint")?,
        state,
        response,
        created_at_ms: row.try_get("created_at_ms")?,
        replica: row
            .try_get::<Option<String>, _>("replica")?
            .map(super::ReplicaId::from_stored),
    })
}

impl Db {
    /// Claims a key: inserts an `in_progress` row unless the tenant already has one for this
    /// key. Returns whether this call inserted it (exactly one of concurrent callers does).
    pub async fn claim_idempotency_key(
        &self,
        new: &NewIdempotencyKey<'_>,
    ) -> Result<bool, DbError> {
        let done = sqlx::query(
            "INSERT INTO idempotency_keys (tenant_id, idem_key, token, method, path, fingerprint, state, created_at_ms, replica)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (tenant_id, idem_key) DO NOTHING",
        )
        .bind(new.tenant_id.as_str())
        .bind(new.key)
        .bind(new.token)
        .bind(new.method)
        .bind(new.path)
        .bind(new.fingerprint)
        .bind(IdempotencyState::InProgress.as_str())
        .bind(new.now_ms)
        .bind(new.replica.as_str())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The row of a tenant's key.
    pub async fn idempotency_key(
        &self,
        tenant: &TenantId,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, DbError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM idempotency_keys WHERE tenant_id = $1 AND idem_key = $2"
        );
        let row = sqlx::query(&sql)
            .bind(tenant.as_str())
            .bind(key)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(row_to_record).transpose()
    }

    /// Stores the response of the request that claimed the key with `token`. Returns `false`
    /// if that claim is gone (released as abandoned, or expired).
    pub async fn complete_idempotency_key(
        &self,
        tenant: &TenantId,
        key: &str,
        token: &str,
        response: &StoredResponse,
        now_ms: i64,
    ) -> Result<bool, DbError> {
        let headers = serde_json::to_string(&response.headers)
            .map_err(|e| DbError::Invalid(e.to_string()))?;
        let (encoding, body) = encode_body(&response.body);
        let done = sqlx::query(
            "UPDATE idempotency_keys SET state = $1, response_status = $2, response_headers = $3,
                 response_body_encoding = $4, response_body = $5, completed_at_ms = $6
             WHERE tenant_id = $7 AND idem_key = $8 AND token = $9 AND state = $10",
        )
        .bind(IdempotencyState::Done.as_str())
        .bind(i64::from(response.status))
        .bind(headers)
        .bind(encoding)
        .bind(body)
        .bind(now_ms)
        .bind(tenant.as_str())
        .bind(key)
        .bind(token)
        .bind(IdempotencyState::InProgress.as_str())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes the claim made with `token` (whatever its state), so the key can be used
    /// again. Returns whether it was there.
    pub async fn release_idempotency_key(
        &self,
        tenant: &TenantId,
        key: &str,
        token: &str,
    ) -> Result<bool, DbError> {
        let done = sqlx::query(
            "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND idem_key = $2 AND token = $3",
        )
        .bind(tenant.as_str())
        .bind(key)
        .bind(token)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes every key claimed before `created_before_ms`, done or not. Returns how many.
    pub async fn delete_idempotency_keys_before(
        &self,
        created_before_ms: i64,
    ) -> Result<u64, DbError> {
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE created_at_ms < $1")
            .bind(created_before_ms)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_round_trip() {
        for body in [
            &b""[..],
            b"{\"id\":\"sbx-1\"}",
            "h\u{e9}llo".as_bytes(),
            b"a\0b",
            &[0xff, 0xfe, 0x00, 0x80],
        ] {
            let (enc, text) = encode_body(body);
            assert_eq!(decode_body(enc, text).unwrap(), body);
        }
        assert_eq!(encode_body(b"{}").0, BODY_UTF8);
        assert_eq!(encode_body(b"a\0b").0, BODY_HEX);
        assert!(decode_body("rot13", String::new()).is_err());
    }
}

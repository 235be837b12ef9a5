//! API keys' request rates as token buckets in the database, so that every replica takes
//! from the same bucket: a client that spreads its requests over replicas gets the rate its
//! quota names, not that rate once per replica.
//!
//! A bucket is one row: its level in thousandths of a request, and when it was last
//! taken from, by the database's clock. Taking a request is one statement that refills the
//! bucket for the time since, and takes one request only if one is there; PostgreSQL (or
//! SQLite) serialises concurrent takes on the row.

use std::time::Duration;

use sqlx::Row;

use super::{Backend, Db, DbError};

/// Thousandths of a request per request.
const UNIT: i64 = 1000;

/// What a take says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// A request was taken.
    Allowed,
    /// None left; one is there again after this long.
    Limited(Duration),
}

impl Db {
    /// An SQL expression for the database's clock as one value for a whole statement
    /// (PostgreSQL's transaction time), ms since the Unix epoch.
    fn statement_clock_sql(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT)",
            Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS BIGINT)",
        }
    }

    /// Takes one request from API key `key_id`'s bucket: `burst` requests, refilled at
    /// `rate` per second (a bucket seen for the first time is full).
    pub async fn take_request(
        &self,
        key_id: &str,
        rate: u64,
        burst: u64,
    ) -> Result<RateDecision, DbError> {
        let rate = i64::try_from(rate.max(1)).unwrap_or(i64::MAX / UNIT);
        let cap = i64::try_from(burst.max(1))
            .unwrap_or(i64::MAX / UNIT)
            .saturating_mul(UNIT);
        let now = self.statement_clock_sql();
        // Refilled level: thousandths of a request per ms is `rate`; a clock that went back
        // refills nothing; never above the burst.
        let refilled = format!(
            "(CASE WHEN rate_buckets.level + (CASE WHEN {now} > rate_buckets.updated_at_ms THEN {now} - rate_buckets.updated_at_ms ELSE 0 END) * $3 > $4 \
               THEN $4 \
               ELSE rate_buckets.level + (CASE WHEN {now} > rate_buckets.updated_at_ms THEN {now} - rate_buckets.updated_at_ms ELSE 0 END) * $3 END)"
        );
        let sql = format!(
            "INSERT INTO rate_buckets (key_id, level, updated_at_ms) VALUES ($1, $2, {now}) \
             ON CONFLICT (key_id) DO UPDATE SET level = {refilled} - {UNIT}, updated_at_ms = {now} \
             WHERE {refilled} >= {UNIT} \
             RETURNING level"
        );
        let taken = sqlx::query(&sql)
            .bind(key_id)
            .bind(cap - UNIT)
            .bind(rate)
            .bind(cap)
            .fetch_optional(self.pool())
            .await?;
        if taken.is_some() {
            return Ok(RateDecision::Allowed);
        }
        // Empty: how long until one request has refilled.
        let sql = format!(
            "SELECT level, updated_at_ms, {now} AS now FROM rate_buckets WHERE key_id = $1"
        );
        let row = sqlx::query(&sql)
            .bind(key_id)
            .fetch_optional(self.pool())
            .await?;
        let Some(row) = row else {
            // Removed meanwhile (a key revoked): nothing to wait for.
            return Ok(RateDecision::Allowed);
        };
        let level: i64 = row.try_get("level")?;
        let updated: i64 = row.try_get("updated_at_ms")?;
        let now: i64 = row.try_get("now")?;
        let have = level.saturating_add(now.saturating_sub(updated).max(0).saturating_mul(rate));
        let wait_ms = (UNIT - have).max(1).div_euclid(rate).max(1);
        Ok(RateDecision::Limited(Duration::from_millis(
            u64::try_from(wait_ms).unwrap_or(1),
        )))
    }

    /// Forgets the buckets not taken from for `idle` (a bucket idle that long is full
    /// again anyway). Returns how many.
    pub async fn prune_rate_buckets(&self, idle: Duration) -> Result<u64, DbError> {
        let sql = format!(
            "DELETE FROM rate_buckets WHERE updated_at_ms < {} - $1",
            self.statement_clock_sql()
        );
        let done = sqlx::query(&sql)
            .bind(i64::try_from(idle.as_millis()).unwrap_or(i64::MAX))
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}

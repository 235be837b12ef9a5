//! The control plane's database: desired state (sandboxes), tenants and API keys, the
//! idempotency keys of mutating requests, and each tenant's action log.
//!
//! One implementation for both backends through `sqlx::Any`: SQLite by default (a file in
//! the data directory, WAL mode) and PostgreSQL when given a `postgres://` URL. The SQL is
//! portable (TEXT/BIGINT, `$n` placeholders, which sqlx's SQLite driver also binds by
//! number), so there is one set of queries and one test suite for both.
//!
//! The database holds *desired* state; the node holds live state. The reconciler converges
//! the two.

mod audit;
mod credentials;
mod customer_keys;
mod idempotency;
mod locks;
pub mod migrations;
mod nodes;
mod quotas;
mod rate;
mod replicas;
mod sandboxes;
mod stored_snapshots;
mod tenants;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, Connection, Executor};

pub use audit::{AuditQuery, NewAuditRecord, MAX_AUDIT_FIELD, MAX_AUDIT_PAGE};
pub use credentials::StoredCredential;
pub use customer_keys::{CustomerKeyRemoval, DataKeyRow, StoredCustomerKey, StoredKeyVersion};
pub use idempotency::{IdempotencyRecord, IdempotencyState, NewIdempotencyKey, StoredResponse};
pub use locks::{AdmissionLock, LeaderLock};
pub use nodes::{
    JoinTokenError, JoinTokenInfo, MembershipError, NewNode, NodeLiveness, NodeRow, RemoveNode,
};
pub use rate::RateDecision;
pub use replicas::{QuotaHoldKind, ReplicaId, ReplicaRow};
pub use sandboxes::{DesiredState, SandboxFilter, SandboxRow, SandboxSpec, SandboxTokens};
pub use stored_snapshots::{Commit, StoredPersistent, StoredSnapshotRow, StoredState};
pub use tenants::{ApiKeyInfo, NewApiKey, Tenant};

/// Why a database operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The URL is neither `sqlite:` nor `postgres://`.
    #[error("unsupported database URL (expected sqlite:PATH or postgres://...): {0}")]
    UnsupportedUrl(String),
    /// The database driver failed.
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// A row holds a value this version cannot read.
    #[error("corrupt row in {table}: {reason}")]
    Corrupt {
        /// Table the row is in.
        table: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A unique value (tenant name, sandbox id) is taken.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// A value given to the database layer is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// A referenced row does not exist.
    #[error("{0} not found")]
    NotFound(String),
}

/// Which database is behind the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite (single file).
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

/// A connection pool plus the queries of the control plane. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Db {
    pool: AnyPool,
    backend: Backend,
    /// How to open a connection of its own (the leader lock holds one).
    options: AnyConnectOptions,
    /// Connections that hold tenants' admission locks (PostgreSQL), apart from `pool` so
    /// that the checks made under a lock always find a connection.
    lock_pool: AnyPool,
    /// Serialises this process's action log appends: SQLite cannot upgrade a reading
    /// transaction to a writing one while another waits (`database is locked`), and even on
    /// PostgreSQL a race costs a retry. Other processes' appends race on the primary key.
    audit_appends: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// The default database: `control.db` in the data directory.
pub fn default_sqlite_url(data_dir: &Path) -> String {
    format!("sqlite://{}", data_dir.join("control.db").display())
}

/// The backend a URL selects.
pub fn backend_of(url: &str) -> Result<Backend, DbError> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else {
        Err(DbError::UnsupportedUrl(redact_url(url)))
    }
}

/// The URL without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}://{}:***@{}", &url[..scheme_end], user, &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl Db {
    /// Connects (creating an SQLite file if missing) and applies pending migrations.
    pub async fn connect(url: &str) -> Result<Db, DbError> {
        sqlx::any::install_default_drivers();
        let backend = backend_of(url)?;
        let url = match backend {
            // `mode=rwc` creates the file on first start.
            Backend::Sqlite if !url.contains("mode=") => {
                format!("{url}{}mode=rwc", if url.contains('?') { '&' } else { '?' })
            }
            _ => url.to_owned(),
        };
        let options = AnyConnectOptions::from_str(&url)?;
        if backend == Backend::Sqlite {
            // WAL is a property of the file: set it once, before the pool opens more
            // connections, so readers never block the writer.
            let mut conn = sqlx::AnyConnection::connect_with(&options).await?;
            conn.execute("PRAGMA journal_mode = WAL").await?;
            conn.close().await?;
        }
        let pool = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite { 4 } else { 10 })
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // Per-connection settings: wait for the write lock instead of failing
                        // with SQLITE_BUSY, and enforce the REFERENCES clauses.
                        conn.execute("PRAGMA busy_timeout = 5000").await?;
                        conn.execute("PRAGMA foreign_keys = ON").await?;
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options.clone())
            .await?;
        let lock_pool = match backend {
            // A waiter holds its connection while it waits: at most this many admissions
            // wait at once; more get the pool's timeout (a 503 to retry).
            Backend::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(16)
                    .min_connections(0)
                    .idle_timeout(Duration::from_secs(60))
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(options.clone())
                    .await?
            }
            Backend::Sqlite => pool.clone(),
        };
        let db = Db {
            pool,
            backend,
            options,
            lock_pool,
            audit_appends: Default::default(),
        };
        db.migrate().await?;
        Ok(db)
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes every connection (waits for checked-out ones).
    pub async fn close(&self) {
        self.pool.close().await;
        self.lock_pool.close().await;
    }

    /// Applies every migration not yet recorded. Safe to run at every start, and by
    /// replicas starting together: they take turns (the migration lock), so each migration
    /// is applied once.
    pub async fn migrate(&self) -> Result<(), DbError> {
        let lock = Self::migration_lock(&self.options, self.backend).await?;
        let applied = self.apply_migrations().await;
        if let Some(conn) = lock {
            // Closing the connection releases the lock.
            let _ = sqlx::Connection::close(conn).await;
        }
        applied
    }

    async fn apply_migrations(&self) -> Result<(), DbError> {
        sqlx::query(migrations::CREATE_MIGRATIONS_TABLE)
            .execute(&self.pool)
            .await?;
        for m in migrations::MIGRATIONS {
            let mut tx = self.pool.begin().await?;
            let done: Option<i64> =
                sqlx::query_scalar("SELECT version FROM schema_migrations WHERE version = $1")
                    .bind(m.version)
                    .fetch_optional(&mut *tx)
                    .await?;
            if done.is_some() {
                continue;
            }
            for stmt in m.statements {
                sqlx::query(stmt).execute(&mut *tx).await?;
            }
            sqlx::query("INSERT INTO schema_migrations (version, description, applied_at_ms) VALUES ($1, $2, $3)")
                .bind(m.version)
                .bind(m.description)
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            tracing::info!(
                version = m.version,
                description = m.description,
                "applied database migration"
            );
        }
        Ok(())
    }

    /// Versions of the applied migrations.
    pub async fn applied_migrations(&self) -> Result<Vec<i64>, DbError> {
        Ok(
            sqlx::query_scalar("SELECT version FROM schema_migrations ORDER BY version")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Maps a unique-constraint violation to [`DbError::AlreadyExists`].
fn unique_violation(err: sqlx::Error, what: impl FnOnce() -> String) -> DbError {
    match &err {
        sqlx::Error::Database(db) if db.is_unique_violation() => DbError::AlreadyExists(what()),
        _ => DbError::Sqlx(err),
    }
}

/// Whether a database error is SQLite's "busy" or "locked" (primary codes 5 and 6, with any
/// extended code): in WAL mode a transaction that read before it writes gets it at once,
/// without waiting, when another writer committed meanwhile. Such a transaction is simply
/// run again.
pub(crate) fn is_busy(e: &dyn sqlx::error::DatabaseError) -> bool {
    use sqlx::error::DatabaseError as _;
    e.try_downcast_ref::<sqlx::sqlite::SqliteError>()
        .and_then(|s| s.code())
        .and_then(|c| c.parse::<i64>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_select_backends_and_hide_passwords() {
        assert_eq!(backend_of("sqlite:///tmp/x.db").unwrap(), Backend::Sqlite);
        assert_eq!(
            backend_of("postgres://u:p@h/db").unwrap(),
            Backend::Postgres
        );
        assert!(backend_of("mysql://u:p@h/db").is_err());
        assert_eq!(
            redact_url("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert!(!backend_of("mysql://u:secret@h/db")
            .unwrap_err()
            .to_string()
            .contains("secret"));
    }
}

//! First start: an empty database gets tenant `default` and one API key, written to
//! `<data_dir>/api-key` (mode 0600) so the local CLI finds it.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::db::{Db, DbError};

/// Name of the tenant created on first start.
pub const DEFAULT_TENANT: &str = "default";
/// File the first API key is written to, in the data directory.
pub const API_KEY_FILE: &str = "api-key";

/// Why bootstrapping failed.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The key file could not be written.
    #[error("writing {path}: {source}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Path of the key file in a data directory.
pub fn api_key_path(data_dir: &Path) -> PathBuf {
    data_dir.join(API_KEY_FILE)
}

/// If the database has no tenant yet, creates `default` with one key, writes the key to
/// the key file and returns it (to print once). Otherwise does nothing.
pub async fn bootstrap(db: &Db, data_dir: &Path) -> Result<Option<String>, BootstrapError> {
    if !db.tenants().await?.is_empty() {
        return Ok(None);
    }
    let tenant = match db.create_tenant(DEFAULT_TENANT).await {
        Ok(t) => t,
        // Two servers starting on one database at once: the other one won.
        Err(DbError::AlreadyExists(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let key = db.create_api_key(&tenant.id).await?;
    write_key_file(&api_key_path(data_dir), &key.plaintext.0)?;
    tracing::info!(tenant = DEFAULT_TENANT, key_prefix = %key.info.prefix, "created the first API key");
    Ok(Some(key.plaintext.0))
}

/// Writes a key to `path` with mode 0600, atomically (temp file + rename).
pub fn write_key_file(path: &Path, key: &str) -> Result<(), BootstrapError> {
    let err = |source| BootstrapError::KeyFile {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(format!("{key}\n").as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(())
}

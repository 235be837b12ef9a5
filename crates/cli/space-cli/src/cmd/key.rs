//! `space key`: API keys, administered directly on the database (local admin).

use clap::Subcommand;
use comfy_table::presets::NOTHING;
use comfy_table::Table;
use std::io::Read as _;

use space_control::db::{Db, DbError};
use space_control::keys::{self, KeyFormat};

use crate::{render, Global};

/// Key commands.
#[derive(Subcommand, Debug)]
pub enum KeyCmd {
    /// Create a key for a tenant (the tenant is created if missing); prints the key once.
    Create {
        /// Tenant name.
        #[arg(long)]
        tenant: String,
        /// How to print the key: `space_…`, or `e2b_…` for E2B SDKs (one key either way).
        #[arg(long, value_enum, default_value_t = Format::Space)]
        format: Format,
        /// Database (default: SQLite in the data directory).
        #[arg(long, env = "SPACE_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
    },
    /// List keys (prefixes only).
    List {
        /// Database (default: SQLite in the data directory).
        #[arg(long, env = "SPACE_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
    },
    /// Print a key (read from stdin) in another format: the same key, e.g. `e2b_…` for an
    /// E2B SDK that checks the key's shape (`space key convert --format e2b < api-key`).
    Convert {
        /// The format to print.
        #[arg(long, value_enum, default_value_t = Format::E2b)]
        format: Format,
    },
    /// Revoke a key by id or prefix.
    Revoke {
        /// Key id (`key-...`) or display prefix (`space_1a2b3c4d` or `e2b_1a2b3c4d`).
        key: String,
        /// Database (default: SQLite in the data directory).
        #[arg(long, env = "SPACE_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
    },
}

/// A key's printed form (`space_control::keys::KeyFormat`).
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Format {
    /// `space_<64 hex>`.
    Space,
    /// `e2b_<64 hex>`: what every E2B SDK release accepts.
    E2b,
}

impl From<Format> for KeyFormat {
    fn from(f: Format) -> Self {
        match f {
            Format::Space => KeyFormat::Space,
            Format::E2b => KeyFormat::E2b,
        }
    }
}

async fn open(g: &Global, url: Option<String>) -> anyhow::Result<Db> {
    let cfg = space_control::ServerConfig {
        database_url: url,
        ..space_control::ServerConfig::new(&g.data_dir)
    };
    let local = g.data_dir.join("control.db");
    if cfg.database_url.is_none() {
        let meta = match std::fs::metadata(&local) {
            Ok(m) => m,
            Err(_) => anyhow::bail!(
                "no database in {} (start `space server` once, or pass --database-url / --data-dir)",
                g.data_dir.display()
            ),
        };
        // SQLite adds files beside the database as whoever opens it: as root they would
        // lock the server (user `space`) out of its own database.
        let owner = std::os::unix::fs::MetadataExt::uid(&meta);
        if owner != nix::unistd::geteuid().as_raw() {
            let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(owner))
                .ok()
                .flatten()
                .map_or_else(|| owner.to_string(), |u| u.name);
            anyhow::bail!(
                "{} belongs to {name}, the server's user: run this as it (sudo -u {name} space key …)",
                local.display()
            );
        }
    }
    Ok(Db::connect(&cfg.database_url()).await?)
}

/// Runs a key command.
pub async fn run(g: &Global, c: KeyCmd) -> anyhow::Result<u8> {
    match c {
        KeyCmd::Create {
            tenant,
            format,
            database_url,
        } => {
            let db = open(g, database_url).await?;
            let t = match db.tenant_by_name(&tenant).await? {
                Some(t) => t,
                None => match db.create_tenant(&tenant).await {
                    Ok(t) => t,
                    Err(DbError::AlreadyExists(_)) => db
                        .tenant_by_name(&tenant)
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("tenant vanished"))?,
                    Err(e) => return Err(e.into()),
                },
            };
            let key = db.create_api_key(&t.id).await?;
            let shown = keys::in_format(&key.plaintext.0, format.into())
                .ok_or_else(|| anyhow::anyhow!("the new key is malformed"))?;
            if g.json {
                render::json(
                    &serde_json::json!({"tenant": t.name, "tenant_id": t.id, "key_id": key.info.id, "api_key": shown}),
                )?;
            } else {
                eprintln!(
                    "created key {} for tenant {} (shown once; `space key convert` prints it in the other format):",
                    key.info.id, t.name
                );
                println!("{shown}");
            }
        }
        KeyCmd::Convert { format } => {
            let mut line = String::new();
            // One line: a key is 70 bytes, anything longer is not one.
            std::io::Read::take(std::io::stdin().lock(), 256).read_to_string(&mut line)?;
            let converted = keys::in_format(line.trim(), format.into()).ok_or_else(|| {
                anyhow::anyhow!("stdin holds no API key (`space_` or `e2b_` and 64 lowercase hex)")
            })?;
            println!("{converted}");
        }
        KeyCmd::List { database_url } => {
            let db = open(g, database_url).await?;
            let tenants = db.tenants().await?;
            let keys = db.api_keys(None).await?;
            let name = |id: &space_core::TenantId| {
                tenants
                    .iter()
                    .find(|t| &t.id == id)
                    .map_or("?".to_owned(), |t| t.name.clone())
            };
            if g.json {
                let v: Vec<_> = keys
                    .iter()
                    .map(|k| serde_json::json!({"id": k.id, "tenant": name(&k.tenant_id), "prefix": k.prefix, "created_at_ms": k.created_at_ms, "revoked_at_ms": k.revoked_at_ms}))
                    .collect();
                render::json(&v)?;
            } else {
                let mut t = Table::new();
                t.load_preset(NOTHING)
                    .set_header(vec!["ID", "TENANT", "PREFIX", "CREATED", "REVOKED"]);
                for k in &keys {
                    t.add_row(vec![
                        k.id.clone(),
                        name(&k.tenant_id),
                        k.prefix.clone(),
                        render::relative(k.created_at_ms),
                        k.revoked_at_ms.map(render::relative).unwrap_or_default(),
                    ]);
                }
                println!("{t}");
            }
        }
        KeyCmd::Revoke { key, database_url } => {
            let db = open(g, database_url).await?;
            let k = db.revoke_api_key(&key).await?;
            println!("revoked {} ({})", k.id, k.prefix);
        }
    }
    Ok(0)
}

//! Shared helpers for the control plane's integration tests: temporary databases (SQLite
//! always, PostgreSQL when `SPACE_TEST_POSTGRES_URL` is set) and a running server.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use space_control::db::Db;
use space_control::{Server, ServerConfig};

/// A database that exists for one test and is removed afterwards, even on failure.
pub struct TestDb {
    pub db: Db,
    pub label: &'static str,
    url: String,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<PgDatabase>,
}

impl TestDb {
    /// A second connection pool on the same database, as a restarted server opens it.
    pub async fn reopen(&self) -> Db {
        Db::connect(&self.url).await.unwrap()
    }
}

/// A database nothing has been applied to yet (removed afterwards, even on failure).
pub struct EmptyDb {
    pub url: String,
    pub label: &'static str,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<PgDatabase>,
}

/// Empty SQLite in a temp dir, plus an empty PostgreSQL database if configured.
pub async fn empty_dbs() -> Vec<EmptyDb> {
    let dir = tempfile::tempdir().unwrap();
    let mut out = vec![EmptyDb {
        url: format!(
            "{}?mode=rwc",
            space_control::db::default_sqlite_url(dir.path())
        ),
        label: "sqlite",
        _dir: Some(dir),
        _pg: None,
    }];
    if let Some((url, pg)) = postgres_database().await {
        out.push(EmptyDb {
            url,
            label: "postgres",
            _dir: None,
            _pg: Some(pg),
        });
    }
    out
}

/// SQLite in a temp dir, plus PostgreSQL if configured.
pub async fn test_dbs() -> Vec<TestDb> {
    let mut out = vec![sqlite_db().await];
    if let Some(pg) = postgres_db().await {
        out.push(pg);
    }
    out
}

pub async fn sqlite_db() -> TestDb {
    let dir = tempfile::tempdir().unwrap();
    let url = space_control::db::default_sqlite_url(dir.path());
    let db = Db::connect(&url).await.unwrap();
    TestDb {
        db,
        label: "sqlite",
        url,
        _dir: Some(dir),
        _pg: None,
    }
}

/// A fresh database on the server named by `SPACE_TEST_POSTGRES_URL`, dropped afterwards.
pub async fn postgres_db() -> Option<TestDb> {
    let (url, pg) = postgres_database().await?;
    let db = Db::connect(&url).await.unwrap();
    Some(TestDb {
        db,
        label: "postgres",
        url,
        _dir: None,
        _pg: Some(pg),
    })
}

/// A new, empty database on the server named by `SPACE_TEST_POSTGRES_URL`: its URL, and
/// the guard that drops it.
async fn postgres_database() -> Option<(String, PgDatabase)> {
    let admin_url = std::env::var("SPACE_TEST_POSTGRES_URL")
        .ok()
        .filter(|s| !s.is_empty())?;
    let name = format!(
        "space_test_{}",
        space_core::SandboxId::generate()
            .as_str()
            .trim_start_matches("sbx-")
    );
    run_admin(&admin_url, &format!("CREATE DATABASE {name}")).await;
    Some((
        with_database(&admin_url, &name),
        PgDatabase { admin_url, name },
    ))
}

/// Replaces the database name in a postgres URL (keeping any query string).
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").unwrap() + 3;
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{}", &base[..host_end], name);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

pub async fn run_admin(admin_url: &str, sql: &str) {
    use sqlx::{Connection, Executor};
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(admin_url).await.unwrap();
    conn.execute(sql).await.unwrap();
    conn.close().await.unwrap();
}

struct PgDatabase {
    admin_url: String,
    name: String,
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime: use a thread with its own runtime.
        let admin_url = self.admin_url.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(run_admin(&admin_url, &sql));
        })
        .join();
    }
}

/// Root of what tests create on the machine (shared with the end-to-end suite, whose leak
/// check unmounts it): `$SPACE_TEST_ROOT` or `/var/tmp/space-test`.
pub fn test_root() -> PathBuf {
    std::env::var_os("SPACE_TEST_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/space-test"))
}

/// Size of the shared (sparse) btrfs image, as the end-to-end suite opens it.
const SHARED_STORE_BYTES: u64 = 32 << 30;

/// The shared btrfs store, opened (and loop-mounted if needed) once, under a lock shared by
/// all test processes. Node data directories live on it, so no test mounts anything itself.
fn shared_store_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = test_root();
        std::fs::create_dir_all(&root).unwrap();
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(".setup.lock"))
            .unwrap();
        fs4::fs_std::FileExt::lock_exclusive(&lock).unwrap();
        let store = space_storage::Store::open(&root, SHARED_STORE_BYTES)
            .unwrap_or_else(|e| panic!("shared test store: {e}"));
        let _ = fs4::fs_std::FileExt::unlock(&lock);
        store.root().to_owned()
    })
}

/// A fresh, short data directory on the shared btrfs; removed on drop.
pub struct DataDir(pub PathBuf);

impl DataDir {
    pub fn new() -> DataDir {
        let name = space_core::SandboxId::generate().as_str()[4..14].to_owned();
        let dir = shared_store_root().join("nodes").join(format!("cp{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        DataDir(dir)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server on 127.0.0.1:<free port> with its own data directory (and a real node on it).
pub struct TestServer {
    pub server: Option<Server>,
    pub addr: SocketAddr,
    pub url: String,
    pub key: String,
    pub http: reqwest::Client,
    pub dir: DataDir,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
        let dir = DataDir::new();
        let mut cfg = ServerConfig::new(&dir.0);
        cfg.listen = "127.0.0.1:0".parse().unwrap();
        tweak(&mut cfg);
        let server = Server::start(cfg).await.unwrap();
        let key = server.first_api_key().unwrap().to_owned();
        let addr = server.addr();
        TestServer {
            url: server.url(),
            addr,
            key,
            server: Some(server),
            http: reqwest::Client::new(),
            dir,
        }
    }

    pub fn db(&self) -> &Db {
        &self.server.as_ref().unwrap().state().db
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{}", self.url, path))
            .bearer_auth(&self.key)
    }

    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.url, path))
            .bearer_auth(&self.key)
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }
}

/// Status and parsed ErrorBody of an error response.
pub async fn error_of(resp: reqwest::Response) -> (u16, space_core::ErrorBody) {
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body: space_core::ErrorBody = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("not an ErrorBody ({e}): {status} {text}"));
    (status, body)
}

//! Running the control plane: database, node, reconciler and HTTP server together, with a
//! graceful shutdown that leaves the VMs running (the next start re-adopts them).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::serve::Listener as _;
use axum::Router;
use space_node::{Node, NodeConfig};

use crate::cluster::authority::Authority;
use crate::cluster::membership::Membership;
use crate::cluster::ClusterConfig;
use crate::nodes::Nodes;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{build_app, AppState, DEFAULT_MAX_UPLOAD_BYTES};
use crate::bootstrap::{api_key_path, bootstrap};
use crate::db::{default_sqlite_url, redact_url, Db};
use crate::reconciler::Reconciler;
use crate::tls::{TlsListen, TlsListener};

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// How long shutdown waits for open requests (output streams can be long) before cutting them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Another API served beside SPACE's own on the same listener (the E2B-compatible API of
/// `space-e2b` is one). The control plane knows nothing of it beyond this: it hands over
/// the application state and the native application, and serves what comes back.
pub trait ApiSurface: Send + Sync + std::fmt::Debug {
    /// The application to serve, built around `ctx.native` (which must stay reachable for
    /// every request the surface does not claim).
    fn wrap(&self, ctx: SurfaceContext<'_>) -> anyhow::Result<Router>;
}

/// What an [`ApiSurface`] is built from.
pub struct SurfaceContext<'a> {
    /// The application state its handlers share with SPACE's own.
    pub state: AppState,
    /// SPACE's own application.
    pub native: Router,
    /// The server's data directory, for any key the surface keeps.
    pub data_dir: &'a Path,
    /// The address the server listens on.
    pub addr: SocketAddr,
    /// The address of its TLS listener, if it has one (see [`ServerConfig::tls`]).
    pub tls_addr: Option<SocketAddr>,
    /// On a cluster replica, the key file every replica shares for signing tokens
    /// (`space cluster init` makes it): a token one replica hands out must verify on
    /// another. `None`: the surface keeps its own key in the data directory.
    pub shared_token_key: Option<PathBuf>,
}

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (port 0 picks a free one; see [`Server::addr`]).
    pub listen: SocketAddr,
    /// Data directory: the SQLite database (`control.db`), the first API key (`api-key`) and
    /// the node's data (its store, run directory...).
    pub data_dir: PathBuf,
    /// `sqlite:PATH` or `postgres://...`; `None` = `sqlite://<data_dir>/control.db`.
    pub database_url: Option<String>,
    /// The local node (the single-machine default; not used with `cluster`).
    pub node: NodeConfig,
    /// Run as a replica of a cluster: no node of its own, the nodes of the database's
    /// membership, reached through their agents. `None`: the single-machine default.
    pub cluster: Option<ClusterConfig>,
    /// Largest file upload accepted.
    pub max_upload_bytes: u64,
    /// Run the reconciler (TTL, orphans); tests that stage inconsistent state turn it off.
    pub run_reconciler: bool,
    /// Another API on the same listener (see [`ApiSurface`]); `None`: only SPACE's own.
    pub surface: Option<Arc<dyn ApiSurface>>,
    /// A second listener serving the same application over TLS; `None`: plaintext only.
    pub tls: Option<TlsListen>,
    /// Serve plaintext HTTP on `listen`; `false` (TLS only) needs `tls`.
    pub plaintext: bool,
    /// How long the action log keeps a record.
    pub audit_retention: std::time::Duration,
    /// The operator's quota for every tenant (a tenant's own overrides it field by field).
    pub default_quota: space_core::quota::TenantQuota,
    /// Where suspended sandboxes' snapshots are, for a cluster replica (every node and
    /// replica must use the same store); the single-machine default uses its node's.
    pub object_store: Option<space_objects::ObjectStoreConfig>,
    /// The key services tenants' customer keys may be at (every replica of a cluster names
    /// the same ones). Default: the built-in local one, its master keys in
    /// [`space_kms::config::DEFAULT_LOCAL_MASTER_KEY_DIR`], outside the data directory.
    pub key_services: space_kms::KmsConfig,
    /// How long a passed check of a customer key is trusted.
    pub customer_key_check_ttl: std::time::Duration,
}

/// Default of [`ServerConfig::audit_retention`]: a year.
pub const DEFAULT_AUDIT_RETENTION_DAYS: u64 = 365;

impl ServerConfig {
    /// Defaults for everything but the data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Self {
            listen: DEFAULT_LISTEN
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 7070))),
            node: NodeConfig {
                // The single-machine default's object store: a directory beside the store.
                object_store: Some(space_objects::ObjectStoreConfig::Local {
                    dir: data_dir.join("objects"),
                }),
                ..NodeConfig::new(data_dir.clone())
            },
            cluster: None,
            data_dir,
            database_url: None,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            run_reconciler: true,
            surface: None,
            tls: None,
            plaintext: true,
            audit_retention: std::time::Duration::from_secs(DEFAULT_AUDIT_RETENTION_DAYS * 86_400),
            default_quota: space_core::quota::TenantQuota::embedded_default(),
            object_store: None,
            key_services: space_kms::KmsConfig::local_only(
                space_kms::config::DEFAULT_LOCAL_MASTER_KEY_DIR,
            ),
            customer_key_check_ttl: crate::service::customer_keys::DEFAULT_CHECK_TTL,
        }
    }

    /// The database URL in effect.
    pub fn database_url(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| default_sqlite_url(&self.data_dir))
    }
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    first_api_key: Option<String>,
    api_key_file: PathBuf,
    state: AppState,
    /// The node this process runs (the single-machine default; `None` in a cluster).
    local: Option<Node>,
    stop: watch::Sender<bool>,
    http: Option<JoinHandle<std::io::Result<()>>>,
    https: Option<JoinHandle<std::io::Result<()>>>,
    reconciler: Option<JoinHandle<()>>,
    /// The replica's heartbeat (and, as leader, the forgetting of dead replicas).
    heartbeat: Option<JoinHandle<()>>,
    /// The cluster listener and the liveness sweep (a cluster replica only).
    cluster_http: Option<JoinHandle<std::io::Result<()>>>,
    sweeper: Option<JoinHandle<()>>,
    cluster_addr: Option<SocketAddr>,
}

impl Server {
    /// Opens (and migrates) the database, starts the node, bootstraps the first key, starts
    /// the reconciler and the HTTP server. Returns once it is accepting connections.
    pub async fn start(config: ServerConfig) -> anyhow::Result<Server> {
        secure_data_dir(&config.data_dir)?;
        let url = config.database_url();
        let db = Db::connect(&url)
            .await
            .with_context(|| format!("opening database {}", redact_url(&url)))?;
        // SQLite made a new database file by the umask: private at once (its journal files
        // take its mode).
        secure_data_dir(&config.data_dir)?;
        if config.cluster.is_some() {
            return Self::start_inner(&config, db, None).await;
        }
        let node = Node::start(config.node.clone())
            .await
            .context("starting the node")?;
        Self::start_with(&config, db, node).await
    }

    /// Like [`Server::start`] with an already open database and running node (tests share
    /// one node between servers this way); `config.node` and `config.database_url` are not
    /// used.
    pub async fn start_with(config: &ServerConfig, db: Db, node: Node) -> anyhow::Result<Server> {
        Self::start_inner(config, db, Some(node)).await
    }

    async fn start_inner(
        config: &ServerConfig,
        db: Db,
        local: Option<Node>,
    ) -> anyhow::Result<Server> {
        secure_data_dir(&config.data_dir)?;
        let data_dir = config.data_dir.as_path();
        let first_api_key = bootstrap(&db, data_dir).await?;
        crate::api::idempotency::delete_expired_at_start(&db).await;
        let authority = match &config.cluster {
            Some(c) => Some(
                Authority::new(
                    crate::cluster::authority::load(&c.ca_dir)
                        .context("reading the cluster CA (made by `space cluster init`)")?,
                )
                .context("issuing this replica's cluster identities")?,
            ),
            None => None,
        };
        let nodes = match (&local, &authority) {
            (Some(node), _) => Nodes::single(Arc::new(node.clone())),
            (None, Some(authority)) => {
                let nodes = Nodes::cluster(authority.dialer.clone());
                nodes.refresh(&db.nodes().await.context("reading the cluster's nodes")?);
                nodes
            }
            (None, None) => {
                anyhow::bail!("a server without a node of its own must be a cluster replica")
            }
        };
        let credential_key = match &config.cluster {
            Some(c) => crate::cluster::authority::shared_key(
                &c.ca_dir,
                crate::cluster::authority::CREDENTIAL_KEY_FILE,
            )?,
            None => space_secrets::keyfile::load_or_create_key(
                &data_dir.join(CONTROL_CREDENTIAL_KEY_FILE),
            )
            .context("the control plane's credential key")?,
        };
        let replica = crate::replica::Replica::register(db.clone())
            .await
            .context("registering this replica")?;
        for (name, provider) in &config.key_services.providers {
            if let space_kms::ProviderConfig::Local { master_key_dir } = provider {
                anyhow::ensure!(
                    !master_key_dir.starts_with(data_dir),
                    "key service {name}: its master keys ({}) must be outside the data directory ({}), or a copy of that directory would carry the keys that open it",
                    master_key_dir.display(),
                    data_dir.display()
                );
            }
        }
        let key_services = space_kms::KeyServices::from_config(&config.key_services)
            .context("the key services of customer keys")?;
        let mut state = AppState::new(db, nodes, replica, credential_key, config.max_upload_bytes)
            .with_default_quota(config.default_quota);
        state.customer_keys = Arc::new(crate::service::customer_keys::CustomerKeys::new(
            key_services,
            config.customer_key_check_ttl,
        ));
        let object_store = match (&config.object_store, &local) {
            (Some(c), _) => Some(c.clone()),
            (None, Some(_)) => config.node.object_store.clone(),
            (None, None) => None,
        };
        state.objects = object_store
            .as_ref()
            .map(space_objects::Objects::open)
            .transpose()
            .context("opening the object store")?;
        if let Some(node) = &local {
            adopt_node_credentials(&state, node)
                .await
                .context("syncing the node's credentials with the catalog")?;
        }
        if let Some(authority) = &authority {
            state.cluster_ca_fingerprint = Some(authority.ca.fingerprint()?);
        }
        state
            .apply_connection_limits()
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.body))
            .context("applying the tenants' connection limits")?;
        let listen = config.listen;
        let listener = if config.plaintext {
            if !listen.ip().is_loopback() {
                tracing::warn!(%listen, "plaintext HTTP on an address other hosts can reach: API keys and tokens cross the network in clear (use --tls-listen and --no-plaintext-listener)");
            }
            Some(
                TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("listening on {listen}"))?,
            )
        } else {
            None
        };
        let tls = match &config.tls {
            Some(tls) => Some(TlsListener::bind(tls).await?),
            None => None,
        };
        let tls_addr = tls.as_ref().map(|l| l.local_addr()).transpose()?;
        // The address clients are told: the plaintext listener's, else the TLS one's.
        let addr = match (&listener, tls_addr) {
            (Some(l), _) => l.local_addr()?,
            (None, Some(a)) => a,
            (None, None) => anyhow::bail!(
                "no listener: the plaintext listener is off and there is no TLS listener (--tls-listen)"
            ),
        };
        let mut app = build_app(state.clone());
        if let Some(surface) = &config.surface {
            app = surface
                .wrap(SurfaceContext {
                    state: state.clone(),
                    native: app,
                    data_dir,
                    addr,
                    tls_addr,
                    shared_token_key: config.cluster.as_ref().map(|c| {
                        c.ca_dir
                            .join(crate::cluster::authority::SHARED_TOKEN_KEY_FILE)
                    }),
                })
                .with_context(|| format!("setting up {surface:?}"))?;
        }
        let (stop, stop_rx) = watch::channel(false);
        let reconciler_of = Reconciler::new(state.clone(), config.audit_retention);
        let (mut cluster_http, mut sweeper, mut cluster_addr) = (None, None, None);
        if let (Some(c), Some(authority)) = (&config.cluster, authority) {
            let tcp = TcpListener::bind(c.listen)
                .await
                .with_context(|| format!("cluster listener on {}", c.listen))?;
            cluster_addr = Some(tcp.local_addr()?);
            let tls = TlsListener::new(tcp, (*authority.listener).clone())?;
            let membership = Membership::new(
                state.clone(),
                authority,
                reconciler_of.clone(),
                c.heartbeat_timeout,
            );
            cluster_http = Some(space_tls::serve_with_peers(
                tls,
                crate::cluster::listener::router(membership),
                stop_rx.clone(),
            ));
            sweeper = Some(crate::cluster::spawn_sweeper(
                state.db.clone(),
                state.nodes.clone(),
                state.replica.clone(),
                c,
                stop_rx.clone(),
            ));
            tracing::info!(listen = ?cluster_addr, "cluster listener up");
        }
        let reconciler = if config.run_reconciler {
            Some(reconciler_of.spawn(stop_rx.clone()))
        } else {
            None
        };
        let heartbeat = Some(state.replica.clone().spawn(stop_rx.clone()));
        let https = tls.map(|l| spawn_http(l, app.clone(), stop_rx.clone()));
        let http = listener.map(|l| spawn_http(l, app, stop_rx));
        tracing::info!(%addr, ?tls_addr, "SPACE control plane listening");
        Ok(Server {
            addr,
            tls_addr,
            first_api_key,
            api_key_file: api_key_path(data_dir),
            state,
            local,
            stop,
            http,
            https,
            reconciler,
            heartbeat,
            cluster_http,
            sweeper,
            cluster_addr,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, or `https://ADDR` when only TLS is served.
    pub fn url(&self) -> String {
        let scheme = if self.http.is_some() { "http" } else { "https" };
        format!("{scheme}://{}", self.addr)
    }

    /// The address of the TLS listener, if there is one.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The API key created on this start (first start with an empty database only).
    pub fn first_api_key(&self) -> Option<&str> {
        self.first_api_key.as_deref()
    }

    /// Where the first API key was written.
    pub fn api_key_file(&self) -> &Path {
        &self.api_key_file
    }

    /// The application state (database, node).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The node this process runs (for tests and benchmarks of node internals).
    ///
    /// # Panics
    /// On a cluster replica, which runs no node: a test's mistake.
    pub fn local_node(&self) -> &Node {
        self.local
            .as_ref()
            .expect("local_node() of a cluster replica (it runs no node)")
    }

    /// Where the cluster listener is (a cluster replica only).
    pub fn cluster_addr(&self) -> Option<SocketAddr> {
        self.cluster_addr
    }

    /// Stops the HTTP server (open streams get [`SHUTDOWN_GRACE`]), the reconciler and the
    /// node's background tasks. VMs keep running.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        // Both listeners drain at once, within one grace period.
        let grace = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        for http in self
            .http
            .into_iter()
            .chain(self.https)
            .chain(self.cluster_http)
        {
            finish_http(http, grace).await;
        }
        if let Some(r) = self.reconciler {
            let _ = r.await;
        }
        if let Some(s) = self.sweeper {
            let _ = s.await;
        }
        if let Some(h) = self.heartbeat {
            let _ = h.await;
        }
        self.state.replica.leave().await;
        if let Some(local) = self.local {
            local.shutdown().await;
        }
        self.state.db.close().await;
    }

    /// Serves until SIGINT or SIGTERM, then shuts down.
    pub async fn run_until_signal(self) -> anyhow::Result<()> {
        wait_for_signal().await?;
        tracing::info!("shutting down (sandboxes keep running)");
        self.shutdown().await;
        Ok(())
    }
}

/// Waits until `deadline` for a server task to end after its stop, then cuts it.
async fn finish_http(mut http: JoinHandle<std::io::Result<()>>, deadline: tokio::time::Instant) {
    match tokio::time::timeout_at(deadline, &mut http).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server ended with an error"),
        Ok(Err(e)) => tracing::warn!(error = %e, "HTTP server task failed"),
        Err(_) => {
            tracing::info!("open requests did not finish in time; closing them");
            http.abort();
        }
    }
}

/// Serves `app` on `listener` until `stop` turns true.
pub fn spawn_http<L>(
    listener: L,
    app: Router,
    stop: watch::Receiver<bool>,
) -> JoinHandle<std::io::Result<()>>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(space_tls::stopped(stop))
            .await
    })
}

/// Runs the server until SIGINT/SIGTERM: the whole of `space server`, minus the banner.
pub async fn serve(config: ServerConfig) -> anyhow::Result<()> {
    let server = Server::start(config).await?;
    println!("SPACE listening on {}", server.url());
    server.run_until_signal().await
}

/// Resolves at the first SIGTERM or SIGINT.
pub async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// The single-machine default's credential key (the control plane seals credential values
/// with it in the catalog; a cluster's replicas share the cluster directory's instead).
pub const CONTROL_CREDENTIAL_KEY_FILE: &str = "control-credentials.key";

/// At the start of the single-machine default: the catalog takes the credentials the node
/// kept on its own before the catalog existed (once: only while the catalog has never
/// changed), then the node is synced with the catalog.
async fn adopt_node_credentials(st: &AppState, node: &Node) -> anyhow::Result<()> {
    if st.db.credential_revision().await? == 0 {
        let held = node.credentials().export().await?;
        for (credential, value) in held {
            let tenant = credential.scope.tenant().clone();
            if st.db.tenant(&tenant).await?.is_none() {
                tracing::warn!(credential = %credential.id, %tenant, "a node credential of a tenant the database does not know: left out of the catalog (the sync removes it from the node)");
                continue;
            }
            let stored = crate::db::StoredCredential {
                sealed_value: st
                    .credential_sealer
                    .seal(&credential.id, &value)
                    .map_err(|e| anyhow::anyhow!("{}", e.body.message))?,
                credential,
            };
            st.db.put_credential(&stored, false).await?;
            tracing::info!(credential = %stored.credential.id, "credential taken into the catalog");
        }
    }
    crate::service::credentials::sync_node(st, node).await?;
    Ok(())
}

/// Files of the data directory only its owner may read: the SQLite database (API key
/// hashes, tenants, sandboxes) with its journal files, and the first API key.
pub const PRIVATE_FILES: &[&str] = &[
    "control.db",
    "control.db-wal",
    "control.db-shm",
    crate::bootstrap::API_KEY_FILE,
];

/// Makes the data directory private, whoever made it and its files: no access for others
/// on the directory (created 0700 if missing; the node manager makes it root's, group the
/// server's user's, 1770, and the group is meant), and [`PRIVATE_FILES`] that exist 0600.
/// Key files are not fixed here: `space_secrets::keyfile` refuses one that group or others
/// could read (it may be known). Fails when a mode cannot be set (a file another user owns).
pub fn secure_data_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    // `path` loses the `forbidden` permission bits, if it exists.
    let restrict = |path: &Path, forbidden: u32| -> anyhow::Result<()> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let mode = meta.permissions().mode() & 0o7777;
        if mode & forbidden != 0 {
            let private = mode & !forbidden;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(private)).with_context(
                || {
                    format!(
                        "{} has mode {mode:04o}: making it {private:04o}",
                        path.display()
                    )
                },
            )?;
            tracing::warn!(path = %path.display(), was = format!("{mode:04o}"), now = format!("{private:04o}"), "made it private");
        }
        Ok(())
    };
    restrict(dir, 0o007)?;
    for name in PRIVATE_FILES {
        restrict(&dir.join(name), 0o077)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_data_directory_is_made_private_whoever_made_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        secure_data_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700, "created private");
        // Made by someone else, loosely: others lose access, the group (the node manager's
        // split) keeps it; the database and the key copy become the owner's only.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1775)).unwrap();
        for name in ["control.db", "control.db-wal", "api-key", "unrelated"] {
            std::fs::write(dir.join(name), b"x").unwrap();
            std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o644))
                .unwrap();
        }
        secure_data_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o1770);
        for name in ["control.db", "control.db-wal", "api-key"] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
        assert_eq!(
            mode(&dir.join("unrelated")),
            0o644,
            "only the files it knows"
        );
    }
}

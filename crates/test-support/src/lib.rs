//! Test infrastructure for end-to-end scenarios that boot real VMs.
//!
//! - One btrfs store for the whole suite ([`shared_store`]): a loop-mounted image under
//!   [`test_root`], created on first use and shared by every test process (nextest runs each
//!   test in its own process; a file lock makes set-up happen once).
//! - One built kernel bundle and `busybox` template ([`cache_store`]), imported into each
//!   test node by reflink, so no test builds or boots more than it needs.
//! - [`TestServer`]: control plane + node on a private data directory and a free port.
//! - [`wait_until`] and the leak checks the suite ends with.

pub mod bench;
mod child;
pub mod cluster;
pub mod e2b;
pub mod images;
pub mod leaks;
pub mod node_agent;
pub mod node_manager;
pub mod registry;
pub mod s3;
pub mod sandbox_manager;
mod wait;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use space_cli::client::SpaceClient;
use space_control::{Server, ServerConfig};
use space_storage::Store;

pub use wait::{wait_until, wait_until_ok};

pub mod internet;
pub mod kms;

/// Template every scenario uses unless it says otherwise.
pub const TEST_TEMPLATE: &str = "busybox";

/// Size of the shared test btrfs image (sparse).
const SHARED_STORE_BYTES: u64 = 32 << 30;

/// Root of everything the tests create on the machine: `$SPACE_TEST_ROOT` or `/var/tmp/space-test`.
pub fn test_root() -> PathBuf {
    std::env::var_os("SPACE_TEST_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/space-test"))
}

/// The workspace's target directory.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// The static guest daemon: `$SPACE_SPACED_BIN`, or what `scripts/test` builds.
pub fn spaced_binary() -> PathBuf {
    std::env::var_os("SPACE_SPACED_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("x86_64-unknown-linux-gnu/release/spaced"))
}

/// Runs `f` holding an exclusive lock shared by all test processes.
fn with_setup_lock<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let root = test_root();
    std::fs::create_dir_all(&root)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(".setup.lock"))?;
    fs4::fs_std::FileExt::lock_exclusive(&file)?;
    let out = f();
    let _ = fs4::fs_std::FileExt::unlock(&file);
    out
}

/// The suite's btrfs store, mounted on first use.
pub fn shared_store() -> &'static Store {
    static STORE: OnceLock<Store> = OnceLock::new();
    STORE.get_or_init(|| {
        with_setup_lock(|| {
            Store::open(&test_root(), SHARED_STORE_BYTES)
                .context("cannot open the shared test store")
        })
        .unwrap_or_else(|e| panic!("{e:#}"))
    })
}

/// Unmounts the shared store if it is mounted (the leak check calls this last).
pub fn unmount_shared_store() -> Result<()> {
    let root = test_root();
    let mounted = leaks::mounts_under(&root)
        .iter()
        .any(|m| Path::new(m) == root.join("store"));
    if mounted {
        Store::open(&root, SHARED_STORE_BYTES)?.unmount()?;
    }
    Ok(())
}

/// Sandbox disks or run directories left in any test node's data directory.
pub fn leftover_sandbox_dirs() -> Vec<PathBuf> {
    let nodes = test_root().join("store/nodes");
    let mut out = Vec::new();
    for node in std::fs::read_dir(&nodes).into_iter().flatten().flatten() {
        for sub in ["store/sandboxes", "run"] {
            for e in std::fs::read_dir(node.path().join(sub))
                .into_iter()
                .flatten()
                .flatten()
            {
                out.push(e.path());
            }
        }
    }
    out
}

/// A store holding the suite's kernel bundle and `busybox` template, built once.
pub fn cache_store() -> &'static Store {
    static CACHE: OnceLock<Store> = OnceLock::new();
    CACHE.get_or_init(|| {
        let shared = shared_store();
        with_setup_lock(|| {
            let store = Store::open(&shared.root().join("cache"), SHARED_STORE_BYTES)?;
            let spaced = spaced_binary();
            anyhow::ensure!(
                spaced.exists(),
                "no static spaced at {} — run ./scripts/test, or build it as scripts/lib/common.sh does",
                spaced.display()
            );
            let quiet = |_: &str| {};
            let kernel = space_images::build_kernel_bundle(&store, &space_images::KernelOpts::new(&spaced), &quiet)?;
            space_images::build_template(&store, TEST_TEMPLATE, &kernel.digest, &space_images::BuildOpts::default(), &quiet)?;
            Ok(store)
        })
        .unwrap_or_else(|e| panic!("cannot build the test template: {e:#}"))
    })
}

/// Makes `template` (and its kernel bundle) from the cache available in `store`, by reflink.
pub fn import_template(store: &Store, template: &str) -> Result<()> {
    let cache = cache_store();
    let info = cache
        .templates()
        .get(template)?
        .with_context(|| format!("template {template} not in the cache"))?;
    store
        .kernels()
        .import(&cache.kernels(), &info.kernel_digest)?;
    store.templates().import(&cache.templates(), template)?;
    Ok(())
}

/// A fresh data directory for one test node, on the shared btrfs (short: socket paths).
/// The config of a test server on `data_dir` (any free local port), with the test template
/// imported into its store.
pub fn test_server_config(data_dir: &Path) -> ServerConfig {
    let config = test_server_config_without_template(data_dir);
    let store = Store::open(data_dir, 1 << 30).expect("test data dir is on btrfs");
    import_template(&store, TEST_TEMPLATE).expect("import test template");
    config
}

/// [`test_server_config`] without the suite's template or its kernel bundle: a node that
/// must fetch them from the object store.
pub fn test_server_config_without_template(data_dir: &Path) -> ServerConfig {
    let mut config = ServerConfig::new(data_dir);
    config.listen = "127.0.0.1:0".parse().expect("literal address");
    // Every test server would otherwise keep the production pool warm (many VMs each, all
    // competing for CI's two cores); tests of the pool itself ask for one.
    config.node.pool_size = 0;
    // Nor warm a template at start (a memory image each: a VM boot per test server).
    config.node.warm_templates = Vec::new();
    Store::open(data_dir, 1 << 30).expect("test data dir is on btrfs");
    if node_manager::enabled() {
        config.node.node_manager = Some(node_manager::for_data_dir(data_dir));
    }
    config
}

pub fn new_data_dir() -> PathBuf {
    let id: String = {
        use rand::Rng;
        let mut rng = rand::thread_rng();
        (0..8)
            .map(|_| char::from(b'a' + rng.gen_range(0..26)))
            .collect()
    };
    let dir = shared_store().root().join("nodes").join(id);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// Logs to the test's output (shown for failing tests), once per process. Warnings only by
/// default, so a failure's panic message is not buried (CI shows only part of the output);
/// `SPACE_TEST_LOG=info` (any `EnvFilter`) for the whole story.
pub fn init_logging() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("SPACE_TEST_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
    });
}

/// Control plane and node on their own data directory, SQLite database and free port.
pub struct TestServer {
    server: Option<Server>,
    /// Client authenticated with the bootstrap key of the `default` tenant.
    pub client: SpaceClient,
    /// The bootstrap API key.
    pub api_key: String,
    /// Data directory (removed when the server is dropped).
    pub data_dir: PathBuf,
    config: ServerConfig,
}

impl TestServer {
    /// Starts a server with the test template imported.
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    /// Starts a server after `adjust` has changed its configuration.
    pub async fn start_with(adjust: impl FnOnce(&mut ServerConfig)) -> TestServer {
        init_logging();
        let data_dir = new_data_dir();
        let mut config = test_server_config(&data_dir);
        adjust(&mut config);
        Self::boot(config, data_dir).await
    }

    async fn boot(config: ServerConfig, data_dir: PathBuf) -> TestServer {
        let server = Server::start(config.clone())
            .await
            .unwrap_or_else(|e| panic!("server start: {e:#}"));
        let api_key = match server.first_api_key() {
            Some(k) => k.to_owned(),
            None => std::fs::read_to_string(server.api_key_file())
                .expect("api key file")
                .trim()
                .to_owned(),
        };
        let client = SpaceClient::new(&server.url(), Some(api_key.clone())).expect("client");
        TestServer {
            server: Some(server),
            client,
            api_key,
            data_dir,
            config,
        }
    }

    /// The server's base URL.
    pub fn url(&self) -> String {
        self.server.as_ref().map(|s| s.url()).unwrap_or_default()
    }

    /// The running server.
    pub fn server(&self) -> &Server {
        self.server.as_ref().expect("server is running")
    }

    /// A client with another API key (or none).
    pub fn client_with_key(&self, key: Option<&str>) -> SpaceClient {
        SpaceClient::new(&self.url(), key.map(str::to_owned)).expect("client")
    }

    /// A client for a new tenant `name` with its own API key.
    pub async fn new_tenant_client(&self, name: &str) -> SpaceClient {
        let db = &self.server().state().db;
        let tenant = db.create_tenant(name).await.expect("create tenant");
        let key = db.create_api_key(&tenant.id).await.expect("create key");
        self.client_with_key(Some(&key.plaintext.0))
    }

    /// Waits until sandbox `id` is in `state` (or panics after `timeout`).
    pub async fn wait_state(
        &self,
        id: &space_core::SandboxId,
        state: space_core::SandboxState,
        timeout: std::time::Duration,
    ) -> space_core::sandbox::SandboxInfo {
        wait_until(timeout, &format!("{id} to be {state}"), || async {
            self.client
                .sandbox(id)
                .await
                .ok()
                .filter(|s| s.state == state)
        })
        .await
    }

    /// Stops the server without touching its VMs; [`TestServer::start_on`] then starts it
    /// again on the same data directory, as `space server` does after a restart.
    pub async fn stop_keep_vms(mut self) -> (PathBuf, ServerConfig) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
        let out = (std::mem::take(&mut self.data_dir), self.config.clone());
        std::mem::forget(self);
        out
    }

    /// Starts a server on an existing data directory and configuration.
    pub async fn start_on(data_dir: PathBuf, mut config: ServerConfig) -> TestServer {
        init_logging();
        // A new port: the old one may linger in TIME_WAIT.
        config.listen = "127.0.0.1:0".parse().expect("literal address");
        Self::boot(config, data_dir).await
    }

    /// Deletes every sandbox through the API, stops the server, removes the data directory.
    pub async fn stop(mut self) {
        if let Ok(list) = self.client.list_sandboxes(&[]).await {
            for sb in list.sandboxes {
                let _ = self.client.delete_sandbox(sb.id.as_str()).await;
            }
        }
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
        cleanup_data_dir(&self.data_dir);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // A test that panicked: make sure no VM outlives it.
        cleanup_data_dir(&self.data_dir);
    }
}

/// Kills every VMM whose pidfile is in `data_dir/run/*/`, deletes the node's network
/// namespaces, then removes `data_dir`.
pub fn cleanup_data_dir(data_dir: &Path) {
    if data_dir.as_os_str().is_empty() {
        return;
    }
    // The node manager first: a sandbox manager still running (a test that panicked) would
    // otherwise restore the VMs killed below. Their cgroups are then left empty, for the
    // leak check to remove. Also one this process did not start (a child server's, killed
    // with SIGKILL before it could stop its own).
    node_manager::stop_for_data_dir(data_dir);
    leaks::kill_and_wait(
        leaks::node_managers_under(data_dir)
            .into_iter()
            .map(|(pid, _)| pid),
    );
    for run in std::fs::read_dir(data_dir.join("run"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Some(pid) = std::fs::read_to_string(run.path().join("vmm.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let is_ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&*run.file_name().to_string_lossy()))
                .unwrap_or(false);
            if is_ours {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    // And their network namespaces, which outlive the VMs (the node removes them on delete).
    if let Ok(dir) = std::path::absolute(data_dir) {
        let prefix = space_node::network::netns_prefix(&dir.join("run"));
        for ns in space_net::datapath::netns::names_with_prefix(&prefix) {
            let _ = space_net::datapath::netns::delete(&ns);
        }
    }
    let _ = std::fs::remove_dir_all(data_dir);
}

/// Creates a sandbox of the test template with default settings; returns its id once it runs.
pub async fn test_sandbox(c: &SpaceClient) -> space_core::SandboxId {
    c.create_sandbox(&space_core::sandbox::CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    })
    .await
    .expect("create")
    .id
}

/// Runs a shell line in a sandbox to completion (as root when `root`) and returns its
/// stdout, asserting it exited 0.
pub async fn shell(c: &SpaceClient, id: &space_core::SandboxId, line: &str, root: bool) -> String {
    let mut spec = space_core::process::ProcessSpec::shell(line);
    if root {
        spec.user = Some("root".into());
    }
    let out = c.run(id, &spec).await.expect("run");
    assert_eq!(
        out.status.exit_code,
        Some(0),
        "`{line}` failed: {} {}",
        out.stdout_str(),
        out.stderr_str()
    );
    out.stdout_str()
}

/// Starts template build `req` (`POST /v1/templates`) and follows it to its end: every
/// event, `started` first and `ready` or `failed` last.
pub async fn follow_build(
    c: &SpaceClient,
    req: &serde_json::Value,
) -> Vec<space_core::template::TemplateBuildEvent> {
    use futures::StreamExt;
    c.build_template_followed(req)
        .await
        .expect("build started")
        .map(|e| e.expect("a build event"))
        .collect()
        .await
}

/// The log lines of a followed build, one per line.
pub fn build_log(events: &[space_core::template::TemplateBuildEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            space_core::template::TemplateBuildEvent::Log(l) => Some(l.line.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Starts a process (tagged `counter`) that counts up ten times a second, its count in the
/// shell's memory and shown in `file`; returns once the file shows a count. The file is
/// written beside and renamed into place: `echo $i > file` truncates first, and a read
/// between the truncation and the write would see no number at all.
pub async fn start_counter(
    c: &SpaceClient,
    id: &space_core::SandboxId,
    file: &str,
) -> space_core::process::ProcessId {
    let mut spec = space_core::process::ProcessSpec::shell(format!(
        "i=0; while true; do i=$((i+1)); echo $i > {file}.new; mv {file}.new {file}; sleep 0.1; done"
    ));
    spec.tag = Some("counter".into());
    let p = c.start_process(id, &spec).await.expect("counter");
    wait_until(
        std::time::Duration::from_secs(30),
        "the counter to start",
        || async { (counter(c, id, file).await > 0).then_some(()) },
    )
    .await;
    p.id
}

/// The count a [`start_counter`] process last showed in `file` (0 if none).
pub async fn counter(c: &SpaceClient, id: &space_core::SandboxId, file: &str) -> u64 {
    let bytes = c.read_file_bytes(id, file, None).await.unwrap_or_default();
    String::from_utf8_lossy(&bytes).trim().parse().unwrap_or(0)
}

/// Status, code and message of an API error; panics on success or another failure.
pub fn api_error<T: std::fmt::Debug>(
    r: Result<T, space_cli::client::ClientError>,
) -> (u16, space_core::ErrorCode, String) {
    match r {
        Err(space_cli::client::ClientError::Api { status, body }) => {
            (status, body.code, body.message)
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A tenant-wide credential for `api.example.com`, injected as `Authorization: Bearer
/// <value>`: what the credential tests store.
pub fn bearer_credential(
    name: &str,
    value: &str,
) -> space_control::api::credentials::CredentialRequest {
    space_control::api::credentials::CredentialRequest {
        name: name.into(),
        scope: space_control::api::credentials::CredentialScope::Tenant,
        rule: serde_json::from_value(serde_json::json!({
            "hosts": ["api.example.com"],
            "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
        }))
        .expect("rule"),
        expires_at_ms: None,
        value: value.into(),
    }
}

/// The `p` quantile (0..=1, nearest rank) of `samples`, sorting them; NaN when empty. For the
/// benchmark binaries.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    if samples.is_empty() {
        return f64::NAN;
    }
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

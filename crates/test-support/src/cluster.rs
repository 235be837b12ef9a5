//! A whole cluster on one machine: control-plane replicas in this process against one
//! database (PostgreSQL when `SPACE_TEST_POSTGRES_URL` is set, else an SQLite file), and
//! node processes (`space-test-node`), each in a network namespace of its own with its own
//! data directory and store, joined with one-time tokens like `space node join`.
//!
//! Each node's namespace has one veth to the host: the node is `10.231.K.2`, the host
//! `10.231.K.1`; the replicas' cluster listeners listen on every host address, their APIs
//! on loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use space_cli::client::SpaceClient;
use space_control::cluster::ClusterConfig;
use space_control::{Server, ServerConfig};
use space_core::cluster::{CreateJoinTokenRequest, NodeState};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{cleanup_data_dir, init_logging, new_data_dir, wait_until};

/// How long a node may be silent before it is declared lost: short, as the tests wait for
/// it, but sixteen heartbeats long. At 4 s a node busy restoring a VM on a loaded two-core CI
/// machine was once declared lost while it was fine (its heartbeats, every 500 ms, stopped
/// for 4 s; a slow heartbeat is now logged with where its time went).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(8);
/// The agent's port inside each node's namespace.
const AGENT_PORT: u16 = 7443;

/// Subnets `10.231.<k>.0/30` a node namespace may use, `k` in this range.
const SUBNETS: std::ops::Range<u16> = 10..250;

fn ip(args: &[&str]) {
    let ok = std::process::Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {args:?}");
}

/// A network namespace with a veth to the host.
pub struct NodeNetwork {
    /// The namespace.
    pub netns: String,
    /// The host's end, as the node reaches it.
    pub host_ip: String,
    /// The node's address.
    pub node_ip: String,
    /// The host's end of the veth.
    host_if: String,
}

impl NodeNetwork {
    fn create() -> NodeNetwork {
        // The namespace's name claims its subnet machine-wide: `ip netns add` fails when
        // the name exists, so concurrent test processes (nextest runs each test in one of
        // its own) never share a subnet, whatever their pids.
        let span = SUBNETS.end - SUBNETS.start;
        let first = rand::random::<u16>() % span;
        let k = (0..span)
            .map(|i| SUBNETS.start + (first + i) % span)
            .find(|k| space_net::datapath::netns::create(&format!("spt-node-{k}")).is_ok())
            .expect("a free node subnet");
        let netns = format!("spt-node-{k}");
        let net = NodeNetwork {
            netns: netns.clone(),
            host_ip: format!("10.231.{k}.1"),
            node_ip: format!("10.231.{k}.2"),
            host_if: format!("sptn{k}"),
        };
        // A veth of this name can only be left from an earlier namespace of this name
        // (one whose process outlived it): this subnet is ours now.
        let host_if = net.host_if.clone();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &host_if])
            .stderr(std::process::Stdio::null())
            .status();
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", net.host_ip),
            "dev",
            &host_if,
        ]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{}/30", net.node_ip),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        net
    }
}

impl NodeNetwork {
    /// Cuts the node off the host's network (`false`: its veth's host end down; the node and
    /// its VMs run on, unreachable and unable to reach anything) or connects it again.
    pub fn set_connected(&self, connected: bool) {
        ip(&[
            "link",
            "set",
            &self.host_if,
            if connected { "up" } else { "down" },
        ]);
    }

    /// Limits what the node sends to the host (its uploads, its answers) to `mbit` megabits a
    /// second with a token-bucket qdisc on its end of the veth, or lifts the limit (`None`):
    /// a test that must act while an upload is under way makes it last instead of racing it.
    pub fn set_uplink_rate(&self, mbit: Option<u32>) {
        let mut args = vec![
            "netns".to_string(),
            "exec".into(),
            self.netns.clone(),
            "tc".into(),
            "qdisc".into(),
        ];
        match mbit {
            Some(rate) => args.extend(
                [
                    "replace",
                    "dev",
                    "eth0",
                    "root",
                    "tbf",
                    "rate",
                    &format!("{rate}mbit"),
                    "burst",
                    "64kb",
                    "latency",
                    "200ms",
                ]
                .map(String::from),
            ),
            None => args.extend(["del", "dev", "eth0", "root"].map(String::from)),
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ip(&args);
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        // The veth goes with the namespace.
        let _ = space_net::datapath::netns::delete(&self.netns);
    }
}

/// A node process.
pub struct TestNode {
    /// Its name.
    pub name: String,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its namespace.
    pub network: NodeNetwork,
    process: Option<Child>,
    /// Set before the test ends its process on purpose; an exit without it is told at once
    /// (a node that dies mid-test otherwise shows only as refused connections).
    exit_expected: std::sync::Arc<std::sync::atomic::AtomicBool>,
    log: PathBuf,
    /// Its arguments (control plane, token, name, advertise) and object store file.
    command: Vec<String>,
    /// Started without the suite's template (it fetches it from the object store).
    without_template: bool,
}

impl TestNode {
    /// Starts its process (joined already, or joining with its token) and waits until it
    /// serves.
    async fn spawn(&mut self) {
        let [control_plane, token, name, advertise, store] = self.command.as_slice() else {
            panic!("node {} has no command", self.name);
        };
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("node log");
        // nsenter, not `ip netns exec`: that remounts /sys for the namespace, and the
        // node's VMM jails need the host's cgroup hierarchy under /sys/fs/cgroup.
        let mut child = Command::new("nsenter")
            .arg(format!(
                "--net={}",
                space_net::datapath::netns::path(&self.network.netns).display()
            ))
            .arg(crate::node_manager::built_binary("space-test-node"))
            .arg(&self.data_dir)
            .args([control_plane, token, name, advertise])
            .env("SPACE_TEST_OBJECT_STORE", store)
            .env(
                "SPACE_TEST_NO_TEMPLATE",
                if self.without_template { "1" } else { "0" },
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn node");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        self.process = Some(child);
        let ready = tokio::time::timeout(Duration::from_secs(120), lines.next_line()).await;
        match ready {
            Ok(Ok(Some(line))) if line == "READY" => {}
            other => panic!(
                "node {} did not start ({other:?}):\n{}",
                self.name,
                self.log()
            ),
        }
        // Its standard output closes when it ends: an end the test did not ask for is
        // printed with the log's last lines, where the test's own output shows it.
        self.exit_expected
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let (expected, name, log) = (
            self.exit_expected.clone(),
            self.name.clone(),
            self.log.clone(),
        );
        tokio::spawn(async move {
            while let Ok(Some(_)) = lines.next_line().await {}
            if !expected.load(std::sync::atomic::Ordering::SeqCst) {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                println!("!!! node {name}'s process ended on its own; the last lines of its log:");
                for line in tail.iter().rev() {
                    println!("{line}");
                }
            }
        });
    }

    /// `kill -9` of its process (its VMs run on, as after a crash of the node's software).
    pub async fn kill(&mut self) {
        self.expect_exit();
        if let Some(mut p) = self.process.take() {
            self.thaw_quietly(&p);
            let _ = p.start_kill();
            let _ = p.wait().await;
        }
    }

    /// Starts it again after [`TestNode::kill`]: it recovers its sandboxes and rejoins.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    /// Where its agent is.
    pub fn agent_addr(&self) -> String {
        format!("{}:{AGENT_PORT}", self.network.node_ip)
    }

    /// The node's process id.
    pub fn pid(&self) -> nix::unistd::Pid {
        let pid = self
            .process
            .as_ref()
            .and_then(Child::id)
            .expect("node process runs");
        nix::unistd::Pid::from_raw(pid as i32)
    }

    /// Freezes it (SIGSTOP): no heartbeats, no answers, VMs untouched.
    pub fn freeze(&self) {
        nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    }

    /// Lets it run again (SIGCONT).
    pub fn thaw(&self) {
        nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    }

    /// Its cluster identity directory.
    pub fn identity_dir(&self) -> PathBuf {
        self.data_dir.join("node-identity")
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn expect_exit(&self) {
        self.exit_expected
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    async fn stop(&mut self) {
        self.expect_exit();
        if let Some(mut p) = self.process.take() {
            self.thaw_quietly(&p);
            if let Some(pid) = p.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            if tokio::time::timeout(Duration::from_secs(20), p.wait())
                .await
                .is_err()
            {
                let _ = p.start_kill();
                let _ = p.wait().await;
            }
        }
    }

    fn thaw_quietly(&self, p: &Child) {
        if let Some(pid) = p.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.expect_exit();
        if let Some(mut p) = self.process.take() {
            self.thaw_quietly(&p);
            let _ = p.start_kill();
        }
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- last lines of node {}'s log:", self.name);
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        cleanup_data_dir(&self.data_dir);
    }
}

/// A PostgreSQL database for one test, dropped afterwards; `None` without a server.
struct PgDatabase {
    admin_url: String,
    name: String,
}

impl PgDatabase {
    async fn create() -> Option<(String, PgDatabase)> {
        let admin_url = std::env::var("SPACE_TEST_POSTGRES_URL")
            .ok()
            .filter(|s| !s.is_empty())?;
        let name = format!(
            "space_cluster_{}",
            space_core::SandboxId::generate()
                .as_str()
                .trim_start_matches("sbx-")
        );
        admin(&admin_url, &format!("CREATE DATABASE {name}")).await;
        let (base, query) = admin_url
            .split_once('?')
            .map_or((admin_url.as_str(), None), |(b, q)| (b, Some(q)));
        let root = base.rfind('/').map_or(base, |i| &base[..i]);
        let url = match query {
            Some(q) => format!("{root}/{name}?{q}"),
            None => format!("{root}/{name}"),
        };
        Some((url, PgDatabase { admin_url, name }))
    }
}

async fn admin(url: &str, sql: &str) {
    use sqlx::Connection as _;
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(url)
        .await
        .expect("connect to the test PostgreSQL");
    sqlx::query(sql)
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let _ = conn.close().await;
}

/// The config of a test replica on `data_dir`, of the cluster whose CA is in `ca_dir`, on
/// the database at `db_url`.
pub fn replica_config(data_dir: &Path, ca_dir: &Path, db_url: &str) -> ServerConfig {
    let mut cfg = ServerConfig::new(data_dir);
    cfg.listen = "127.0.0.1:0".parse().expect("literal");
    cfg.database_url = Some(db_url.to_owned());
    let mut cluster = ClusterConfig::new(ca_dir, SocketAddr::from(([0, 0, 0, 0], 0)));
    cluster.heartbeat_timeout = HEARTBEAT_TIMEOUT;
    cluster.sweep_interval = Duration::from_millis(500);
    cfg.cluster = Some(cluster);
    cfg.surface = Some(std::sync::Arc::new(space_e2b::E2bApi::new(
        space_e2b::E2bConfig {
            domain: crate::e2b::TEST_DOMAIN.to_owned(),
            ..space_e2b::E2bConfig::default()
        },
    )));
    cfg
}

/// A replica in a child process, to be killed with SIGKILL.
pub struct ChildReplica {
    process: Child,
    /// A client of it, as the operator.
    pub client: SpaceClient,
    log: PathBuf,
    data_dir: PathBuf,
}

impl ChildReplica {
    /// `kill -9`, and waits for it to be gone.
    pub async fn kill(&mut self) {
        let _ = self.process.start_kill();
        let _ = self.process.wait().await;
    }
}

impl Drop for ChildReplica {
    fn drop(&mut self) {
        let _ = self.process.start_kill();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- last lines of the child replica's log:");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// A cluster: replicas, nodes, one database.
pub struct Cluster {
    /// The replicas (`replicas[0]` bootstrapped the operator's key).
    pub replicas: Vec<Server>,
    /// A client of each replica, as the operator.
    pub clients: Vec<SpaceClient>,
    /// The nodes.
    pub nodes: Vec<TestNode>,
    /// The operator's API key.
    pub api_key: String,
    /// Which database (`postgres` or `sqlite`).
    pub backend: &'static str,
    ca_dir: tempfile::TempDir,
    replica_dirs: Vec<PathBuf>,
    db_url: String,
    _sqlite_dir: Option<tempfile::TempDir>,
    pg: Option<PgDatabase>,
    /// The object store every node and replica shares (a Garage of the cluster's own), if
    /// the cluster was started with one.
    objects: Option<(crate::s3::Garage, space_objects::ObjectStoreConfig)>,
}

impl Cluster {
    /// `replicas` control-plane replicas and `nodes` joined nodes, all ready.
    pub async fn start(replicas: usize, nodes: usize) -> Cluster {
        Self::start_inner(replicas, nodes, false).await
    }

    /// The same, sharing an object store (a Garage server of the cluster's own, which the
    /// nodes reach from their namespaces): for suspend and resume across nodes.
    pub async fn start_with_objects(replicas: usize, nodes: usize) -> Cluster {
        Self::start_inner(replicas, nodes, true).await
    }

    async fn start_inner(replicas: usize, nodes: usize, objects: bool) -> Cluster {
        init_logging();
        let ca_dir = tempfile::tempdir().expect("temp dir");
        space_control::cluster::authority::init(&ca_dir.path().join("ca")).expect("cluster CA");
        let (db_url, backend, sqlite_dir, pg) = match PgDatabase::create().await {
            Some((url, pg)) => (url, "postgres", None, Some(pg)),
            None => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = space_control::db::default_sqlite_url(dir.path());
                (url, "sqlite", Some(dir), None)
            }
        };
        let mut cluster = Cluster {
            replicas: Vec::new(),
            clients: Vec::new(),
            nodes: Vec::new(),
            api_key: String::new(),
            backend,
            ca_dir,
            replica_dirs: Vec::new(),
            db_url,
            _sqlite_dir: sqlite_dir,
            pg,
            objects: objects.then(|| {
                let garage = crate::s3::Garage::start_on("0.0.0.0");
                let bucket = garage.bucket();
                (garage, bucket)
            }),
        };
        for _ in 0..replicas {
            cluster.add_replica().await;
        }
        for i in 0..nodes {
            cluster
                .add_node(&format!("node-{}", (b'a' + i as u8) as char))
                .await;
        }
        cluster
            .wait_nodes(nodes, |n| n.state == NodeState::Ready)
            .await;
        cluster
    }

    /// Starts another replica.
    pub async fn add_replica(&mut self) {
        let dir = new_data_dir();
        let mut config = replica_config(&dir, &self.ca_dir(), &self.db_url);
        config.object_store = self.objects.as_ref().map(|(_, c)| c.clone());
        let server = Server::start(config)
            .await
            .unwrap_or_else(|e| panic!("replica start: {e:#}"));
        if let Some(k) = server.first_api_key() {
            self.api_key = k.to_owned();
        }
        let client = SpaceClient::new(&server.url(), Some(self.api_key.clone())).expect("client");
        self.replicas.push(server);
        self.clients.push(client);
        self.replica_dirs.push(dir);
    }

    /// A replica in a child process (`space-test-server --replica`), for kill -9.
    pub async fn child_replica(&self) -> ChildReplica {
        let data_dir = new_data_dir();
        let log = data_dir.join("replica.log");
        let log_file = std::fs::File::create(&log).expect("replica log");
        let mut process = Command::new(crate::node_manager::built_binary("space-test-server"))
            .arg(&data_dir)
            .arg("--replica")
            .arg(self.ca_dir())
            .arg(&self.db_url)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn replica");
        let mut lines = BufReader::new(process.stdout.take().expect("stdout")).lines();
        let mut url = None;
        while url.is_none() {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .expect("replica starts")
                .expect("read")
                .expect("replica printed its address");
            url = line.strip_prefix("URL ").map(str::to_owned);
        }
        let client =
            SpaceClient::new(&url.expect("url"), Some(self.api_key.clone())).expect("client");
        ChildReplica {
            process,
            client,
            log,
            data_dir,
        }
    }

    /// A new one-time join token.
    pub async fn join_token(&self) -> String {
        self.clients[0]
            .create_join_token(&CreateJoinTokenRequest::default())
            .await
            .expect("join token")
            .token
    }

    /// Where nodes reach replica `i` from their namespace `net`.
    pub fn cluster_addr(&self, i: usize, net: &NodeNetwork) -> String {
        let port = self.replicas[i]
            .cluster_addr()
            .expect("cluster listener")
            .port();
        format!("{}:{port}", net.host_ip)
    }

    /// Starts node `name` in a namespace of its own, joined with a new token through the
    /// first replica; returns once it serves.
    pub async fn add_node(&mut self, name: &str) {
        self.add_node_inner(name, false).await
    }

    /// The same, the node without the suite's template or its kernel bundle: it must fetch
    /// them from the object store.
    pub async fn add_node_without_template(&mut self, name: &str) {
        self.add_node_inner(name, true).await
    }

    async fn add_node_inner(&mut self, name: &str, without_template: bool) {
        let network = NodeNetwork::create();
        let data_dir = new_data_dir();
        let token = self.join_token().await;
        let control_plane = self.cluster_addr(self.nodes.len() % self.replicas.len(), &network);
        let log = data_dir.join("node.log");
        let mut node = TestNode {
            name: name.to_owned(),
            data_dir,
            network,
            process: None,
            exit_expected: Default::default(),
            log,
            command: Vec::new(),
            without_template,
        };
        let advertise = node.agent_addr();
        // The shared object store, as this node reaches it from its namespace.
        let store_file = node.data_dir.join("object-store.json");
        if let Some((_, config)) = &self.objects {
            let mut mine = config.clone();
            if let space_objects::ObjectStoreConfig::S3(s3) = &mut mine {
                s3.endpoint = s3
                    .endpoint
                    .as_ref()
                    .map(|e| e.replace("127.0.0.1", &node.network.host_ip));
            }
            std::fs::write(&store_file, serde_json::to_vec(&mine).expect("json"))
                .expect("object store config");
        }
        node.command = vec![
            control_plane,
            token,
            name.to_owned(),
            advertise,
            if self.objects.is_some() {
                store_file.display().to_string()
            } else {
                String::new()
            },
        ];
        node.spawn().await;
        self.nodes.push(node);
    }

    /// Waits until the cluster lists `count` nodes all matching `ok`.
    pub async fn wait_nodes(
        &self,
        count: usize,
        ok: impl Fn(&space_core::cluster::NodeInfo) -> bool,
    ) -> Vec<space_core::cluster::NodeInfo> {
        wait_until(Duration::from_secs(60), "the cluster's nodes", || async {
            let list = self.clients[0].nodes().await.ok()?;
            (list.nodes.len() == count && list.nodes.iter().all(&ok)).then_some(list.nodes)
        })
        .await
    }

    /// The directory of the cluster CA.
    pub fn ca_dir(&self) -> PathBuf {
        self.ca_dir.path().join("ca")
    }

    /// The cluster's S3 server (with [`Cluster::start_with_objects`]).
    pub fn garage(&self) -> &crate::s3::Garage {
        &self
            .objects
            .as_ref()
            .expect("a cluster with an object store")
            .0
    }

    /// The object store the cluster shares, as the host reaches it.
    pub fn object_store(&self) -> Option<space_objects::ObjectStoreConfig> {
        self.objects.as_ref().map(|(_, c)| c.clone())
    }

    /// The node called `name`, to kill or restart it.
    pub fn node_mut(&mut self, name: &str) -> &mut TestNode {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> &TestNode {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Deletes every sandbox, stops the nodes and the replicas, drops the database.
    pub async fn stop(mut self) {
        if let Ok(list) = self.clients[0].list_sandboxes(&[]).await {
            for sb in list.sandboxes {
                let _ = self.clients[0].delete_sandbox(sb.id.as_str()).await;
            }
        }
        for node in &mut self.nodes {
            node.stop().await;
        }
        self.nodes.clear();
        for server in self.replicas.drain(..) {
            server.shutdown().await;
        }
        if let Some(pg) = self.pg.take() {
            admin(
                &pg.admin_url,
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", pg.name),
            )
            .await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for dir in &self.replica_dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

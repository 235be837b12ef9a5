//! A real S3-compatible server for tests: Garage (the `garage` binary `./scripts/test`
//! installs from crates.io, AGPL, run as a separate process, never linked), as a one-node
//! cluster on loopback with an SQLite metadata engine.
//!
//! - [`Garage::start`]: a private server in a directory of its own (tests that restart it);
//! - [`Garage::bucket`]: a new bucket on it with a key allowed on it, as an
//!   [`ObjectStoreConfig`] (the secret in a file, as in production);
//! - [`shared_bucket`]: a new bucket on the server `./scripts/test` starts once for the whole
//!   run (`SPACE_TEST_GARAGE_CONFIG`), so most tests share one server and none shares a
//!   bucket.
//!
//! `SPACE_TEST_GARAGE_BIN` names the binary (else `garage` on the `PATH`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use space_objects::{ObjectStoreConfig, S3Config};

/// Garage's S3 region.
pub const REGION: &str = "garage";

/// The garage binary.
pub fn garage_bin() -> PathBuf {
    std::env::var_os("SPACE_TEST_GARAGE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("garage"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running Garage server.
pub struct Garage {
    dir: PathBuf,
    config: PathBuf,
    s3_port: u16,
    process: Option<Child>,
    key_id: String,
    secret: String,
    owned_dir: Option<tempfile::TempDir>,
}

impl Garage {
    /// A new one-node server in a fresh directory, with one key, its S3 API on loopback.
    pub fn start() -> Garage {
        Self::start_on("127.0.0.1")
    }

    /// The same with its S3 API on `bind` (`0.0.0.0` for nodes in namespaces of their own,
    /// which reach it at their veth's host address).
    pub fn start_on(bind: &str) -> Garage {
        let owned = tempfile::tempdir().expect("temp dir");
        let dir = owned.path().to_owned();
        let mut g = Garage::create_on(&dir, bind);
        g.owned_dir = Some(owned);
        g
    }

    /// A server in `dir`, its S3 API on loopback (kept after the server stops:
    /// `./scripts/test` removes it).
    pub fn create(dir: &Path) -> Garage {
        Self::create_on(dir, "127.0.0.1")
    }

    fn create_on(dir: &Path, bind: &str) -> Garage {
        std::fs::create_dir_all(dir).expect("garage dir");
        let (rpc, s3, admin) = (free_port(), free_port(), free_port());
        let secret = hex::encode(rand::random::<[u8; 32]>());
        let config = dir.join("garage.toml");
        std::fs::write(
            &config,
            format!(
                r#"metadata_dir = "{meta}"
data_dir = "{data}"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "{bind}:{s3}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{admin}"
"#,
                meta = dir.join("meta").display(),
                data = dir.join("data").display(),
            ),
        )
        .expect("garage config");
        let mut g = Garage {
            dir: dir.to_owned(),
            config,
            s3_port: s3,
            process: None,
            key_id: String::new(),
            secret: String::new(),
            owned_dir: None,
        };
        g.run_server();
        let node_id = g.wait_node_id();
        g.cli(&["layout", "assign", "-z", "dc1", "-c", "1G", &node_id]);
        g.cli(&["layout", "apply", "--version", "1"]);
        let out = g.cli(&["key", "create", "space-test"]);
        g.key_id = field(&out, "Key ID");
        g.secret = field(&out, "Secret key");
        g
    }

    fn run_server(&mut self) {
        let log = std::fs::File::create(self.dir.join("garage.log")).expect("garage log");
        let child = Command::new(garage_bin())
            .args(["-c"])
            .arg(&self.config)
            .arg("server")
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("starting garage ({}): {e}", garage_bin().display()));
        self.process = Some(child);
    }

    /// Runs `garage -c CONFIG args…`; panics on failure; returns standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = Command::new(garage_bin())
                .arg("-c")
                .arg(&self.config)
                .args(args)
                .output()
                .expect("run garage");
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            // The server may still be starting (RPC not yet up).
            if Instant::now() > deadline {
                panic!(
                    "garage {args:?}: {}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_node_id(&self) -> String {
        let out = self.cli(&["node", "id", "-q"]);
        let id = out.trim();
        // `<hex id>@<addr>`: the id alone.
        id.split('@').next().unwrap_or(id).to_owned()
    }

    /// A new bucket with this server's key allowed on it.
    pub fn bucket(&self) -> ObjectStoreConfig {
        self.bucket_at("127.0.0.1")
    }

    /// The same, reached at `host` (a node in a namespace reaches the host at its veth's
    /// address).
    pub fn bucket_at(&self, host: &str) -> ObjectStoreConfig {
        let name = format!("t-{}", hex::encode(rand::random::<[u8; 6]>()));
        self.cli(&["bucket", "create", &name]);
        self.cli(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            &name,
            "--key",
            &self.key_id,
        ]);
        let secret_file = self.dir.join(format!("{name}.secret"));
        std::fs::write(&secret_file, &self.secret).expect("secret file");
        ObjectStoreConfig::S3(S3Config {
            endpoint: Some(format!("http://{host}:{}", self.s3_port)),
            region: REGION.into(),
            bucket: name,
            access_key_id: self.key_id.clone(),
            secret_access_key_file: secret_file,
            ca_file: None,
            allow_http: true,
        })
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    /// Starts the server again on the same directory and ports.
    pub fn restart(&mut self) {
        self.kill();
        self.run_server();
        self.wait_node_id();
    }

    /// The server's log (it logs every S3 request it serves: `ADDR METHOD URI`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("garage.log")).unwrap_or_default()
    }

    /// How many `method` requests for an object whose key ends with `suffix` the server has
    /// served, per its own request log: what a test counts downloads with.
    pub fn requests(&self, method: &str, suffix: &str) -> usize {
        self.log()
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace().skip_while(|w| *w != method);
                words.next()?;
                words.next()
            })
            .filter(|uri| {
                uri.split('?')
                    .next()
                    .is_some_and(|path| path.ends_with(suffix))
            })
            .count()
    }

    /// Writes the files another process needs to make buckets on this server
    /// (`SPACE_TEST_GARAGE_CONFIG` points at the first).
    pub fn export(&self, to: &Path) {
        std::fs::write(
            to,
            format!(
                "{}\n{}\n{}\n{}\n",
                self.config.display(),
                self.s3_port,
                self.key_id,
                self.secret
            ),
        )
        .expect("export");
    }

    /// The server another process exported (see [`Garage::export`]), not owned: dropping it
    /// leaves it running.
    fn attach(exported: &Path) -> Option<Garage> {
        let text = std::fs::read_to_string(exported).ok()?;
        let mut lines = text.lines();
        let config = PathBuf::from(lines.next()?);
        let s3_port = lines.next()?.parse().ok()?;
        let key_id = lines.next()?.to_owned();
        let secret = lines.next()?.to_owned();
        Some(Garage {
            dir: config.parent()?.to_owned(),
            config,
            s3_port,
            process: None,
            key_id,
            secret,
            owned_dir: None,
        })
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A new bucket on the run's shared server, if `./scripts/test` started one
/// (`SPACE_TEST_GARAGE_CONFIG`).
pub fn shared_bucket() -> Option<ObjectStoreConfig> {
    let exported = std::env::var_os("SPACE_TEST_GARAGE_CONFIG")?;
    let garage = Garage::attach(Path::new(&exported))?;
    Some(garage.bucket())
}

/// `<label>: <value>` in garage's CLI output.
fn field(out: &str, label: &str) -> String {
    out.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == label).then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no {label:?} in garage's output:\n{out}"))
}

//! A real `space server` process (API, control plane and sandbox manager) running as an
//! unprivileged uid with no capabilities, beside a [`crate::node_manager::NodeManagerProcess`]
//! serving that uid: the two processes a node is in production.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use space_cli::client::SpaceClient;

use crate::child::{log_to, StoppedOnDrop};
use crate::node_manager::space_binary;

/// A running `space server`; stopped (SIGTERM, then SIGKILL) when dropped. Its VMs stay.
pub struct SandboxManagerProcess {
    process: StoppedOnDrop,
    /// Its API's base URL.
    pub url: String,
    /// The bootstrap API key it wrote into its data directory.
    pub api_key: String,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
}

impl SandboxManagerProcess {
    /// Starts `space server` on `data_dir` as `uid` (gid the same, no supplementary groups,
    /// so no capabilities either), doing every privileged operation through the node
    /// manager at `node_manager`, with an empty environment but `PATH` and `RUST_LOG`.
    /// Waits until its API answers.
    pub async fn start(data_dir: &Path, uid: u32, node_manager: &Path) -> SandboxManagerProcess {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let log = data_dir.join("server.log");
        let (stdout, stderr) = log_to(&log);
        let child = Command::new(space_binary())
            .arg("--data-dir")
            .arg(data_dir)
            .args(["server", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--node-manager")
            .arg(node_manager)
            // As the other test nodes: no warm pool competing for CI's cores.
            .args(["--pool-size", "0"])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("RUST_LOG", "info")
            // Dropping root's uid clears every capability; std also drops the groups.
            .uid(uid)
            .gid(uid)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn space server");
        let mut sm = SandboxManagerProcess {
            process: StoppedOnDrop::new(child, Duration::from_secs(20)),
            url: format!("http://127.0.0.1:{port}"),
            api_key: String::new(),
            log,
        };
        let key_file = data_dir.join("api-key");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            sm.process.assert_running("space server", &sm.log);
            assert!(
                Instant::now() < deadline,
                "space server never answered: {}",
                std::fs::read_to_string(&sm.log).unwrap_or_default()
            );
            if let Ok(key) = std::fs::read_to_string(&key_file) {
                sm.api_key = key.trim().to_owned();
                if sm.client().templates().await.is_ok() {
                    return sm;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client with the bootstrap key.
    pub fn client(&self) -> SpaceClient {
        SpaceClient::new(&self.url, Some(self.api_key.clone())).expect("client")
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Stops it (SIGTERM) as a restart would; its VMs keep running.
    pub fn stop(mut self) {
        self.process.stop();
    }
}

/// A local TCP port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

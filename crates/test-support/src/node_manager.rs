//! A real `space node-manager` process for a test node: the `space` binary this workspace
//! built, serving one data directory to one uid.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::child::{log_to, StoppedOnDrop};

/// Whether test nodes get a node manager process of their own (`SPACE_TEST_NODE_MANAGER`,
/// on unless `0`): the split every node will run. Off, the test process does the
/// privileged work itself, as `space server` without `--node-manager` does.
pub fn enabled() -> bool {
    std::env::var("SPACE_TEST_NODE_MANAGER").map_or(true, |v| v != "0")
}

/// The node managers this test process started, by data directory.
fn registry() -> &'static Mutex<HashMap<PathBuf, NodeManagerProcess>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, NodeManagerProcess>>> = OnceLock::new();
    R.get_or_init(|| {
        // Statics are never dropped: stop what is left when the test process exits (a test
        // that never cleaned up its data directory would leave its node manager running).
        // SAFETY: registers a plain `extern "C" fn` with no arguments.
        unsafe { libc::atexit(stop_all_at_exit) };
        Default::default()
    })
}

extern "C" fn stop_all_at_exit() {
    let left: Vec<NodeManagerProcess> = match registry().try_lock() {
        Ok(mut r) => r.drain().map(|(_, nm)| nm).collect(),
        Err(_) => return,
    };
    drop(left);
}

/// The socket of the node manager of `data_dir`, started (serving root, the sandbox
/// manager of the tests) unless this process already runs it. It outlives the sandbox
/// managers started on that data directory, as the real one does, until
/// [`stop_for_data_dir`].
pub fn for_data_dir(data_dir: &Path) -> PathBuf {
    let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
    r.entry(data_dir.to_owned())
        .or_insert_with(|| NodeManagerProcess::start(data_dir, 0))
        .socket
        .clone()
}

/// Stops the node manager of `data_dir`, if this process started one.
pub fn stop_for_data_dir(data_dir: &Path) {
    let nm = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(data_dir);
    drop(nm);
}

/// The `space` binary of this build (cargo builds it for space-cli's tests).
pub fn space_binary() -> PathBuf {
    built_binary("space")
}

/// A binary `name` of this build: beside the running program (a benchmark in
/// `<target>/<profile>/`) or one level up (a test in `<target>/<profile>/deps/`).
pub fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe directory");
    let found = [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "no {name} binary beside {} — build the workspace: cargo build --workspace",
            exe.display()
        )
    })
}

/// A running node manager; killed (SIGTERM, then SIGKILL) when dropped. Its VMMs stay.
pub struct NodeManagerProcess {
    process: StoppedOnDrop,
    /// Its socket.
    pub socket: PathBuf,
    /// Its log.
    pub log: PathBuf,
}

impl NodeManagerProcess {
    /// Starts `space node-manager` for `data_dir`, serving only `client_uid`, and waits
    /// until its socket exists.
    pub fn start(data_dir: &Path, client_uid: u32) -> NodeManagerProcess {
        let socket = data_dir.join("node-manager.sock");
        let log = data_dir.join("node-manager.log");
        let (stdout, stderr) = log_to(&log);
        let child = Command::new(space_binary())
            .arg("--data-dir")
            .arg(data_dir)
            .args(["node-manager", "--socket"])
            .arg(&socket)
            .args(["--client", &client_uid.to_string()])
            .args(["--store-size", &(1u64 << 30).to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn space node-manager");
        let mut nm = NodeManagerProcess {
            process: StoppedOnDrop::new(child, Duration::from_secs(10)),
            socket,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !nm.socket.exists() {
            nm.process.assert_running("space node-manager", &nm.log);
            assert!(
                Instant::now() < deadline,
                "node manager socket never appeared"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        nm
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Stops it (SIGTERM), as a restart or crash of the node manager would.
    pub fn stop(mut self) {
        self.process.stop();
    }
}

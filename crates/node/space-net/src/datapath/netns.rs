//! Named network namespaces (`/run/netns/<name>`, as iproute2 keeps them) and running code
//! inside one. Links and addresses are set with iproute2 (`ip -n`), the firewall with
//! `nft -j` run inside the namespace: both are the kernel's own clients, and a namespace made
//! this way is visible to, and cleaned up by, the usual tools.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nix::sched::{setns, CloneFlags};

use super::NetError;

/// Where iproute2 keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Path of the namespace called `name`.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// Names of the namespaces that start with `prefix`.
pub fn names_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the namespace exists.
pub fn exists(name: &str) -> bool {
    path(name).exists()
}

/// Runs `ip <args>`, mapping a failure to an error carrying its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<(), NetError> {
    run(Command::new("ip").args(args), None, "ip")
}

/// Runs `cmd`, feeding `stdin`; fails with the program's stderr on a non-zero exit.
fn run(cmd: &mut Command, stdin: Option<&[u8]>, what: &str) -> Result<(), NetError> {
    let describe = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| NetError::Command {
        command: describe.clone(),
        message: format!("cannot run {what}: {e}"),
    })?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(data).map_err(|e| NetError::Command {
            command: describe.clone(),
            message: format!("writing to {what}: {e}"),
        })?;
    }
    let out = child.wait_with_output().map_err(|e| NetError::Command {
        command: describe.clone(),
        message: format!("waiting for {what}: {e}"),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(NetError::Command {
            command: describe,
            message: format!("{}: {}", out.status, stderr.trim()),
        });
    }
    Ok(())
}

/// Creates the namespace (empty but for a down `lo`).
pub fn create(name: &str) -> Result<(), NetError> {
    ip(&["netns", "add", name])
}

/// Deletes the namespace; every virtual device in it (TAP, veth end) goes with it once no
/// process runs in it any more. Deleting a missing namespace is not an error.
pub fn delete(name: &str) -> Result<(), NetError> {
    if !exists(name) {
        return Ok(());
    }
    ip(&["netns", "delete", name])
}

/// Runs `cmd` with `input` on its stdin; its stderr is the error if it fails.
pub(crate) fn run_with_input(cmd: &mut Command, input: &[u8], what: &str) -> Result<(), NetError> {
    run(cmd, Some(input), what)
}

/// Loads an nftables JSON ruleset inside the namespace.
pub fn apply_nft(name: &str, ruleset: &nftables::schema::Nftables<'_>) -> Result<(), NetError> {
    let json = serde_json::to_vec(ruleset).map_err(|e| NetError::Command {
        command: "nft -j -f -".into(),
        message: format!("cannot serialise the ruleset: {e}"),
    })?;
    run(
        Command::new("ip").args(["netns", "exec", name, "nft", "-j", "-f", "-"]),
        Some(&json),
        "nft",
    )
}

/// Runs `f` on a thread of its own that has entered the namespace, and returns what it
/// returns. Sockets created by `f` belong to that namespace for good, whichever thread uses
/// them afterwards: this is how the gateway listens inside a sandbox's namespace, and how it
/// connects out from the uplink's.
pub fn run_in<T, F>(name: &str, f: F) -> Result<T, NetError>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    // The thread is thrown away afterwards, so it never returns to the host namespace.
    spawn_in(name, move || {
        let _ = tx.send(f());
    })?;
    rx.recv()
        .map_err(|_| NetError::Command {
            command: "namespace thread".into(),
            message: "panicked".into(),
        })?
        .map_err(|e| NetError::Io {
            what: format!("in namespace {name}"),
            source: e,
        })
}

/// Starts `f` on a thread of its own that has entered the namespace and stays in it (for a
/// long-lived server of sockets made there); returns once the thread is in.
pub fn spawn_in<F>(name: &str, f: F) -> Result<(), NetError>
where
    F: FnOnce() + Send + 'static,
{
    let p = path(name);
    let ns = std::fs::File::open(&p).map_err(|e| NetError::Io {
        what: format!("open {}", p.display()),
        source: e,
    })?;
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("space-netns".into())
        .spawn(move || {
            let entered = setns(ns.as_fd(), CloneFlags::CLONE_NEWNET);
            let ok = entered.is_ok();
            let _ = entered_tx.send(entered);
            if ok {
                f();
            }
        })
        .map_err(|e| NetError::Io {
            what: "spawn a namespace thread".into(),
            source: e,
        })?;
    match entered_rx.recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(NetError::Io {
            what: format!("setns into {name}"),
            source: e.into(),
        }),
        Err(_) => Err(NetError::Command {
            command: "namespace thread".into(),
            message: "ended before entering the namespace".into(),
        }),
    }
}

/// Writes a sysctl of the calling thread's namespace (`/proc/sys/net/...` is per namespace).
pub(crate) fn write_sysctl(key: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(format!("/proc/sys/{}", key.replace('.', "/")), value)
}

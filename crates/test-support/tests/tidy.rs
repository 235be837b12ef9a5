//! Tidy checks, as ordinary tests: house rules that would otherwise drift.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every Rust file says what it is for in a `//!` module doc on its first line.
#[test]
fn every_file_has_a_module_doc() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("crates"), &mut files);
    assert!(files.len() > 50, "found only {} files", files.len());
    let missing: Vec<_> = files
        .iter()
        .filter(|f| {
            !std::fs::read_to_string(f)
                .unwrap_or_default()
                .starts_with("//!")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "files without a //! module doc: {missing:#?}"
    );
}

/// The guest daemon must not listen on the network: no TCP or UDP listener, and no IP
/// socket address to bind one to. An `AF_INET` socket is fine
/// for interface ioctls, and `netconfig.rs` (which configures the guest's card with them)
/// is the one file that may build IP socket addresses, for those ioctls only. `ports.rs` is
/// the one file that may open a TCP connection, and only to loopback.
#[test]
fn guest_daemon_opens_no_network_socket() {
    let mut files = Vec::new();
    rust_files(
        &workspace_root().join("crates/sandbox/spaced/src"),
        &mut files,
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let mut needles = vec!["TcpListener", "UdpSocket"];
        if f.ends_with("spaced/src/ports.rs") {
            // Connections to the guest's own servers, at its own interface addresses only
            // (never loopback: what is bound there is private).
            for own in ["getifaddrs", "own_addresses", "!a.addr.is_loopback()"] {
                assert!(
                    text.contains(own),
                    "ports.rs connects only to own addresses ({own})"
                );
            }
            for loopback in ["Ipv4Addr::LOCALHOST", "Ipv6Addr::LOCALHOST"] {
                assert!(!text.contains(loopback), "ports.rs connects to {loopback}");
            }
            needles.extend([
                "bind(",
                "lookup_host",
                "to_socket_addrs",
                "SocketAddr::from",
            ]);
        } else {
            needles.push("TcpStream");
        }
        if f.ends_with("netconfig.rs") {
            // Its addresses go into ioctls only. (Elsewhere bind/listen serve the vsock
            // channel, which is not a network.)
            needles.extend([
                "libc::bind",
                "libc::listen",
                "libc::connect",
                "libc::accept",
            ]);
        } else if !f.ends_with("spaced/src/ports.rs") {
            // (ports.rs reads its interface addresses as `sockaddr_in` views of getifaddrs.)
            needles.push("sockaddr_in");
        }
        for needle in needles {
            assert!(
                !text.contains(needle),
                "{} mentions {needle}: the daemon listens on no network socket",
                f.display()
            );
        }
    }
}

/// Only the node manager spawns VMMs or mounts: the sandbox manager goes through it.
#[test]
fn privileged_calls_stay_in_the_node_manager() {
    let mut files = Vec::new();
    rust_files(
        &workspace_root().join("crates/node/space-node/src"),
        &mut files,
    );
    for f in files.iter().filter(|f| !f.ends_with("node_manager.rs")) {
        let text = std::fs::read_to_string(f)
            .unwrap_or_default()
            // Stores that are not the btrfs store: records, credentials, sandbox CAs.
            .replace("RecordStore::open(", "")
            .replace("EncryptedFileStore::open(", "")
            .replace("CaStore::open(", "");
        for needle in [
            "Store::open(",
            "vmm.launch(",
            "store.create_sandbox_disk(",
            "remove_sandbox_dir(",
            "store.begin_snapshot(",
            "reflink_disk(",
            "store.clone_snapshot_disk(",
            "mount(",
        ] {
            assert!(
                !text.contains(needle),
                "{} calls {needle} outside the node manager",
                f.display()
            );
        }
    }
}

/// The host's privileged primitives (mounts, namespaces, `pivot_root`, new processes in new
/// namespaces, network configuration, VMMs) appear only in the code that runs as the node
/// manager: the VMM driver and its jail, the store's mount, the network datapath, and
/// `space_node_manager::LocalNodeManager`, and the image unpacker's jail
/// (`space-images/src/oci/jail.rs`: its child unshares a user namespace mapped to a uid range
/// of its own; only root's `space template build` runs it). One exception runs in the sandbox manager: the
/// uplink's `setns` (`space-net/src/uplink.rs`), made only when it is told to reach the
/// outside from a namespace not its own (the tests' stand-in internet); in production the
/// uplink is its own namespace and it needs no privilege at all, which
/// `node_manager.rs`'s whole-life test shows by running `space server` as an unprivileged
/// uid. The guest daemon is another machine's root and may mount there; tests and
/// benchmarks set up what they test.
#[test]
fn privileged_primitives_live_only_in_the_node_manager() {
    let root = workspace_root().join("crates");
    let allowed = [
        "node/space-vmm/src/",
        "node/space-images/src/oci/jail.rs",
        // SPACE's own recipes (`space template build base`, the administrator's command as
        // root): /proc mounted in the debootstrapped tree for apt-get's package scripts.
        "node/space-images/src/rootfs.rs",
        "node/space-storage/src/loopback.rs",
        "node/space-storage/src/mountinfo.rs",
        "node/space-storage/src/store.rs",
        "node/space-net/src/datapath/",
        "node/space-net/src/uplink.rs",
        "node/space-node-manager/src/local.rs",
        "sandbox/spaced/",
        "test-support/",
    ];
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let needles = [
        "libc::mount(",
        "nix::mount::",
        "setns(",
        "unshare(",
        "SYS_pivot_root",
        "SYS_clone3",
        "Command::new(\"mount\")",
        "Command::new(\"losetup\")",
        "Command::new(\"ip\")",
        "Command::new(\"nft\")",
        "Command::new(\"qemu",
        "QemuVmm::",
    ];
    let mut offenders = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(&root)
            .unwrap_or(f)
            .to_string_lossy()
            .into_owned();
        let test_code = rel.contains("/tests/") || rel.contains("/benches/");
        if test_code || allowed.iter().any(|a| rel.starts_with(a)) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for needle in needles {
            if text.contains(needle) {
                offenders.push(format!("{rel}: {needle}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "privileged primitives outside the node manager: {offenders:#?}"
    );
}

/// The shipped systemd units load as systemd would load them (`systemd-analyze verify`,
/// with `/usr/local/bin/space` pointing at this build's binary): no unknown key, no bad
/// value, no missing dependency. systemd is not PID 1 on these machines, so the units are
/// not started here; `scripts/start` runs the same processes the same way (same users, same
/// arguments) and is what the suite's processes follow.
#[test]
fn the_systemd_units_load() {
    let units = workspace_root().join("packaging/systemd");
    let space = test_support::node_manager::space_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(&units)
        .expect("packaging/systemd")
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "service") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("unit");
        assert!(text.contains("/usr/local/bin/space "), "{}", path.display());
        let copy = dir.path().join(entry.file_name());
        let text = text.replace("/usr/local/bin/space ", &format!("{} ", space.display()));
        std::fs::write(&copy, text).expect("write unit");
        paths.push(copy);
    }
    assert_eq!(
        paths.len(),
        4,
        "the node manager's, the server's, a cluster replica's and a cluster node's units"
    );
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .output()
        .expect("systemd-analyze (package systemd) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

//! The node as two processes: `space node-manager` (root) serves only its client's uid,
//! refuses bad requests and keeps serving; `space server` runs as an unprivileged uid with no
//! capabilities, and a sandbox lives its whole life with every privileged operation going
//! through the node manager (its VMMs are its children, jailed, each a uid of its own).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use space_core::sandbox::{CreateSnapshotRequest, ForkRequest};
use space_core::SandboxState;
use space_core::SnapshotKind;
use space_node_manager::protocol::{
    Area, NodePath, RefusalCode, RelPath, Request, Response, MAX_REQUEST_BYTES, PROTOCOL_VERSION,
};
use space_node_manager::wire;
use test_support::node_manager::NodeManagerProcess;
use test_support::sandbox_manager::SandboxManagerProcess;
use test_support::{new_data_dir, shell, test_sandbox};

/// A uid no account uses: the client of the node manager in the refusal test.
const CLIENT_UID: u32 = 4242;

/// Runs `f` on a thread whose uid and gid (real, effective, saved) are `uid`, with no
/// supplementary groups. Credentials are per thread in the kernel; the raw system calls
/// change only this one (glibc's wrappers would change every thread of the test process).
fn as_uid<T: Send + 'static>(uid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: credential changes of the calling thread only; the thread ends with `f`.
        unsafe {
            let groups = libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>());
            assert_eq!(groups, 0, "setgroups: {}", std::io::Error::last_os_error());
            let gid = libc::syscall(libc::SYS_setresgid, uid, uid, uid);
            assert_eq!(gid, 0, "setresgid: {}", std::io::Error::last_os_error());
            let r = libc::syscall(libc::SYS_setresuid, uid, uid, uid);
            assert_eq!(r, 0, "setresuid: {}", std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .expect("thread")
}

fn ask(stream: &UnixStream, request: &Request) -> Response {
    wire::send(stream, request, &[]).expect("send");
    read(stream)
}

fn read(stream: &UnixStream) -> Response {
    wire::recv(stream, 1 << 20)
        .expect("recv")
        .expect("an answer")
        .parse()
        .expect("a response")
}

fn raw(stream: &UnixStream, json: &str) -> Response {
    let mut s = stream;
    s.write_all(&(json.len() as u32).to_be_bytes()).unwrap();
    s.write_all(json.as_bytes()).unwrap();
    read(stream)
}

fn refused(r: Response) -> RefusalCode {
    match r {
        Response::Refused(r) => r.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn greeted(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
    };
    assert!(matches!(ask(&s, &hello), Response::Welcome { .. }));
    s
}

fn store(rel: &str) -> NodePath {
    NodePath {
        area: Area::Store,
        rel: RelPath::new(rel).unwrap(),
    }
}

#[test]
fn the_node_manager_serves_only_its_client_and_keeps_serving_after_bad_requests() {
    test_support::init_logging();
    let data_dir = new_data_dir();
    // A data directory its client owns (as an earlier version left one) is taken over.
    std::os::unix::fs::chown(&data_dir, Some(CLIENT_UID), Some(CLIENT_UID)).unwrap();
    let nm = NodeManagerProcess::start(&data_dir, CLIENT_UID);
    let socket = nm.socket.clone();

    // Root may open the socket (file permissions do not stop it) but is not the client.
    let s = UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(refused(read(&s)), RefusalCode::Forbidden);
    // Another unprivileged uid cannot even connect: the socket is the client's, 0600.
    let other = as_uid(CLIENT_UID + 1, {
        let socket = socket.clone();
        move || UnixStream::connect(&socket).map(drop)
    });
    assert!(other.is_err(), "uid {} connected", CLIENT_UID + 1);

    // A symlink in a sandbox's directory pointing out of the store.
    let sandboxes = data_dir.join("store/sandboxes");
    std::fs::create_dir_all(sandboxes.join("sbx-evil")).unwrap();
    std::os::unix::fs::symlink("/etc", sandboxes.join("sbx-evil/etc")).unwrap();
    // Made by the client, as its sandbox manager would.
    for made in ["sbx-evil", "sbx-evil/etc"] {
        std::os::unix::fs::lchown(sandboxes.join(made), Some(CLIENT_UID), Some(CLIENT_UID))
            .unwrap();
    }

    let data_dir_run = std::path::absolute(data_dir.join("run")).unwrap();
    as_uid(CLIENT_UID, move || {
        // An oversized frame ends its connection with a refusal.
        let s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (&s).write_all(&((MAX_REQUEST_BYTES + 1) as u32).to_be_bytes())
            .unwrap();
        assert_eq!(refused(read(&s)), RefusalCode::TooLarge);
        // Requests before the handshake, and other protocol versions, are refused.
        let s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(
            refused(ask(&s, &Request::VmNetworks)),
            RefusalCode::BadRequest
        );
        let s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let old = Request::Hello { version: 0 };
        assert_eq!(refused(ask(&s, &old)), RefusalCode::UnsupportedVersion);

        let s = greeted(&socket);
        // Malformed and unknown requests: refused, and the connection goes on.
        assert_eq!(refused(raw(&s, "{not json")), RefusalCode::BadRequest);
        assert_eq!(
            refused(raw(&s, r#"{"op":"run_command","cmd":"id"}"#)),
            RefusalCode::BadRequest
        );
        // Paths out of the store: by '..' (refused as malformed), by a symlink, or into
        // what the caller may not write (templates, kernels, published memory images).
        let escape = r#"{"op":"clone_disk","src":{"area":"store","rel":"../../../etc/shadow"},"dst":{"area":"store","rel":"sandboxes/sbx-1/x"},"disk_mib":0,"existing":"refuse"}"#;
        assert_eq!(refused(raw(&s, escape)), RefusalCode::BadRequest);
        let absolute = r#"{"op":"remove_dir","dir":{"area":"run","rel":"/etc"}}"#;
        assert_eq!(refused(raw(&s, absolute)), RefusalCode::BadRequest);
        let through_symlink = Request::CloneDisk {
            src: store("sandboxes/sbx-evil/etc/shadow"),
            dst: store("sandboxes/sbx-1/rootfs.ext4"),
            disk_mib: 0,
            existing: space_node_manager::protocol::Existing::Refuse,
        };
        assert_eq!(refused(ask(&s, &through_symlink)), RefusalCode::Confinement);
        for dst in [
            "templates/busybox/rootfs.ext4",
            "kernels/k/vmlinuz",
            "images/abc/memory",
        ] {
            let write_template = Request::CloneDisk {
                src: store("sandboxes/sbx-evil"),
                dst: store(dst),
                disk_mib: 0,
                existing: space_node_manager::protocol::Existing::Replace,
            };
            assert_eq!(
                refused(ask(&s, &write_template)),
                RefusalCode::Confinement,
                "{dst}"
            );
        }
        let link_template = Request::LinkDisk {
            src: store("templates/busybox/rootfs.ext4"),
            dst: store("sandboxes/sbx-1/rootfs.ext4"),
        };
        assert_eq!(refused(ask(&s, &link_template)), RefusalCode::Confinement);
        let remove_records = Request::RemoveDir {
            dir: store("records"),
        };
        assert_eq!(refused(ask(&s, &remove_records)), RefusalCode::Confinement);
        // Names: a namespace of another node, a VM name that is a path.
        let foreign = Request::RemoveVmNetwork {
            netns: "spt-internet".into(),
        };
        assert_eq!(refused(ask(&s, &foreign)), RefusalCode::Confinement);
        // A UDP flow socket is only ever the sandbox guest's, to a real destination.
        let prefix = space_node::network::netns_prefix(&data_dir_run);
        let spoofed = Request::OpenUdpFlow {
            netns: format!("{prefix}sbx-1"),
            dst: "1.1.1.1:53".parse().unwrap(),
            guest: "10.0.0.9:4000".parse().unwrap(),
        };
        assert_eq!(refused(ask(&s, &spoofed)), RefusalCode::BadRequest);
        let bad_name = Request::KillVm {
            name: "../sbx".into(),
        };
        assert_eq!(refused(ask(&s, &bad_name)), RefusalCode::BadRequest);

        // The good requests are still served, on the same connection.
        assert!(matches!(
            ask(&s, &Request::VmNetworks),
            Response::Names { .. }
        ));
        assert!(matches!(
            ask(&s, &Request::RemoveStaleVmConfinement),
            Response::Count { .. }
        ));
        let made = Request::RemoveDir {
            dir: store("sandboxes/sbx-evil"),
        };
        assert_eq!(ask(&s, &made), Response::Done);
    });
    assert!(
        !sandboxes.join("sbx-evil").exists(),
        "a good request after the bad ones was carried out"
    );
    // /etc went untouched through the symlink.
    assert!(Path::new("/etc/passwd").exists());
    let log = std::fs::read_to_string(&nm.log).unwrap_or_default();
    assert!(log.contains("refused"), "refusals are logged: {log}");
    drop(nm);
    std::fs::remove_dir_all(&data_dir).ok();
}

/// Pid of the QEMU of VM `name` whose run directory is under `data_dir`.
fn vmm_of(data_dir: &Path, name: &str) -> Option<u32> {
    test_support::leaks::sandbox_vmm_processes()
        .into_iter()
        .find(|(_, cmd)| {
            cmd.contains(&format!("-name {name}")) && cmd.contains(&*data_dir.to_string_lossy())
        })
        .map(|(pid, _)| pid)
}

/// The first word of a line of `/proc/<pid>/status` (`Uid` is then the real uid).
fn status_field(pid: u32, field: &str) -> String {
    status_line(pid, field)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_owned()
}

fn status_line(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(str::to_owned))
        .unwrap_or_default()
}

fn namespace(pid: u32, kind: &str) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).expect("namespace link")
}

/// Every process of this node (its data directory in the command line) and its real uid.
fn node_processes(data_dir: &Path) -> Vec<(u32, u32, String)> {
    let needle = data_dir.to_string_lossy().into_owned();
    test_support::leaks::processes()
        .into_iter()
        .map(|(pid, args)| (pid, args.join(" ")))
        .filter(|(_, cmd)| cmd.contains(&needle))
        .filter_map(|(pid, cmd)| Some((pid, status_field(pid, "Uid").parse().ok()?, cmd)))
        .collect()
}

/// What `ps` must show of a node: the node manager its only root process; the sandbox
/// manager as `sandbox_manager_uid`, with no capabilities; every QEMU the node manager's
/// child as a uid of its own (neither root nor the sandbox manager's), under both seccomp
/// filters, in pid and mount namespaces of its own and in a cgroup that limits it.
fn assert_least_privilege(
    data_dir: &Path,
    nm: &NodeManagerProcess,
    sm: &SandboxManagerProcess,
    sandbox_manager_uid: u32,
    vms: usize,
) {
    let processes = node_processes(data_dir);
    for (pid, uid, cmd) in &processes {
        assert!(
            *uid != 0 || *pid == nm.pid(),
            "pid {pid} runs as root but is not the node manager: {cmd}"
        );
    }
    assert_eq!(
        status_field(nm.pid(), "Uid"),
        "0",
        "the node manager is root"
    );
    let sm_uid = format!("{0}\t{0}\t{0}\t{0}", sandbox_manager_uid);
    assert_eq!(
        status_line(sm.pid(), "Uid").trim(),
        sm_uid,
        "the sandbox manager's uids"
    );
    for caps in ["CapEff", "CapPrm", "CapInh", "CapAmb"] {
        assert_eq!(
            status_field(sm.pid(), caps),
            "0000000000000000",
            "sandbox manager {caps}"
        );
    }
    let vmms: Vec<u32> = processes
        .iter()
        .filter(|(_, _, cmd)| cmd.contains("qemu-system"))
        .map(|(pid, _, _)| *pid)
        .collect();
    assert_eq!(vmms.len(), vms, "one QEMU per VM: {processes:#?}");
    let mut uids = std::collections::HashSet::new();
    for pid in vmms {
        let uid: u32 = status_field(pid, "Uid").parse().expect("uid");
        assert!(
            uid != 0 && uid != sandbox_manager_uid,
            "QEMU {pid} runs as uid {uid}"
        );
        assert!(uids.insert(uid), "two QEMUs share uid {uid}");
        assert_eq!(
            status_field(pid, "PPid"),
            nm.pid().to_string(),
            "the node manager launched {pid}"
        );
        assert_eq!(
            status_field(pid, "Seccomp"),
            "2",
            "QEMU {pid} under seccomp"
        );
        assert_eq!(status_field(pid, "NoNewPrivs"), "1");
        assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
        for ns in ["pid", "mnt", "ipc", "uts"] {
            assert_ne!(
                namespace(pid, ns),
                namespace(nm.pid(), ns),
                "QEMU {pid} has its own {ns} namespace"
            );
        }
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
        let memory = cgroups
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
            .or_else(|| {
                cgroups
                    .lines()
                    .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
            })
            .expect("a memory cgroup");
        assert!(
            memory.contains("/space/"),
            "QEMU {pid} in its node's cgroup: {memory}"
        );
        let limit = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory{memory}/memory.limit_in_bytes"
        ))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup{memory}/memory.max")))
        .expect("memory limit");
        let limit: u64 = limit.trim().parse().expect("a finite memory limit");
        assert!(limit < 8 << 30, "QEMU {pid} memory limit {limit}");
    }
}

/// The uid of the sandbox manager in the whole-life test: no account has it (nothing in
/// the sandbox manager needs a passwd entry), outside the VMM uid range.
const SANDBOX_MANAGER_UID: u32 = 1_400_000_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_lives_its_whole_life_under_an_unprivileged_sandbox_manager() {
    test_support::init_logging();
    let uid = SANDBOX_MANAGER_UID;
    let data_dir = new_data_dir();
    let nm = NodeManagerProcess::start(&data_dir, uid);
    // The template as `space template build` (an administrator's command) leaves one.
    let store = space_storage::Store::attach(&data_dir).expect("the node manager's store");
    test_support::import_template(&store, test_support::TEST_TEMPLATE).expect("import");
    let sm = SandboxManagerProcess::start(&data_dir, uid, &nm.socket).await;
    let c = &sm.client();

    // Create (from the template's memory image, itself built through the node manager).
    let id = test_sandbox(c).await;
    assert_eq!(shell(c, &id, "echo hello", false).await.trim(), "hello");
    // The gateway the sandbox manager serves on descriptors it was handed answers the
    // guest's DNS (with a refusal: the default policy is mode none).
    let out = c
        .run(
            &id,
            &space_core::process::ProcessSpec::shell("timeout 8 nslookup example.com; true"),
        )
        .await
        .expect("run nslookup");
    let answer = format!("{}{}", out.stdout_str(), out.stderr_str());
    assert!(
        answer.contains("can't find example.com"),
        "the gateway's resolver answers: {answer}"
    );

    // Pause and resume.
    c.pause_sandbox(&id).await.expect("pause");
    c.resume_sandbox(&id).await.expect("resume");
    assert_eq!(shell(c, &id, "echo back", false).await.trim(), "back");

    // A disk snapshot, a checkpoint, and a rollback to the checkpoint.
    shell(c, &id, "echo one > /root/mark && sync", true).await;
    let snap = |kind| CreateSnapshotRequest {
        kind,
        label: None,
        persistent: false,
    };
    c.create_snapshot(&id, &snap(SnapshotKind::Disk))
        .await
        .expect("disk snapshot");
    let checkpoint = c
        .create_snapshot(&id, &snap(SnapshotKind::Checkpoint))
        .await
        .expect("checkpoint");
    shell(c, &id, "echo two > /root/mark && sync", true).await;
    c.rollback(&id, &checkpoint.snapshot.id)
        .await
        .expect("rollback");
    assert_eq!(shell(c, &id, "cat /root/mark", true).await.trim(), "one");

    // Fork into three (from three on, through a fork image: its RAM in the node manager's
    // memory, dropped once the children run).
    let forks = c
        .fork(
            &id,
            &ForkRequest {
                count: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("fork");
    assert_eq!(forks.sandboxes.len(), 3);
    assert_least_privilege(&data_dir, &nm, &sm, uid, 4);
    assert_eq!(test_support::leaks::in_memory_images_held(nm.pid()), 0);

    // A VMM killed from outside (as the OOM killer would): the sandbox's crash (it is then
    // restored) is told with the exit status, which only the node manager, its parent, saw.
    let victim = &forks.sandboxes[0].id;
    let victim_pid = vmm_of(&data_dir, victim.as_str()).expect("the fork's QEMU");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the fork's VMM");
    let wait_state = |id: space_core::SandboxId, state: SandboxState| async move {
        test_support::wait_until(
            Duration::from_secs(60),
            &format!("{id} {state}"),
            || async { c.sandbox(&id).await.ok().filter(|s| s.state == state) },
        )
        .await
    };
    test_support::wait_until(
        Duration::from_secs(30),
        "the crash in the events",
        || async {
            let events = c.events(victim).await.ok()?;
            events
                .events
                .iter()
                .filter_map(|e| e.detail.as_deref())
                .any(|d| d.contains("QEMU exited with signal 9"))
                .then_some(())
        },
    )
    .await;
    // And it runs again, restored from its latest checkpoint (through the node manager too).
    wait_state(victim.clone(), SandboxState::Running).await;
    for f in &forks.sandboxes {
        assert_eq!(shell(c, &f.id, "cat /root/mark", true).await.trim(), "one");
        c.delete_sandbox(&f.id).await.expect("delete fork");
    }

    // A healthy life asks nothing the node manager refuses.
    let log = std::fs::read_to_string(&nm.log).unwrap_or_default();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    assert!(refusals.is_empty(), "refused: {refusals:#?}");

    // The sandbox manager restarts: it re-attaches to the VM the node manager runs.
    sm.stop();
    let sm = SandboxManagerProcess::start(&data_dir, uid, &nm.socket).await;
    let c = &sm.client();
    test_support::wait_until(Duration::from_secs(60), "re-adopted", || async {
        c.sandbox(&id)
            .await
            .ok()
            .filter(|s| s.state == SandboxState::Running)
    })
    .await;
    assert_eq!(shell(c, &id, "echo again", false).await.trim(), "again");
    assert_least_privilege(&data_dir, &nm, &sm, uid, 1);

    // The node manager restarts: the VMM (no longer its child) is still killed on delete.
    nm.stop();
    let nm = NodeManagerProcess::start(&data_dir, uid);
    // It copies the console of the VMM it finds running again.
    let log = std::fs::read_to_string(&nm.log).unwrap_or_default();
    assert!(
        log.contains("took over the console of a running VMM"),
        "the console is taken over: {log}"
    );
    c.delete_sandbox(&id).await.expect("delete");
    test_support::wait_until(Duration::from_secs(30), "the VMM to be gone", || async {
        vmm_of(&data_dir, id.as_str()).is_none().then_some(())
    })
    .await;
    let log = std::fs::read_to_string(&sm.log).unwrap_or_default();
    for line in log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
    {
        eprintln!("sandbox manager: {line}");
    }
    for denied in ["Permission denied", "Operation not permitted"] {
        assert!(
            !log.contains(denied),
            "the sandbox manager lacked a right: {log}"
        );
    }
    sm.stop();
    drop(nm);
    test_support::cleanup_data_dir(&data_dir);
}

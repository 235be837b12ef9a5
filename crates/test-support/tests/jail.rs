//! The VMM jail on a real node: every QEMU of running sandboxes is confined (own uid,
//! seccomp, namespaces, cgroup limits), and a probe program run in exactly the jail a VMM
//! gets (`QemuVmm::run_in_jail`, the same code path) fails every escape it tries.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use space_core::SandboxId;
use space_vmm::{GuestMemory, JailConfig, QemuVmm, VmConfig};
use test_support::{shell, test_sandbox, TestServer};

/// Pids and VM names of the QEMUs whose run directory lies under `run_root`.
fn vmms_under(run_root: &Path) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let marker = format!("secret,id=space-run-dir,data={}/", run_root.display());
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a.starts_with(&marker)) {
            let name = args
                .windows(2)
                .find(|w| w[0] == "-name")
                .map(|w| w[1].split(',').next().unwrap_or("").to_owned())
                .unwrap_or_default();
            out.push((pid, name));
        }
    }
    out
}

fn status_field(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

/// The v1 (or v2) cgroup file `file` of `pid`'s cgroup for `controller`.
fn cgroup_value(pid: u32, controller: &str, file: &str) -> Option<String> {
    let dir = cgroup_dir(pid, controller)?;
    std::fs::read_to_string(dir.join(file))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Process `pid`'s v1 cgroup directory of `controller`.
fn cgroup_dir(pid: u32, controller: &str) -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_owned())
    })?;
    Some(PathBuf::from(format!("/sys/fs/cgroup/{controller}{path}")))
}

fn run_root(ts: &TestServer) -> PathBuf {
    std::path::absolute(&ts.data_dir).unwrap().join("run")
}

/// The jail rules the node uses (named after its run directory, as the node names them).
fn node_jail(ts: &TestServer) -> JailConfig {
    let prefix = space_node::network::netns_prefix(&run_root(ts));
    JailConfig::new(prefix.trim_end_matches('-'))
}

fn first_file(dir: &Path, name: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path().join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no */{name} under {}", dir.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_vmm_runs_as_its_own_uid_under_seccomp_in_its_namespaces_and_cgroup() {
    let ts = TestServer::start().await;
    let a = test_sandbox(&ts.client).await;
    let b = test_sandbox(&ts.client).await;
    for id in [&a, &b] {
        assert_eq!(shell(&ts.client, id, "echo up", false).await.trim(), "up");
    }
    let node = ts.server().local_node().clone();
    let vmms = vmms_under(&run_root(&ts));
    for id in [&a, &b] {
        assert!(
            vmms.iter().any(|(_, name)| name == id.as_str()),
            "no VMM for {id} in {vmms:?}"
        );
    }
    let mut uids = Vec::new();
    for (pid, name) in &vmms {
        let uid = status_field(*pid, "Uid");
        let real: u32 = uid.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            uid.split_whitespace().all(|u| u == real.to_string()),
            "{name}: {uid}"
        );
        assert!(
            space_vmm::UidRange::DEFAULT.contains(real),
            "{name} runs as {real}"
        );
        uids.push(real);
        assert_eq!(status_field(*pid, "Seccomp"), "2", "{name}");
        assert_eq!(status_field(*pid, "NoNewPrivs"), "1", "{name}");
        assert_eq!(status_field(*pid, "CapEff"), "0000000000000000", "{name}");
        for ns in ["pid", "mnt", "ipc", "uts", "net"] {
            let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
            let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
            assert_ne!(ours, its, "{name} shares our {ns} namespace");
        }
        assert!(std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap()
            .is_empty());
        let oom = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
        assert_eq!(oom.trim(), "800", "{name}");
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        assert!(
            limits
                .lines()
                .any(|l| l.starts_with("Max core file size") && l.contains(" 0 ")),
            "{limits}"
        );
        // Its vCPUs' worth of CPU; guest RAM + the 64 MiB TCG cache + 256 MiB of overhead.
        let id: SandboxId = name.parse().unwrap();
        let res = node.sandbox(&id).expect("record").resources;
        assert_eq!(
            cgroup_value(*pid, "cpu", "cpu.cfs_quota_us"),
            Some((u64::from(res.vcpus) * 100_000).to_string())
        );
        assert_eq!(
            cgroup_value(*pid, "memory", "memory.limit_in_bytes"),
            Some(((u64::from(res.memory_mib) + 64 + 256) << 20).to_string())
        );
        assert_eq!(
            cgroup_value(*pid, "pids", "pids.max"),
            Some((128 + res.vcpus).to_string())
        );
        // Under contention it weighs its vCPUs' threads, and all the node's VMMs together
        // (the node's and `space`'s cgroups) one thread per host CPU.
        assert_eq!(
            cgroup_value(*pid, "cpu", "cpu.shares"),
            Some((u64::from(res.vcpus) * 1024).to_string())
        );
        let cpus = std::thread::available_parallelism().unwrap().get() as u64;
        let vmm = cgroup_dir(*pid, "cpu").expect("cpu cgroup");
        for parent in [
            vmm.parent().unwrap(),
            vmm.parent().unwrap().parent().unwrap(),
        ] {
            let shares = std::fs::read_to_string(parent.join("cpu.shares")).unwrap();
            assert_eq!(
                shares.trim(),
                (cpus * 1024).to_string(),
                "{}",
                parent.display()
            );
        }
    }
    uids.sort_unstable();
    let before = uids.len();
    uids.dedup();
    assert_eq!(uids.len(), before, "two VMMs share a uid");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn escape_probes_run_in_a_vmms_jail_all_fail() {
    let ts = TestServer::start().await;
    let a = test_sandbox(&ts.client).await;
    let b = test_sandbox(&ts.client).await;
    shell(&ts.client, &b, "echo secret > /root/b.txt && sync", true).await;
    let data = std::path::absolute(&ts.data_dir).unwrap();
    let node_store = ts.server().local_node().store().clone();
    let store = node_store.root().to_owned();
    let disk_b = node_store
        .sandbox_dir(&b)
        .join(space_storage::SANDBOX_DISK_FILE);
    let run = run_root(&ts);
    let vmm_of = |id: &SandboxId| {
        vmms_under(&run)
            .into_iter()
            .find(|(_, n)| n == id.as_str())
            .map(|(pid, _)| pid)
            .expect("VMM of the sandbox")
    };
    let (pid_a, pid_b) = (vmm_of(&a), vmm_of(&b));

    // The probe is a VM of its own here, started from the node's memory image as a sandbox
    // is, with a disk of its own; it attacks sandbox B and the node.
    let probe_disk = data.join("probe-disk.raw");
    std::fs::File::create(&probe_disk)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let kernel_dir = first_file(&store.join("kernels"), "vmlinuz")
        .parent()
        .unwrap()
        .to_owned();
    let image_memory = first_file(&store.join("images"), "memory");
    let template = first_file(&store.join("templates"), "rootfs.ext4");
    let cfg = VmConfig {
        name: "probe".into(),
        vcpus: 1,
        memory_mib: 128,
        kernel: kernel_dir.join("vmlinuz"),
        initrd: kernel_dir.join("initramfs.cpio"),
        cmdline: String::new(),
        root_disk: probe_disk.clone(),
        run_dir: run.join("probe"),
        accel: space_vmm::Accel::Tcg,
        tcg_tb_size_mib: Some(64),
        memory: GuestMemory::File {
            path: image_memory.clone(),
            shared: false,
        },
        restore: None,
        network: None,
    };
    // A setuid-root copy of the probe: running it again must not make it root.
    let probe = data.join("space-jail-probe");
    std::fs::copy(env!("CARGO_BIN_EXE_space-jail-probe"), &probe).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o4755)).unwrap();

    let host_files = [
        disk_b.clone(),
        image_memory.clone(),
        data.join("control.db"),
        data.join("api-key"),
        data.join("credentials.key"),
        data.join("placeholder.key"),
    ];
    for f in &host_files {
        assert!(f.exists(), "{} should exist on the host", f.display());
    }
    let api = ts.url().trim_start_matches("http://").to_owned();
    let mut attempts: Vec<String> = Vec::new();
    for f in &host_files {
        attempts.push(format!("read:{}", f.display()));
    }
    attempts.extend([
        format!("write:{}", template.display()),
        format!("write:{}", image_memory.display()),
        "write-fd:7".to_owned(),
        format!("write:{}", disk_b.display()),
        format!(
            "connect-unix:{}",
            run.join(b.as_str()).join("qmp.sock").display()
        ),
        format!(
            "connect-unix:{}",
            run.join(b.as_str()).join("channel.sock").display()
        ),
        format!("connect-tcp:{api}"),
        format!("signal:{pid_b}"),
        format!("ptrace:{pid_b}"),
        format!("signal:{pid_a}"),
        "mount".to_owned(),
        "unshare-user".to_owned(),
        "unshare-net".to_owned(),
        "chroot".to_owned(),
        "setuid-exec".to_owned(),
        "create:/escaped".to_owned(),
        "create:/usr/escaped".to_owned(),
        "create:/kernel/escaped".to_owned(),
        "write:/kernel/vmlinuz".to_owned(),
        "create:/proc/escaped".to_owned(),
        format!("create:{}", data.join("escaped").display()),
        // pids.max is 128 + 1 vCPU, the probe itself among them.
        "fork-bomb:129".to_owned(),
    ]);
    let args: Vec<OsString> = attempts.iter().map(OsString::from).collect();
    let vmm = QemuVmm::jailed("qemu-system-x86_64", node_jail(&ts));
    let mut probe_proc = vmm.run_in_jail(&cfg, &probe, &args).await.expect("probe");
    assert!(space_vmm::UidRange::DEFAULT.contains(probe_proc.uid().unwrap()));
    let code = tokio::time::timeout(Duration::from_secs(120), probe_proc.wait())
        .await
        .expect("probe finished");
    assert_eq!(code, Ok(0), "probe ended badly");
    let out = std::fs::read_to_string(run.join("probe").join("vmm.log")).unwrap();
    eprintln!("{out}");
    for attempt in &attempts {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{attempt} ")))
            .unwrap_or_else(|| panic!("no outcome for {attempt}:\n{out}"));
        assert!(line.contains(" denied: "), "escaped: {line}");
    }
    assert!(!data.join("escaped").exists());
    // The node's files are unchanged, the sandboxes unharmed.
    assert_eq!(
        shell(&ts.client, &b, "cat /root/b.txt", true).await.trim(),
        "secret"
    );
    assert_eq!(
        shell(&ts.client, &a, "echo fine", false).await.trim(),
        "fine"
    );

    // Past its memory limit only the jailed process dies.
    let hog = vec![OsString::from("memory:4096")];
    let mut hog_proc = vmm.run_in_jail(&cfg, &probe, &hog).await.expect("hog");
    let end = tokio::time::timeout(Duration::from_secs(120), hog_proc.wait())
        .await
        .expect("hog ended");
    assert_eq!(end, Err(libc::SIGKILL), "the cgroup's OOM killer ends it");
    assert_eq!(
        shell(&ts.client, &a, "echo alive", false).await.trim(),
        "alive"
    );
    assert_eq!(
        shell(&ts.client, &b, "echo alive", false).await.trim(),
        "alive"
    );
    let _ = std::fs::remove_file(&probe);
    ts.stop().await;
}

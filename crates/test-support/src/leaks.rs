//! Leak checks: after the suite, nothing of SPACE may be left on the machine — no QEMU
//! process, no node manager of a test node, no mount or loop device under the test root, no
//! sandbox disk.

use std::path::Path;

/// Every process of the machine with its arguments.
pub fn processes() -> Vec<(u32, Vec<String>)> {
    let mut out = Vec::new();
    let Ok(proc_dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in proc_dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let mut args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.last().is_some_and(String::is_empty) {
            args.pop();
        }
        out.push((pid, args));
    }
    out
}

/// QEMU processes that run a SPACE sandbox (their `-name` starts with `sbx-`).
pub fn sandbox_vmm_processes() -> Vec<(u32, String)> {
    processes()
        .into_iter()
        .filter(|(_, args)| {
            let is_qemu = args.first().is_some_and(|a| a.contains("qemu-system"));
            let is_sandbox = args
                .windows(2)
                .any(|w| w[0] == "-name" && w[1].starts_with("sbx-"));
            is_qemu && is_sandbox
        })
        .map(|(pid, args)| (pid, args.join(" ")))
        .collect()
}

/// `space node-manager` processes serving a data directory under `root`.
pub fn node_managers_under(root: &Path) -> Vec<(u32, String)> {
    let root = root.to_string_lossy();
    processes()
        .into_iter()
        .filter(|(_, args)| {
            args.iter().any(|a| a == "node-manager")
                && args
                    .windows(2)
                    .any(|w| w[0] == "--data-dir" && w[1].starts_with(&*root))
        })
        .map(|(pid, args)| (pid, args.join(" ")))
        .collect()
}

/// SIGKILLs `pids` and waits (up to 10 s) until they are gone, so that what they held open
/// (a store) can be unmounted next.
pub fn kill_and_wait(pids: impl IntoIterator<Item = u32>) {
    let pids: Vec<u32> = pids.into_iter().collect();
    for pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline
        && pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// How many of process `pid`'s descriptors are in-memory images (a fork's RAM, held by
/// whoever runs the VMMs: the node manager, or a node without one).
pub fn in_memory_images_held(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| {
            target
                .to_string_lossy()
                .starts_with("/memfd:space-in-memory-image")
        })
        .count()
}

/// Mount points at or below `root`.
pub fn mounts_under(root: &Path) -> Vec<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let root = root.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| mp.starts_with(root.as_ref()))
        .map(str::to_owned)
        .collect()
}

/// Loop devices whose backing file is at or below `root`.
pub fn loop_devices_under(root: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let root = root.to_string_lossy();
    dir.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            backing
                .trim()
                .starts_with(root.as_ref())
                .then(|| format!("/dev/{name} -> {}", backing.trim()))
        })
        .collect()
}

/// The VMM cgroups nodes made (`space/<node>/<vm>`, under each v1 controller or in v2):
/// removes the empty ones, whose VMM ended while no node watched it (a test that dropped its
/// node; a running node removes them at its next start), and returns those still holding
/// processes, and how many were removed.
pub fn vmm_cgroups() -> (Vec<String>, usize) {
    let mut busy = Vec::new();
    let mut removed = 0;
    let roots: Vec<std::path::PathBuf> = match std::fs::read_dir("/sys/fs/cgroup") {
        Ok(dir) => dir
            .flatten()
            .map(|e| e.path().join("space"))
            .chain(std::iter::once(
                Path::new("/sys/fs/cgroup/space").to_owned(),
            ))
            .filter(|p| p.is_dir())
            .collect(),
        Err(_) => Vec::new(),
    };
    for root in roots {
        for node in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            for vm in std::fs::read_dir(node.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if !vm.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if std::fs::remove_dir(vm.path()).is_ok() {
                    removed += 1;
                } else {
                    busy.push(vm.path().display().to_string());
                }
            }
            let _ = std::fs::remove_dir(node.path());
        }
    }
    (busy, removed)
}

/// Network namespaces a node made (`spc<node hash>-<vm>`) that are still there.
pub fn sandbox_namespaces() -> Vec<String> {
    space_net::datapath::netns::names_with_prefix("spc")
}

//! Leak checks: after the suite, nothing of SPACE may be left on the machine — no QEMU
//! process, no mount or loop device under the test root, no sandbox disk.

use std::path::Path;

/// QEMU processes that run a SPACE sandbox (their `-name` starts with `sbx-`).
pub fn sandbox_vmm_processes() -> Vec<(u32, String)> {
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
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_qemu = args.first().is_some_and(|a| a.contains("qemu-system"));
        let is_sandbox = args
            .windows(2)
            .any(|w| w[0] == "-name" && w[1].starts_with("sbx-"));
        if is_qemu && is_sandbox {
            out.push((pid, args.join(" ")));
        }
    }
    out
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

/// Network namespaces a node made (`spc<node hash>-<vm>`) that are still there.
pub fn sandbox_namespaces() -> Vec<String> {
    space_net::datapath::netns::names_with_prefix("spc")
}

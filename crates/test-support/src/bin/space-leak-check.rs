//! Runs after the whole test suite: unmounts the shared test store and fails if any QEMU
//! process, node manager, mount, loop device, network namespace, busy VMM cgroup or sandbox
//! disk of SPACE is left on the machine.

use std::process::ExitCode;

fn main() -> ExitCode {
    let root = test_support::test_root();
    let mut problems = Vec::new();
    for (pid, cmd) in test_support::leaks::sandbox_vmm_processes() {
        problems.push(format!("stray QEMU process {pid}: {cmd}"));
    }
    let node_managers = test_support::leaks::node_managers_under(&root);
    for (pid, cmd) in &node_managers {
        problems.push(format!("stray node manager {pid}: {cmd}"));
    }
    // Stopped, so that the store can be unmounted below.
    test_support::leaks::kill_and_wait(node_managers.into_iter().map(|(pid, _)| pid));
    let leftovers = test_support::leftover_sandbox_dirs();
    for d in &leftovers {
        problems.push(format!("stray sandbox directory {}", d.display()));
    }
    if let Err(e) = test_support::unmount_shared_store() {
        problems.push(format!("cannot unmount the shared test store: {e}"));
    }
    for m in test_support::leaks::mounts_under(&root) {
        problems.push(format!("stray mount {m}"));
    }
    for l in test_support::leaks::loop_devices_under(&root) {
        problems.push(format!("stray loop device {l}"));
    }
    for n in test_support::leaks::sandbox_namespaces() {
        problems.push(format!("stray network namespace {n}"));
    }
    let (busy, removed) = test_support::leaks::vmm_cgroups();
    for c in busy {
        problems.push(format!("VMM cgroup with processes left {c}"));
    }
    if removed > 0 {
        println!("leak check: removed {removed} empty VMM cgroups of VMMs that ended unwatched");
    }
    if problems.is_empty() {
        println!("leak check: no stray QEMU process, node manager, mount, loop device, network namespace or sandbox disk");
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("leak check: {p}");
        }
        ExitCode::FAILURE
    }
}

//! What the benchmark binaries (`src/bin/space-*-bench.rs`) share: a duration in
//! milliseconds, a process that proves a sandbox answers, incompressible data on its disk.

use std::time::Duration;

use space_cli::client::SpaceClient;
use space_core::process::ProcessSpec;
use space_core::SandboxId;

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `true` in sandbox `id`: it answers processes.
pub async fn exec_ok(c: &SpaceClient, id: &SandboxId) {
    let out = c.run(id, &ProcessSpec::shell("true")).await.expect("exec");
    assert_eq!(out.status.exit_code, Some(0));
}

/// `mib` MiB of incompressible data in `/home/user/data` of sandbox `id` (on its disk, and
/// in its page cache).
pub async fn write_random(c: &SpaceClient, id: &SandboxId, mib: u64) {
    let cmd = format!(
        "head -c {} /dev/urandom > /home/user/data && sync",
        mib << 20
    );
    let out = c.run(id, &ProcessSpec::shell(&cmd)).await.expect("write");
    assert_eq!(out.status.exit_code, Some(0), "{out:?}");
}

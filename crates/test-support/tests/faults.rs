//! Faults inside one sandbox fail that sandbox, with the console tail, and nothing else:
//! a guest kernel panic, a crashed daemon, and a hostile guest that speaks garbage.

use std::time::Duration;

use space_core::process::ProcessSpec;
use space_core::sandbox::CreateSandboxRequest;
use space_core::{ErrorCode, SandboxState};
use test_support::{TestServer, TEST_TEMPLATE};

const FAIL_WITHIN: Duration = Duration::from_secs(90);

/// These sandboxes must fail, not be restored: the tests are about containing the failure.
fn busybox() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        on_crash: space_core::sandbox::CrashPolicy::Fail,
        ..Default::default()
    }
}

fn as_root(line: &str) -> ProcessSpec {
    let mut spec = ProcessSpec::shell(line);
    spec.user = Some("root".into());
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kernel_panic_and_daemon_crash_fail_only_their_sandbox() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let req = busybox();
    let (panicking, crashing, bystander) = tokio::join!(
        c.create_sandbox(&req),
        c.create_sandbox(&req),
        c.create_sandbox(&req)
    );
    let (panicking, crashing, bystander) = (
        panicking.expect("create").id,
        crashing.expect("create").id,
        bystander.expect("create").id,
    );

    // The request itself may or may not come back before the VM dies.
    let _ = c
        .start_process(&panicking, &as_root("echo c > /proc/sysrq-trigger"))
        .await;
    // PID 1 cannot be killed from inside the guest; the agent can.
    let _ = c
        .start_process(&crashing, &as_root("kill -KILL $(pidof spaced)"))
        .await;

    let failed = ts
        .wait_state(&panicking, SandboxState::Failed, FAIL_WITHIN)
        .await;
    let reason = failed.failure_reason.unwrap_or_default();
    assert!(
        reason.contains("VM exited")
            && reason.contains("console tail")
            && reason.contains("sysrq triggered crash"),
        "reason: {reason}"
    );

    let failed = ts
        .wait_state(&crashing, SandboxState::Failed, FAIL_WITHIN)
        .await;
    let reason = failed.failure_reason.unwrap_or_default();
    assert!(reason.contains("agent exited"), "reason: {reason}");

    // Failed sandboxes refuse work with a clear error and keep their console for diagnosis.
    let err = c
        .run(&crashing, &ProcessSpec::argv(["true"]))
        .await
        .expect_err("failed sandbox");
    assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");
    assert!(c
        .console(&panicking, None)
        .await
        .expect("console")
        .contains("Kernel panic"));

    // The bystander never noticed.
    let out = c
        .run(&bystander, &ProcessSpec::argv(["echo", "unaffected"]))
        .await
        .expect("bystander");
    assert_eq!(out.stdout_str(), "unaffected\n");

    for id in [&panicking, &crashing, &bystander] {
        c.delete_sandbox(id).await.expect("delete");
    }
    ts.stop().await;
}

/// The start of every hostile "daemon": PID 1 of the guest, finding the channel's port.
macro_rules! find_port {
    () => {
        r#"#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
for d in /sys/class/virtio-ports/*; do
  [ "$(cat $d/name)" = space.agent ] && port=/dev/${d##*/}
done
"#
    };
}

/// A "daemon" that answers the handshake, then sends endless garbage instead of HTTP/2.
const GARBAGE_AFTER_HANDSHAKE: &str = concat!(
    find_port!(),
    r#"exec 3<>"$port"
while read -r word version nonce <&3; do
  [ "$word" = SPACE-HELLO ] && break
done
echo "SPACE-READY 1 $nonce evil 6.6.6" >&3
while true; do cat /proc/self/maps /proc/cpuinfo >&3; done
"#
);

/// A "daemon" that never speaks the protocol at all and floods the channel.
const ENDLESS_GARBAGE: &str = concat!(
    find_port!(),
    r#"while true; do cat /proc/cpuinfo; done > "$port"
"#
);

/// Boots a sandbox whose kernel bundle carries `script` in place of `spaced`.
async fn create_hostile(
    ts: &TestServer,
    script: &str,
    name: &str,
) -> space_cli::client::ClientError {
    let dir = ts.data_dir.join(format!("hostile-{name}"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("spaced");
    std::fs::write(&path, script).expect("write script");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let store = ts.server().local_node().store().clone();
    let kernel =
        space_images::build_kernel_bundle(&store, &space_images::KernelOpts::new(&path), &|_| {})
            .expect("hostile bundle");
    let tpl = store
        .templates()
        .get(TEST_TEMPLATE)
        .expect("read")
        .expect("template");
    store
        .templates()
        .set_kernel_digest(&tpl.digest, &kernel.digest)
        .expect("bind hostile kernel");
    let err = ts
        .client
        .create_sandbox(&busybox())
        .await
        .expect_err("a hostile guest cannot become ready");
    store
        .templates()
        .set_kernel_digest(&tpl.digest, &tpl.kernel_digest)
        .expect("restore kernel");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_guest_fails_only_itself() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let bystander = c.create_sandbox(&busybox()).await.expect("create").id;

    for (name, script) in [
        ("after-handshake", GARBAGE_AFTER_HANDSHAKE),
        ("endless", ENDLESS_GARBAGE),
    ] {
        let err = tokio::time::timeout(Duration::from_secs(180), create_hostile(&ts, script, name))
            .await
            .expect("bounded");
        assert_eq!(err.code(), Some(ErrorCode::SandboxFailed), "{name}: {err}");
        // The bystander is fine while and after the hostile guest misbehaves.
        let out = c
            .run(&bystander, &ProcessSpec::argv(["echo", name]))
            .await
            .expect("bystander");
        assert_eq!(out.stdout_str(), format!("{name}\n"));
    }
    // The failed creates left nothing behind but the bystander.
    let live: Vec<_> = test_support::leaks::sandbox_vmm_processes()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(&*ts.data_dir.to_string_lossy()))
        .collect();
    assert_eq!(live.len(), 1, "{live:?}");

    c.delete_sandbox(&bystander).await.expect("delete");
    ts.stop().await;
}

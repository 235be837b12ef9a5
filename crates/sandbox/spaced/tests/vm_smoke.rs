//! Smoke test against `spaced` running as PID 1 in a real VM, over the virtio-serial port.
//!
//! Skipped unless `SPACED_VM_SOCKET` names the host end of the VM's `space.agent` port (a
//! QEMU `socket,server=on` chardev). It checks what only a VM can: init's mounts, hostname,
//! clock, online root resize, ptys on devpts, host reconnects on the same port, and power-off
//! when the agent dies (set `SPACED_VM_KILL_AGENT=1`; this ends the VM).

mod common;

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::*;
use http::{Method, StatusCode};
use space_core::process::{ProcessSpec, PtySize};
use space_guest_proto::{GuestConfig, Health};

#[tokio::test]
async fn vm_smoke() {
    let Some(sock) = std::env::var_os("SPACED_VM_SOCKET") else {
        eprintln!("skipping: SPACED_VM_SOCKET is not set");
        return;
    };
    let sock = std::path::PathBuf::from(sock);
    let (stream, ready) = handshake_at(&sock, "f00d01").await;
    eprintln!("handshake: {}", ready.trim_end());
    assert!(stream.buffer().is_empty());
    let c = Client::over(stream.into_inner()).await;
    let (s, health) = c.get::<Health>("/v1/health").await;
    assert_eq!(s, StatusCode::OK);

    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let cfg = GuestConfig {
        hostname: "sbx-vm-smoke".into(),
        env: BTreeMap::from([("FROM_NODE".into(), "yes".into())]),
        default_user: "user".into(),
        default_workdir: None,
        resize_root: true,
        time_unix_ms: now_ms,
        network: None,
        trusted_ca_pem: None,
    };
    let (s, _, body) = c
        .call(
            Method::POST,
            "/v1/configure",
            full(serde_json::to_vec(&cfg).unwrap()),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&body)
    );

    let run = c
        .run(&ProcessSpec::shell(
            "hostname; id -u; echo $FROM_NODE $HOME; pwd; date +%s; df -k / | tail -1; grep sbx-vm-smoke /etc/hosts; \
             cat /proc/mounts | cut -d' ' -f2,3 | sort | tr '\\n' ' '",
        ))
        .await;
    eprintln!(
        "{}\nstderr: {}",
        run.stdout(),
        String::from_utf8_lossy(&run.stderr)
    );
    let out = run.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "sbx-vm-smoke");
    assert_eq!(lines[1], "1000");
    assert_eq!(lines[2], "yes /home/user");
    assert_eq!(lines[3], "/home/user");
    let guest_secs: i64 = lines[4].parse().unwrap();
    assert!((guest_secs - now_ms / 1000).abs() < 120, "clock set");
    let df_kb: u64 = lines[5].split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        df_kb > 200 * 1024,
        "root grown to the 256 MiB disk: {}",
        lines[5]
    );
    assert!(lines[6].contains("sbx-vm-smoke"));
    for m in [
        "/proc proc",
        "/sys sysfs",
        "/dev devtmpfs",
        "/dev/pts devpts",
        "/dev/shm tmpfs",
        "/tmp tmpfs",
        "/run tmpfs",
    ] {
        assert!(lines[7].contains(m), "{m} mounted: {}", lines[7]);
    }

    // A pty as the unprivileged user.
    let mut spec = ProcessSpec::shell("tty; stty size; stat -c %u $(tty)");
    spec.pty = Some(PtySize { rows: 30, cols: 90 });
    let run = c.run(&spec).await;
    let pty = String::from_utf8_lossy(&run.pty).into_owned();
    assert!(
        pty.starts_with("/dev/pts/") && pty.contains("30 90") && pty.contains("1000"),
        "{pty:?}"
    );

    // Files as the user, streamed.
    let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 253) as u8).collect();
    let parts: Vec<Bytes> = data.chunks(256 << 10).map(Bytes::copy_from_slice).collect();
    let (s, _, body) = c
        .call(Method::PUT, "/v1/files?path=data/blob.bin", chunks(parts))
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (s, _, got) = c
        .call(
            Method::GET,
            "/v1/files?path=/home/user/data/blob.bin",
            empty(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(got[..] == data[..], "file round trip");
    let (s, _, _) = c
        .call(
            Method::PUT,
            "/v1/files?path=/root/secret&user=root&mode=600",
            full("s"),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    c.expect_error(
        Method::GET,
        "/v1/files?path=/root/secret",
        empty(),
        403,
        "permission_denied",
    )
    .await;

    // A long-running process survives the host reconnecting; the port is reused.
    let bg = c
        .start(&ProcessSpec::shell(
            "for i in 1 2 3 4 5; do echo tick $i; sleep 0.2; done",
        ))
        .await;
    drop(c);
    let (stream, _) = handshake_at(&sock, "f00d02").await;
    let c = Client::over(stream.into_inner()).await;
    let (_, again) = c.get::<Health>("/v1/health").await;
    assert_eq!(again.boot_id, health.boot_id);
    let run = collect(bg.id, c.output(bg.id, 0).await);
    assert_eq!(run.stdout(), "tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n");
    assert_eq!(run.exit, exited(0));

    if std::env::var_os("SPACED_VM_KILL_AGENT").is_some() {
        let mut spec = ProcessSpec::shell("kill -9 $PPID");
        spec.user = Some("root".into());
        let _ = c.start(&spec).await;
        eprintln!("agent killed; the VM should power off");
    }
}

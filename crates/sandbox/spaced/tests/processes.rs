//! Process routes against a real agent on a Unix socket: exec, exit codes and signals,
//! timeouts, exec failures, stdin streaming, PTYs, background processes, output replay.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use space_core::process::{ExitStatus, OutputEvent, ProcessInfo, ProcessSpec, PtySize};
use space_guest_proto::{GuestConfig, Health};

#[tokio::test]
async fn health_and_configure_without_touching_the_host() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let (status, health) = c.get::<Health>("/v1/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(health.processes, 0);
    assert_eq!(health.boot_id.len(), 32);

    let hostname_before = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let cfg = GuestConfig {
        hostname: "sbx-must-not-apply".into(),
        env: BTreeMap::from([
            ("SANDBOX_VAR".into(), "from-sandbox".into()),
            ("OVERRIDE".into(), "sandbox".into()),
        ]),
        default_user: "nobody".into(),
        default_workdir: None,
        resize_root: true,
        time_unix_ms: 1,
        network: None,
        trusted_ca_pem: None,
    };
    let (status, _, body) = c
        .call(
            Method::POST,
            "/v1/configure",
            full(serde_json::to_vec(&cfg).unwrap()),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body:?}");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        hostname_before
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now > 1_600_000_000, "the clock was not set to 1970");

    // Sandbox env and default user apply; the process env wins over the sandbox env.
    let mut spec = ProcessSpec::shell("echo $SANDBOX_VAR $OVERRIDE $USER $HOME; id -u");
    spec.env.insert("OVERRIDE".into(), "process".into());
    spec.cwd = Some("/".into()); // nobody's home does not exist
    let run = c.run(&spec).await;
    assert_eq!(
        run.stdout(),
        "from-sandbox process nobody /nonexistent\n65534\n"
    );

    // Bad configuration is refused.
    let mut bad = serde_json::to_value(&cfg).unwrap();
    bad["hostname"] = "bad host".into();
    c.expect_error(
        Method::POST,
        "/v1/configure",
        full(bad.to_string()),
        400,
        "invalid_request",
    )
    .await;
    c.expect_error(
        Method::POST,
        "/v1/configure",
        full("{not json"),
        400,
        "invalid_request",
    )
    .await;
    c.expect_error(
        Method::POST,
        "/v1/configure",
        full(vec![b' '; 2 << 20]),
        413,
        "payload_too_large",
    )
    .await;
    c.expect_error(Method::GET, "/v1/nope", empty(), 404, "not_found")
        .await;
}

#[tokio::test]
async fn exec_separates_streams_and_reports_exit_codes() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let run = c.run(&ProcessSpec::argv(["echo", "hi"])).await;
    assert_eq!(run.stdout(), "hi\n");
    assert_eq!(run.exit, exited(0));

    let run = c
        .run(&ProcessSpec::shell("echo out; echo err >&2; exit 3"))
        .await;
    assert_eq!(run.stdout(), "out\n");
    assert_eq!(run.stderr, b"err\n");
    assert_eq!(run.exit, exited(3));

    // Default environment and working directory (root's home).
    let run = c
        .run(&ProcessSpec::shell("echo $PATH; pwd; echo $USER"))
        .await;
    assert_eq!(
        run.stdout(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n/root\nroot\n"
    );

    // Relative cwd resolves against the home; a missing cwd is a clear 400.
    let mut spec = ProcessSpec::argv(["pwd"]);
    spec.cwd = Some("/tmp/.".into());
    assert_eq!(c.run(&spec).await.stdout(), "/tmp\n");
    spec.cwd = Some("/definitely/not/here".into());
    let msg = c
        .expect_error(
            Method::POST,
            "/v1/processes",
            full(serde_json::to_vec(&spec).unwrap()),
            400,
            "invalid_path",
        )
        .await;
    assert!(msg.contains("/definitely/not/here"), "{msg}");

    // Each process is a process-group and session leader.
    let run = c
        .run(&ProcessSpec::shell(
            "set -- $(cat /proc/$$/stat); echo $1 $5 $6",
        ))
        .await;
    let ids: Vec<&str> = run
        .stdout
        .split(|b| *b == b' ' || *b == b'\n')
        .filter(|s| !s.is_empty())
        .map(|s| std::str::from_utf8(s).unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(
        ids[0] == ids[1] && ids[1] == ids[2],
        "pid, pgid and sid are equal: {ids:?}"
    );

    // Ids are never reused and the info reflects the run.
    let (_, list) = c.get::<Vec<ProcessInfo>>("/v1/processes").await;
    let ids: Vec<u64> = list.iter().map(|p| p.id).collect();
    let mut sorted = ids.clone();
    sorted.dedup();
    assert_eq!(ids, sorted);
    assert!(list.iter().all(|p| p.exit.is_some()));
}

#[tokio::test]
async fn exit_by_signal_and_timeout() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let run = c.run(&ProcessSpec::shell("kill -SEGV $$")).await;
    assert_eq!(
        run.exit,
        Some(ExitStatus {
            exit_code: None,
            signal: Some(11),
            timed_out: false
        })
    );

    // The timeout kills the whole group, including the background child.
    let mut spec = ProcessSpec::shell("sleep 1000 & echo started; wait");
    spec.timeout_ms = Some(300);
    let run = c.run(&spec).await;
    assert_eq!(run.stdout(), "started\n");
    assert_eq!(
        run.exit,
        Some(ExitStatus {
            exit_code: None,
            signal: Some(9),
            timed_out: true
        })
    );
    let (_, health) = c.get::<Health>("/v1/health").await;
    assert_eq!(health.processes, 0);
}

#[tokio::test]
async fn missing_or_unexecutable_binary_is_422() {
    let agent = Agent::start();
    let c = agent.connect().await;
    for argv in [
        vec!["/nonexistent/bin/tool"],
        vec!["no-such-command-xyz", "arg"],
        vec!["/etc/passwd"],
    ] {
        let msg = c
            .expect_error(
                Method::POST,
                "/v1/processes",
                full(serde_json::to_vec(&ProcessSpec::argv(argv.clone())).unwrap()),
                422,
                "exec_failed",
            )
            .await;
        assert!(msg.contains(argv[0]), "{msg}");
    }
    // Invalid specs are 400; unknown explicit users too.
    c.expect_error(
        Method::POST,
        "/v1/processes",
        full(r#"{"argv":[]}"#),
        400,
        "invalid_request",
    )
    .await;
    c.expect_error(
        Method::POST,
        "/v1/processes",
        full(r#"{"argv":["true"],"user":"no-such-user"}"#),
        400,
        "unknown_user",
    )
    .await;
    c.expect_error(
        Method::POST,
        "/v1/processes",
        full(r#"{"argv":["true"],"bogus":1}"#),
        400,
        "invalid_request",
    )
    .await;
    let (_, health) = c.get::<Health>("/v1/health").await;
    assert_eq!(health.processes, 0);
}

#[tokio::test]
async fn stdin_is_streamed_with_close() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let mut spec = ProcessSpec::argv(["sha256sum"]);
    spec.stdin = true;
    let info = c.start(&spec).await;
    // 4 MiB in 64 KiB chunks, in two requests; the first keeps stdin open.
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let parts: Vec<Bytes> = data.chunks(64 << 10).map(Bytes::copy_from_slice).collect();
    let (first, second) = parts.split_at(parts.len() / 2);
    let (s, _, _) = c
        .call(
            Method::POST,
            &format!("/v1/processes/{}/stdin", info.id),
            chunks(first.to_vec()),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = c
        .call(
            Method::POST,
            &format!("/v1/processes/{}/stdin?close=true", info.id),
            chunks(second.to_vec()),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let run = collect(info.id, c.output(info.id, 0).await);
    use sha2::Digest;
    let expected = hex::encode(sha2::Sha256::digest(&data));
    assert_eq!(run.stdout(), format!("{expected}  -\n"));

    // After exit (or without stdin) the route says so.
    c.expect_error(
        Method::POST,
        &format!("/v1/processes/{}/stdin", info.id),
        full("x"),
        409,
        "conflict",
    )
    .await;
    let info = c.start(&ProcessSpec::argv(["true"])).await;
    c.expect_error(
        Method::POST,
        &format!("/v1/processes/{}/stdin", info.id),
        full("x"),
        409,
        "conflict",
    )
    .await;
    c.expect_error(
        Method::POST,
        "/v1/processes/999999/stdin",
        full("x"),
        404,
        "not_found",
    )
    .await;
}

#[tokio::test]
async fn pty_reports_tty_and_resizes() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let mut spec =
        ProcessSpec::shell("tty; stty size; read line; stty size; echo \"got $line\"; echo $TERM");
    spec.pty = Some(PtySize { rows: 24, cols: 80 });
    spec.stdin = true;
    let info = c.start(&spec).await;
    assert!(info.pty);
    // Follow the live stream until the first `stty size` so the resize comes after it.
    let mut seen = Vec::new();
    let mut after = 0;
    let resp = c
        .request(
            Method::GET,
            &format!("/v1/processes/{}/output", info.id),
            empty(),
        )
        .await;
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    while !String::from_utf8_lossy(&seen).contains("24 80") {
        let frame = body.frame().await.unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let ev: OutputEvent = serde_json::from_slice(line).unwrap();
                after = ev.seq();
                if let Some((_, b)) = ev.bytes() {
                    seen.extend(b);
                }
            }
        }
    }
    drop(body); // a reader leaving mid-stream does not affect the process
    let (s, _, _) = c
        .call(
            Method::POST,
            &format!("/v1/processes/{}/resize", info.id),
            full(r#"{"rows":40,"cols":100}"#),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = c
        .call(
            Method::POST,
            &format!("/v1/processes/{}/stdin", info.id),
            full("hello\n"),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let rest = collect(info.id, c.output(info.id, after).await);
    let all = String::from_utf8_lossy(&seen).into_owned() + &String::from_utf8_lossy(&rest.pty);
    assert!(all.starts_with("/dev/pts/"), "{all:?}");
    assert!(all.contains("40 100"), "{all:?}");
    assert!(all.contains("got hello"), "{all:?}");
    assert!(all.contains("xterm-256color"), "{all:?}");
    assert_eq!(rest.exit, exited(0));
    assert!(rest.stdout.is_empty() && rest.stderr.is_empty());

    // Resizing a process without a pty is a conflict.
    let info = c.start(&ProcessSpec::argv(["true"])).await;
    c.expect_error(
        Method::POST,
        &format!("/v1/processes/{}/resize", info.id),
        full(r#"{"rows":1,"cols":1}"#),
        409,
        "conflict",
    )
    .await;
}

#[tokio::test]
async fn background_process_is_listed_and_signalled() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let mut spec = ProcessSpec::argv(["sleep", "1000"]);
    spec.tag = Some("bg".into());
    let info = c.start(&spec).await;
    let (_, list) = c.get::<Vec<ProcessInfo>>("/v1/processes").await;
    let listed = list.iter().find(|p| p.id == info.id).unwrap();
    assert_eq!(
        (listed.tag.as_deref(), listed.exit, listed.argv.clone()),
        (
            Some("bg"),
            None,
            vec!["sleep".to_owned(), "1000".to_owned()]
        )
    );
    let (_, health) = c.get::<Health>("/v1/health").await;
    assert_eq!(health.processes, 1);

    c.expect_error(
        Method::POST,
        &format!("/v1/processes/{}/signal", info.id),
        full(r#"{"signal":0}"#),
        400,
        "invalid_request",
    )
    .await;
    let (s, _, _) = c
        .call(
            Method::POST,
            &format!("/v1/processes/{}/signal", info.id),
            full(r#"{"signal":15}"#),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let run = collect(info.id, c.output(info.id, 0).await);
    assert_eq!(
        run.exit,
        Some(ExitStatus {
            exit_code: None,
            signal: Some(15),
            timed_out: false
        })
    );
    let (_, got) = c
        .get::<ProcessInfo>(&format!("/v1/processes/{}", info.id))
        .await;
    assert_eq!(got.exit, run.exit);
    c.expect_error(
        Method::POST,
        &format!("/v1/processes/{}/signal", info.id),
        full(r#"{"signal":15}"#),
        409,
        "conflict",
    )
    .await;
    c.expect_error(
        Method::GET,
        "/v1/processes/424242",
        empty(),
        404,
        "not_found",
    )
    .await;
    c.expect_error(
        Method::GET,
        "/v1/processes/abc",
        empty(),
        400,
        "invalid_request",
    )
    .await;
}

#[tokio::test]
async fn output_replays_after_seq_across_sessions() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let info = c
        .start(&ProcessSpec::shell("echo one; echo two >&2; echo three"))
        .await;
    let events = c.output(info.id, 0).await;
    assert!(matches!(events[0], OutputEvent::Started { seq: 1, id, .. } if id == info.id));
    let first_data = events
        .iter()
        .find(|e| matches!(e, OutputEvent::Data { .. }))
        .unwrap()
        .seq();
    drop(c);

    // A new session (the host reconnected) resumes after the seq it saw.
    let c = agent.connect().await;
    let rest = c.output(info.id, first_data).await;
    assert_eq!(
        rest,
        events
            .iter()
            .filter(|e| e.seq() > first_data)
            .cloned()
            .collect::<Vec<_>>()
    );
    // After the last event there is nothing more, and concurrent readers all get everything.
    let last = events.last().unwrap().seq();
    assert!(c.output(info.id, last).await.is_empty());
    let (a, b) = tokio::join!(c.output(info.id, 0), c.output(info.id, 0));
    assert_eq!(a, events);
    assert_eq!(b, events);
}

#[tokio::test]
async fn unread_output_never_blocks_and_is_reported_lost() {
    let agent = Agent::start();
    let c = agent.connect().await;
    // 8 MiB with nobody reading: the process must finish anyway.
    let info = c
        .start(&ProcessSpec::shell(
            "head -c 8388608 /dev/zero; echo done >&2",
        ))
        .await;
    loop {
        let (_, p) = c
            .get::<ProcessInfo>(&format!("/v1/processes/{}", info.id))
            .await;
        if p.exit.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = c.output(info.id, 0).await;
    let OutputEvent::Lost { seq, bytes } = events[0] else {
        panic!("expected lost first: {:?}", &events[..2])
    };
    assert_eq!(events[1].seq(), seq + 1);
    let run = collect(info.id, events[1..].to_vec());
    assert_eq!(bytes + run.stdout.len() as u64, 8 << 20);
    assert!(run.stdout.len() <= 1 << 20);
    assert_eq!(run.stderr, b"done\n");
    assert_eq!(run.exit, exited(0));
}

#[tokio::test]
async fn orphans_are_reaped_by_the_subreaper() {
    let agent = Agent::start();
    let c = agent.connect().await;
    // The shell exits at once; its background child becomes our orphan and exits later.
    let run = c
        .run(&ProcessSpec::shell("(sleep 0.2; exit 0) & echo $!"))
        .await;
    let orphan: u32 = run.stdout().trim().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut zombie = true;
    for _ in 0..50 {
        match std::fs::read_to_string(format!("/proc/{orphan}/stat")) {
            Err(_) => {
                zombie = false;
                break;
            }
            Ok(stat) if !stat.contains(") Z ") => {
                // Still running or the pid was reused; either way not our zombie.
                zombie = false;
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(!zombie, "orphan {orphan} stayed a zombie");
    let _ = agent.pid();
}

#[tokio::test]
async fn live_output_starts_with_started_and_skips_the_past() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let mut spec = ProcessSpec::shell("echo before; read line; echo \"after $line\"");
    spec.stdin = true;
    let info = c.start(&spec).await;
    // Wait until the past is there: follow the replay until "before" has been printed.
    let mut replay = c
        .request(
            Method::GET,
            &format!("/v1/processes/{}/output", info.id),
            empty(),
        )
        .await
        .into_body();
    let mut text = Vec::new();
    while !String::from_utf8_lossy(&text).contains(&base64_of(b"before\n")) {
        let frame = tokio::time::timeout(Duration::from_secs(20), replay.frame())
            .await
            .expect("no output in time")
            .expect("output ended")
            .unwrap();
        if let Ok(d) = frame.into_data() {
            text.extend_from_slice(&d);
        }
    }
    drop(replay);
    let resp = c
        .request(
            Method::GET,
            &format!("/v1/processes/{}/output?live=true", info.id),
            empty(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (s, _, _) = c
        .call(
            Method::POST,
            &format!("/v1/processes/{}/stdin?close=true", info.id),
            full("now\n"),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let events: Vec<OutputEvent> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(
        events[0],
        OutputEvent::Started {
            seq: 1,
            id: info.id,
            pid: info.pid
        }
    );
    let run = collect(info.id, events);
    assert_eq!(
        run.stdout(),
        "after now\n",
        "only what came after the request"
    );
    assert_eq!(run.exit, exited(0));

    // An exited process: `started`, then its `exit`.
    let (_, _, bytes) = c
        .call(
            Method::GET,
            &format!("/v1/processes/{}/output?live=true", info.id),
            empty(),
        )
        .await;
    let events: Vec<OutputEvent> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(events[0], OutputEvent::Started { seq: 1, .. }));
    assert!(matches!(events[1], OutputEvent::Exit { .. }));
    c.expect_error(
        Method::GET,
        &format!("/v1/processes/{}/output?live=true&after=1", info.id),
        empty(),
        400,
        "invalid_request",
    )
    .await;
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

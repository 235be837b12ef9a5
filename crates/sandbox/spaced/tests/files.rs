//! File routes against a real agent: streamed read/write of a large file, atomic replace,
//! listing, stat, mkdir -p, remove, rename, path validation and per-user permissions.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use bytes::Bytes;
use common::*;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use space_core::files::{FileKind, FileList, FileStat};

#[tokio::test]
async fn large_file_round_trip_is_streamed() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let path = agent.dir.path().join("deep/er/big.bin");
    let data: Vec<u8> = (0..20u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let parts: Vec<Bytes> = data.chunks(1 << 20).map(Bytes::copy_from_slice).collect();
    let (s, _, body) = c
        .call(
            Method::PUT,
            &format!("/v1/files?path={}&mode=640", q(path.to_str().unwrap())),
            chunks(parts),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body:?}");
    let stat: FileStat = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (stat.size, stat.mode, stat.kind),
        (20 << 20, 0o640, FileKind::File)
    );
    assert_eq!(stat.path, path.to_str().unwrap());
    assert_eq!(
        (stat.owner.as_deref(), stat.group.as_deref()),
        (Some("root"), Some("root"))
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
        0o640
    );

    let resp = c
        .request(
            Method::GET,
            &format!("/v1/files?path={}", q(path.to_str().unwrap())),
            empty(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()["x-space-file-size"],
        (20u64 << 20).to_string()
    );
    let mut body = resp.into_body();
    let mut hasher = Sha256::new();
    let (mut total, mut largest) = (0usize, 0usize);
    while let Some(frame) = body.frame().await {
        if let Ok(d) = frame.unwrap().into_data() {
            total += d.len();
            largest = largest.max(d.len());
            hasher.update(&d);
        }
    }
    assert_eq!(total, 20 << 20);
    assert!(largest <= 64 << 10, "chunks are bounded");
    assert_eq!(hasher.finalize(), Sha256::digest(&data));
}

#[tokio::test]
async fn write_replaces_atomically() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let dir = agent.dir.path().join("atomic");
    let path = dir.join("f.txt");
    let p = q(path.to_str().unwrap());
    let (s, _, _) = c
        .call(
            Method::PUT,
            &format!("/v1/files?path={p}"),
            full("first version"),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let ino_before = std::fs::metadata(&path).unwrap().ino();
    let (s, _, body) = c
        .call(
            Method::PUT,
            &format!("/v1/files?path={p}&mode=0600"),
            full("second"),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let stat: FileStat = serde_json::from_slice(&body).unwrap();
    assert_eq!((stat.size, stat.mode), (6, 0o600));
    assert_eq!(std::fs::read(&path).unwrap(), b"second");
    assert_ne!(
        std::fs::metadata(&path).unwrap().ino(),
        ino_before,
        "replaced by rename, not rewritten"
    );
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("f.txt")],
        "no temporary files left"
    );

    // Writing over a directory, or with a bad mode, fails cleanly.
    c.expect_error(
        Method::PUT,
        &format!("/v1/files?path={}", q(dir.to_str().unwrap())),
        full("x"),
        400,
        "invalid_path",
    )
    .await;
    c.expect_error(
        Method::PUT,
        &format!("/v1/files?path={p}&mode=99"),
        full("x"),
        400,
        "invalid_request",
    )
    .await;
    // Reading a directory is refused; a missing file is 404.
    c.expect_error(
        Method::GET,
        &format!("/v1/files?path={}", q(dir.to_str().unwrap())),
        empty(),
        400,
        "invalid_path",
    )
    .await;
    c.expect_error(
        Method::GET,
        &format!("/v1/files?path={}/missing", q(dir.to_str().unwrap())),
        empty(),
        404,
        "not_found",
    )
    .await;
}

#[tokio::test]
async fn files_keep_their_metadata() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let path = agent.dir.path().join("meta/m.txt");
    let p = q(path.to_str().unwrap());
    let meta = q(r#"{"origin":"test","k2":"v 2"}"#);
    let (s, _, body) = c
        .call(
            Method::PUT,
            &format!("/v1/files?path={p}&metadata={meta}"),
            full("m"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let stat: FileStat = serde_json::from_slice(&body).unwrap();
    assert_eq!(stat.metadata["origin"], "test");
    assert_eq!(stat.metadata["k2"], "v 2");
    // Kept with the file: a stat and a listing show it, a rewrite without it clears it.
    let (_, again): (_, FileStat) = c.get(&format!("/v1/files/stat?path={p}")).await;
    assert_eq!(again.metadata, stat.metadata);
    let (s, _, body) = c
        .call(Method::PUT, &format!("/v1/files?path={p}"), full("n"))
        .await;
    assert_eq!(s, StatusCode::OK);
    let rewritten: FileStat = serde_json::from_slice(&body).unwrap();
    assert!(rewritten.metadata.is_empty());
    for bad in [
        r#"{"Upper":"x"}"#,
        r#"{"k":1}"#,
        "[1]",
        r#"{"k":"a
b"}"#,
    ] {
        c.expect_error(
            Method::PUT,
            &format!("/v1/files?path={p}&metadata={}", q(bad)),
            full("x"),
            400,
            "invalid_request",
        )
        .await;
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"n",
        "a refused write changes nothing"
    );
}

#[tokio::test]
async fn list_stat_mkdir_remove_rename() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let root = agent.dir.path().join("tree");
    let r = root.to_str().unwrap().to_owned();

    // mkdir -p, with a mode; again is fine; over a file is 409.
    let (s, st) = c
        .json::<FileStat>(
            Method::POST,
            "/v1/files/mkdir",
            &serde_json::json!({"path": format!("{r}/a/b/c"), "mode": 0o700}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!((st.kind, st.mode), (FileKind::Dir, 0o700));
    let (s, _) = c
        .json::<FileStat>(
            Method::POST,
            "/v1/files/mkdir",
            &serde_json::json!({"path": format!("{r}/a/b/c")}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    std::fs::write(root.join("a/file"), "12345").unwrap();
    std::os::unix::fs::symlink("/etc", root.join("a/link")).unwrap();
    c.expect_error(
        Method::POST,
        "/v1/files/mkdir",
        full(serde_json::json!({"path": format!("{r}/a/file")}).to_string()),
        409,
        "already_exists",
    )
    .await;

    // list with depth; does not follow the symlink to /etc.
    let (s, list) = c
        .get::<FileList>(&format!("/v1/files/list?path={}&depth=1", q(&r)))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        list.entries
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>(),
        vec!["a"]
    );
    let (_, list) = c
        .get::<FileList>(&format!("/v1/files/list?path={}&depth=16", q(&r)))
        .await;
    let rel: Vec<String> = list
        .entries
        .iter()
        .map(|e| e.path.strip_prefix(&r).unwrap().to_owned())
        .collect();
    assert_eq!(rel, vec!["/a", "/a/b", "/a/b/c", "/a/file", "/a/link"]);
    assert!(!list.truncated);
    let link = list.entries.iter().find(|e| e.name == "link").unwrap();
    assert_eq!(
        (link.kind, link.symlink_target.as_deref()),
        (FileKind::Symlink, Some("/etc"))
    );
    c.expect_error(
        Method::GET,
        &format!("/v1/files/list?path={}/a/file", q(&r)),
        empty(),
        400,
        "invalid_path",
    )
    .await;

    // stat is lstat.
    let (_, st) = c
        .get::<FileStat>(&format!("/v1/files/stat?path={}/a/link", q(&r)))
        .await;
    assert_eq!(st.kind, FileKind::Symlink);
    let (_, st) = c
        .get::<FileStat>(&format!("/v1/files/stat?path={}/a/file", q(&r)))
        .await;
    assert_eq!(
        (st.size, st.kind, st.name.as_str()),
        (5, FileKind::File, "file")
    );
    c.expect_error(
        Method::GET,
        &format!("/v1/files/stat?path={}/nope", q(&r)),
        empty(),
        404,
        "not_found",
    )
    .await;

    // rename (file over file; directory).
    std::fs::write(root.join("other"), "old").unwrap();
    let (s, _, _) = c
        .call(
            Method::POST,
            "/v1/files/rename",
            full(
                serde_json::json!({"from": format!("{r}/a/file"), "to": format!("{r}/other")})
                    .to_string(),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        std::fs::read_to_string(root.join("other")).unwrap(),
        "12345"
    );
    let (s, _, _) = c
        .call(
            Method::POST,
            "/v1/files/rename",
            full(
                serde_json::json!({"from": format!("{r}/a/b"), "to": format!("{r}/moved")})
                    .to_string(),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(root.join("moved/c").is_dir());
    c.expect_error(
        Method::POST,
        "/v1/files/rename",
        full(serde_json::json!({"from": format!("{r}/nope"), "to": format!("{r}/x")}).to_string()),
        404,
        "not_found",
    )
    .await;

    // remove: non-empty dir needs recursive; "/" is refused; the symlink target survives.
    c.expect_error(
        Method::DELETE,
        &format!("/v1/files?path={}", q(&r)),
        empty(),
        409,
        "conflict",
    )
    .await;
    let (s, _, _) = c
        .call(
            Method::DELETE,
            &format!("/v1/files?path={}&recursive=true", q(&r)),
            empty(),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(!root.exists());
    assert!(std::path::Path::new("/etc/passwd").exists());
    c.expect_error(
        Method::DELETE,
        "/v1/files?path=/&recursive=true",
        empty(),
        400,
        "invalid_path",
    )
    .await;
    c.expect_error(
        Method::DELETE,
        "/v1/files?path=//./&recursive=true",
        empty(),
        400,
        "invalid_path",
    )
    .await;
    c.expect_error(
        Method::DELETE,
        &format!("/v1/files?path={}", q(&r)),
        empty(),
        404,
        "not_found",
    )
    .await;
}

#[tokio::test]
async fn traversal_and_bad_paths_are_refused() {
    let agent = Agent::start();
    let c = agent.connect().await;
    for path in ["../etc/passwd", "/tmp/../etc/passwd", "", "a%00b"] {
        c.expect_error(
            Method::GET,
            &format!("/v1/files/stat?path={path}"),
            empty(),
            400,
            "invalid_path",
        )
        .await;
    }
    c.expect_error(
        Method::PUT,
        "/v1/files?path=/tmp/../x",
        full("x"),
        400,
        "invalid_path",
    )
    .await;
    c.expect_error(
        Method::POST,
        "/v1/files/mkdir",
        full(r#"{"path":"a/../../b"}"#),
        400,
        "invalid_path",
    )
    .await;
    c.expect_error(
        Method::POST,
        "/v1/files/rename",
        full(r#"{"from":"/tmp/x","to":"/tmp/../../y"}"#),
        400,
        "invalid_path",
    )
    .await;
    c.expect_error(
        Method::GET,
        "/v1/files/stat",
        empty(),
        400,
        "invalid_request",
    )
    .await;
    c.expect_error(
        Method::GET,
        "/v1/files/stat?path=/tmp&user=Bad!",
        empty(),
        400,
        "invalid_request",
    )
    .await;
}

#[tokio::test]
async fn operations_run_with_the_users_permissions() {
    let agent = Agent::start();
    let c = agent.connect().await;
    // A root-only directory (like /root) with a secret in it.
    let private = agent.dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(private.join("secret"), "s3cret").unwrap();
    let secret = q(private.join("secret").to_str().unwrap());
    let (s, _, body) = c
        .call(Method::GET, &format!("/v1/files?path={secret}"), empty())
        .await;
    assert_eq!((s, &body[..]), (StatusCode::OK, &b"s3cret"[..]));
    c.expect_error(
        Method::GET,
        &format!("/v1/files?path={secret}&user=nobody"),
        empty(),
        403,
        "permission_denied",
    )
    .await;
    c.expect_error(
        Method::GET,
        &format!("/v1/files/stat?path={secret}&user=nobody"),
        empty(),
        403,
        "permission_denied",
    )
    .await;
    c.expect_error(
        Method::PUT,
        &format!(
            "/v1/files?path={}/new&user=nobody",
            q(private.to_str().unwrap())
        ),
        full("x"),
        403,
        "permission_denied",
    )
    .await;
    c.expect_error(
        Method::DELETE,
        &format!("/v1/files?path={secret}&user=nobody"),
        empty(),
        403,
        "permission_denied",
    )
    .await;
    c.expect_error(
        Method::GET,
        "/v1/files?path=/root/.bashrc&user=nobody",
        empty(),
        403,
        "permission_denied",
    )
    .await;

    // Files nobody writes are owned by nobody; the daemon's own threads stay root.
    let shared = agent.dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (s, st) = c
        .json::<FileStat>(
            Method::POST,
            "/v1/files/mkdir",
            &serde_json::json!({"path": format!("{}/n/d", shared.display()), "user": "nobody"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(st.uid, 65534);
    let (s, _, body) = c
        .call(
            Method::PUT,
            &format!(
                "/v1/files?path={}/n/f&user=nobody",
                q(shared.to_str().unwrap())
            ),
            full("hi"),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let st: FileStat = serde_json::from_slice(&body).unwrap();
    assert_eq!((st.uid, st.gid), (65534, 65534));
    assert_eq!(
        st.owner.as_deref(),
        Some("nobody"),
        "names from /etc/passwd"
    );
    let (s, _, _) = c
        .call(Method::GET, &format!("/v1/files?path={secret}"), empty())
        .await;
    assert_eq!(
        s,
        StatusCode::OK,
        "root access restored after acting as nobody"
    );

    // Processes run as the user too.
    let mut spec =
        space_core::process::ProcessSpec::argv(["cat", private.join("secret").to_str().unwrap()]);
    spec.user = Some("nobody".into());
    spec.cwd = Some("/".into());
    let run = c.run(&spec).await;
    assert_eq!(run.exit, exited(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("Permission denied"));
}

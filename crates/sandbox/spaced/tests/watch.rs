//! Directory watches against a real agent: every change kind, recursion into new
//! subdirectories, rename pairing (inside, out of and into the tree), the end of the stream
//! when the watched directory goes, errors before the stream, and the bounds.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use space_core::files::watch::{FileChange, WatchEvent};
use space_core::files::FileKind;
use space_guest_proto::limits::{MAX_WATCHED_DIRS, MAX_WATCH_STREAMS};
use space_guest_proto::{routes, Activity};

/// A watch stream being read line by line.
struct Watching {
    body: Incoming,
    buf: Vec<u8>,
    last_seq: u64,
}

/// How long one event may take to arrive before a test fails (generous: never a timing test).
const EVENT_WAIT: Duration = Duration::from_secs(20);

impl Watching {
    /// The next event, or `None` when the stream ended.
    async fn next(&mut self) -> Option<WatchEvent> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let ev: WatchEvent = serde_json::from_slice(&line[..pos])
                    .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&line)));
                assert_eq!(ev.seq(), self.last_seq + 1, "sequence numbers count up");
                self.last_seq = ev.seq();
                return Some(ev);
            }
            let frame = tokio::time::timeout(EVENT_WAIT, self.body.frame())
                .await
                .expect("no watch event in time");
            match frame {
                None => {
                    assert!(self.buf.is_empty(), "stream ended inside a line");
                    return None;
                }
                Some(f) => {
                    if let Ok(d) = f.expect("watch stream failed").into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
            }
        }
    }

    /// Reads until a change of `name` of kind `change`; returns it and every change before.
    async fn until(&mut self, name: &str, change: FileChange) -> Vec<WatchEvent> {
        let mut seen = Vec::new();
        loop {
            let ev = self
                .next()
                .await
                .unwrap_or_else(|| panic!("stream ended before {name} {change:?}: {seen:#?}"));
            let hit = matches!(&ev, WatchEvent::Change { name: n, change: c, .. } if n == name && *c == change);
            seen.push(ev);
            if hit {
                return seen;
            }
        }
    }
}

fn changes(evs: &[WatchEvent]) -> Vec<(String, FileChange)> {
    evs.iter()
        .filter_map(|e| match e {
            WatchEvent::Change { name, change, .. } => Some((name.clone(), *change)),
            _ => None,
        })
        .collect()
}

fn watch_url(path: &Path, recursive: bool, user: Option<&str>) -> String {
    let mut url = format!(
        "{}?path={}&recursive={recursive}",
        routes::FILES_WATCH,
        q(path.to_str().unwrap())
    );
    if let Some(u) = user {
        url.push_str(&format!("&user={u}"));
    }
    url
}

/// Opens a watch and reads its `started`.
async fn watch(c: &Client, path: &Path, recursive: bool) -> Watching {
    let resp = c
        .request(Method::GET, &watch_url(path, recursive, None), empty())
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let mut w = Watching {
        body: resp.into_body(),
        buf: Vec::new(),
        last_seq: 0,
    };
    assert_eq!(w.next().await, Some(WatchEvent::Started { seq: 1 }));
    w
}

#[tokio::test]
async fn every_change_kind_is_reported_with_the_entry() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let dir = agent.dir.path().join("w");
    std::fs::create_dir(&dir).unwrap();
    let mut w = watch(&c, &dir, false).await;

    std::fs::write(dir.join("a.txt"), "hello").unwrap();
    let evs = w.until("a.txt", FileChange::Write).await;
    let WatchEvent::Change {
        change: FileChange::Create,
        stat: Some(st),
        ..
    } = &evs[0]
    else {
        panic!("create first: {evs:#?}")
    };
    assert_eq!(st.kind, FileKind::File);
    assert_eq!(st.path, dir.join("a.txt").to_str().unwrap());
    let WatchEvent::Change { stat: Some(st), .. } = evs.last().unwrap() else {
        panic!("{evs:#?}")
    };
    assert_eq!(st.size, 5, "the stat is taken after the write");

    std::fs::set_permissions(dir.join("a.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let evs = w.until("a.txt", FileChange::Chmod).await;
    let WatchEvent::Change { stat: Some(st), .. } = evs.last().unwrap() else {
        panic!("{evs:#?}")
    };
    assert_eq!(st.mode, 0o600);

    std::fs::rename(dir.join("a.txt"), dir.join("b.txt")).unwrap();
    let evs = w.until("b.txt", FileChange::Create).await;
    assert_eq!(
        changes(&evs),
        vec![
            ("a.txt".into(), FileChange::Rename),
            ("b.txt".into(), FileChange::Create)
        ],
        "a rename is the old name's rename, then the new name's create"
    );
    assert!(matches!(&evs[0], WatchEvent::Change { stat: None, .. }));

    std::fs::remove_file(dir.join("b.txt")).unwrap();
    let evs = w.until("b.txt", FileChange::Remove).await;
    assert_eq!(changes(&evs), vec![("b.txt".into(), FileChange::Remove)]);
    assert!(matches!(&evs[0], WatchEvent::Change { stat: None, .. }));

    // Without recursion a new directory is reported, what happens inside it is not.
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/inner"), "x").unwrap();
    std::fs::write(dir.join("marker"), "").unwrap();
    let evs = w.until("marker", FileChange::Create).await;
    assert_eq!(
        changes(&evs),
        vec![
            ("sub".into(), FileChange::Create),
            ("marker".into(), FileChange::Create)
        ]
    );
    let WatchEvent::Change { stat: Some(st), .. } = &evs[0] else {
        panic!("{evs:#?}")
    };
    assert_eq!(st.kind, FileKind::Dir);
}

#[tokio::test]
async fn recursion_follows_existing_and_new_subdirectories() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let dir = agent.dir.path().join("w");
    std::fs::create_dir_all(dir.join("old/deep")).unwrap();
    let mut w = watch(&c, &dir, true).await;

    std::fs::write(dir.join("old/deep/f"), "1").unwrap();
    w.until("old/deep/f", FileChange::Write).await;

    // A new tree, made faster than the watch can follow (the agent is stopped meanwhile, so
    // every entry predates its directory's watch): its entries are still reported, a file
    // with content with its write.
    let pid = agent.pid() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::fs::create_dir_all(dir.join("new/a/b")).unwrap();
    std::fs::write(dir.join("new/a/b/file"), "x").unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let evs = w.until("new/a/b/file", FileChange::Write).await;
    let seen = changes(&evs);
    for expected in ["new", "new/a", "new/a/b", "new/a/b/file"] {
        assert!(
            seen.contains(&(expected.to_owned(), FileChange::Create)),
            "{expected}: {seen:?}"
        );
    }
    // And from now on it is watched.
    std::fs::write(dir.join("new/a/b/later"), "y").unwrap();
    w.until("new/a/b/later", FileChange::Write).await;
}

#[tokio::test]
async fn renames_pair_inside_the_tree_and_stop_at_its_edge() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let dir = agent.dir.path().join("w");
    let outside = agent.dir.path().join("outside");
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    std::fs::create_dir_all(outside.join("incoming/x")).unwrap();
    let mut w = watch(&c, &dir, true).await;

    // Inside the tree: the subtree's watches follow the move.
    std::fs::rename(dir.join("a"), dir.join("z")).unwrap();
    let evs = w.until("z", FileChange::Create).await;
    assert_eq!(
        changes(&evs),
        vec![
            ("a".into(), FileChange::Rename),
            ("z".into(), FileChange::Create)
        ]
    );
    std::fs::write(dir.join("z/b/f"), "1").unwrap();
    w.until("z/b/f", FileChange::Write).await;

    // Out of the tree: a rename, and nothing more from there.
    std::fs::rename(dir.join("z"), outside.join("gone")).unwrap();
    let evs = w.until("z", FileChange::Rename).await;
    assert_eq!(changes(&evs), vec![("z".into(), FileChange::Rename)]);
    std::fs::write(outside.join("gone/b/f"), "2").unwrap();

    // Into the tree: a create, reported once the directory is watched.
    std::fs::rename(outside.join("incoming"), dir.join("in")).unwrap();
    let evs = w.until("in", FileChange::Create).await;
    assert_eq!(
        changes(&evs),
        vec![("in".into(), FileChange::Create)],
        "nothing reported from the directory that left, nor from what moved in"
    );
    std::fs::write(dir.join("in/x/y"), "3").unwrap();
    w.until("in/x/y", FileChange::Write).await;
}

#[tokio::test]
async fn removing_the_watched_directory_ends_the_stream() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let dir = agent.dir.path().join("w");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/f"), "x").unwrap();
    let mut w = watch(&c, &dir, true).await;
    std::fs::remove_dir_all(&dir).unwrap();
    let evs = w.until(".", FileChange::Remove).await;
    let names = changes(&evs);
    assert!(
        names.contains(&("sub".into(), FileChange::Remove)),
        "{names:?}"
    );
    assert!(matches!(
        evs.last(),
        Some(WatchEvent::Change { stat: None, .. })
    ));
    assert_eq!(
        w.next().await,
        None,
        "the stream ends after the root's remove"
    );
}

#[tokio::test]
async fn errors_come_before_the_stream() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let base = agent.dir.path();
    std::fs::write(base.join("file"), "x").unwrap();
    let private = base.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (url, status, code) in [
        (
            watch_url(&base.join("missing"), false, None),
            404,
            "not_found",
        ),
        (
            watch_url(&base.join("file"), false, None),
            400,
            "invalid_path",
        ),
        (
            watch_url(&private, false, Some("nobody")),
            403,
            "permission_denied",
        ),
        (
            watch_url(&private, true, Some("nobody")),
            403,
            "permission_denied",
        ),
        (
            watch_url(Path::new("/tmp/../etc"), false, None),
            400,
            "invalid_path",
        ),
        (watch_url(base, false, Some("Bad!")), 400, "invalid_request"),
        (
            watch_url(base, false, Some("nosuchuser")),
            400,
            "unknown_user",
        ),
        (
            format!("{}?recursive=true", routes::FILES_WATCH),
            400,
            "invalid_request",
        ),
    ] {
        c.expect_error(Method::GET, &url, empty(), status, code)
            .await;
    }
    // A symlink to a directory is not followed.
    std::os::unix::fs::symlink(&private, base.join("link")).unwrap();
    c.expect_error(
        Method::GET,
        &watch_url(&base.join("link"), false, None),
        empty(),
        400,
        "invalid_path",
    )
    .await;
    // A subdirectory the user cannot read is skipped, not an error.
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::create_dir(open.join("closed")).unwrap();
    std::fs::set_permissions(open.join("closed"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let resp = c
        .request(
            Method::GET,
            &watch_url(&open, true, Some("nobody")),
            empty(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_tree_too_big_to_watch_is_refused() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let dir = agent.dir.path().join("big");
    for i in 0..MAX_WATCHED_DIRS {
        std::fs::create_dir_all(dir.join(format!("{}/{i}", i % 64))).unwrap();
    }
    // 4096 leaves + 64 parents + the root: more than the bound.
    let msg = c
        .expect_error(
            Method::GET,
            &watch_url(&dir, true, None),
            empty(),
            429,
            "too_many_requests",
        )
        .await;
    assert!(msg.contains("directories"), "{msg}");
    // The same tree without recursion is one directory.
    let mut w = watch(&c, &dir, false).await;
    std::fs::write(dir.join("f"), "").unwrap();
    w.until("f", FileChange::Create).await;
}

#[tokio::test]
async fn streams_are_bounded_and_freed_when_the_reader_goes() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let dir = agent.dir.path().join("w");
    std::fs::create_dir(&dir).unwrap();
    let (_, before) = c.get::<Activity>(routes::ACTIVITY).await;
    let mut open = Vec::new();
    for _ in 0..MAX_WATCH_STREAMS {
        open.push(watch(&c, &dir, false).await);
    }
    c.expect_error(
        Method::GET,
        &watch_url(&dir, false, None),
        empty(),
        429,
        "too_many_requests",
    )
    .await;
    // Changes while watched are not requests: only each watch's own request counted.
    std::fs::write(dir.join("f"), "x").unwrap();
    for w in open.iter_mut() {
        w.until("f", FileChange::Write).await;
    }
    let (_, after) = c.get::<Activity>(routes::ACTIVITY).await;
    assert_eq!(
        after.api_requests - before.api_requests,
        MAX_WATCH_STREAMS as u64 + 1,
        "each watch counts once (plus the refused one)"
    );
    // A reader that goes away frees its stream.
    drop(open.pop());
    let mut freed = false;
    for _ in 0..100 {
        let resp = c
            .request(Method::GET, &watch_url(&dir, false, None), empty())
            .await;
        if resp.status() == StatusCode::OK {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the dropped watch's slot was not freed");
}

#[tokio::test]
async fn a_reader_that_falls_behind_gets_overflow_and_the_stream_goes_on() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let dir = agent.dir.path().join("w");
    std::fs::create_dir(&dir).unwrap();
    let mut w = watch(&c, &dir, false).await;
    // Far more changes than the queue and the stream windows hold, while nobody reads.
    for i in 0..6000 {
        std::fs::File::create(dir.join(format!("f{i}"))).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::write(dir.join("after"), "").unwrap();
    let evs = w.until("after", FileChange::Create).await;
    let overflows = evs
        .iter()
        .filter(|e| matches!(e, WatchEvent::Overflow { .. }))
        .count();
    assert!(overflows >= 1, "no overflow among {} events", evs.len());
    assert!(
        evs.len() < 6000,
        "changes beyond the queue were dropped, not buffered: {}",
        evs.len()
    );
}

//! Directory watches on a real VM through the native API: the changes a shell in the
//! sandbox makes arrive in order with names relative to the watched directory, a new
//! subdirectory is followed, entries carry their owner's names (also after the guest's
//! accounts change), errors come before the stream, and removing the directory ends it.

use futures::StreamExt;
use space_core::files::watch::{FileChange, WatchEvent, WatchRequest};
use space_core::files::FileKind;
use space_core::ErrorCode;
use test_support::{api_error, shell, test_sandbox, TestServer};

fn change(ev: &WatchEvent) -> Option<(&str, FileChange)> {
    match ev {
        WatchEvent::Change { name, change, .. } => Some((name.as_str(), *change)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_a_directory_in_a_vm() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = test_sandbox(c).await;
    shell(c, &id, "mkdir -p w/old", false).await;
    // Relative to the default user's home, like every file path.
    let req = WatchRequest {
        path: "w".into(),
        recursive: true,
        user: None,
    };
    let mut events = c.watch(&id, &req).await.expect("watch");
    let first = events.next().await.expect("started").expect("started");
    assert_eq!(first, WatchEvent::Started { seq: 1 });

    shell(
        c,
        &id,
        "echo hi > w/a.txt; mkdir w/new; echo x > w/new/f; echo y > w/old/g; \
         mv w/a.txt w/b.txt; chmod 600 w/b.txt; rm w/b.txt",
        false,
    )
    .await;
    let mut seen = Vec::new();
    while let Some(ev) = events.next().await {
        let ev = ev.expect("event");
        let done = change(&ev) == Some(("b.txt", FileChange::Remove));
        seen.push(ev);
        if done {
            break;
        }
    }
    let changes: Vec<(&str, FileChange)> = seen.iter().filter_map(change).collect();
    // In order, whatever else is reported in between.
    let expected = [
        ("a.txt", FileChange::Create),
        ("a.txt", FileChange::Write),
        ("new", FileChange::Create),
        ("new/f", FileChange::Create),
        ("old/g", FileChange::Create),
        ("a.txt", FileChange::Rename),
        ("b.txt", FileChange::Create),
        ("b.txt", FileChange::Chmod),
        ("b.txt", FileChange::Remove),
    ];
    let mut rest = changes.iter();
    for want in expected {
        assert!(
            rest.any(|c| *c == want),
            "{want:?} missing or out of order in {changes:?}"
        );
    }
    let stat = seen.iter().find_map(|ev| match ev {
        WatchEvent::Change {
            name,
            stat: Some(st),
            ..
        } if name == "new" => Some(st.clone()),
        _ => None,
    });
    let stat = stat.expect("the new directory's stat");
    assert_eq!((stat.kind, stat.uid), (FileKind::Dir, 1000));
    assert_eq!(
        stat.owner.as_deref(),
        Some("user"),
        "named from the guest's /etc/passwd"
    );
    assert_eq!(stat.path, "/home/user/w/new");

    // Errors come before any stream.
    for (path, user, status, code) in [
        ("/root", None, 403, ErrorCode::PermissionDenied),
        ("missing", None, 404, ErrorCode::NotFound),
        ("w/old/g", None, 400, ErrorCode::InvalidPath),
        ("../etc", None, 400, ErrorCode::InvalidPath),
        ("/root", Some("nosuchuser"), 400, ErrorCode::UnknownUser),
    ] {
        let req = WatchRequest {
            path: path.into(),
            recursive: false,
            user: user.map(Into::into),
        };
        let (s, c, msg) = api_error(c.watch(&id, &req).await.map(|_| ()));
        assert_eq!((s, c), (status, code), "{path}: {msg}");
    }

    // Owner names follow the guest's accounts as they change.
    shell(
        c,
        &id,
        "echo 'agent:x:1001:1001::/:/bin/sh' >> /etc/passwd && cd /home/user/w && touch owned && chown 1001 owned",
        true,
    )
    .await;
    let owned = c.stat(&id, "/home/user/w/owned", None).await.expect("stat");
    assert_eq!(owned.owner.as_deref(), Some("agent"));
    assert_eq!(owned.group.as_deref(), Some("root"));

    // Removing the watched directory ends the stream, after its own remove.
    shell(c, &id, "rm -r w", false).await;
    let rest: Vec<WatchEvent> = events.map(|e| e.expect("event")).collect().await;
    assert_eq!(
        rest.iter().filter_map(change).next_back(),
        Some((".", FileChange::Remove)),
        "{rest:?}"
    );
    ts.stop().await;
}

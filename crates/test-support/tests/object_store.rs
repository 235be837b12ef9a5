//! The object store against a real S3-compatible server (Garage, installed by
//! `./scripts/test`): objects small and multipart go up and come back verified; an object
//! changed in the bucket behind SPACE's back is refused on the way down and leaves no
//! file; an upload survives the server being killed and restarted under it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use space_objects::{ObjectKey, Objects, ObjectsError};
use test_support::s3::Garage;
use tokio::io::{AsyncRead, ReadBuf};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_round_trip_verified_and_a_changed_one_is_refused() {
    // The run's shared server when there is one, else a server of this test's own.
    let mut own = None;
    let bucket =
        test_support::s3::shared_bucket().unwrap_or_else(|| own.insert(Garage::start()).bucket());
    let objects = Objects::open(&bucket).expect("open");
    let dir = tempfile::tempdir().expect("dir");
    for (name, len) in [("small", 1000usize), ("large", 20 * 1024 * 1024 + 17)] {
        let data = pattern(len, 7);
        let src = dir.path().join(name);
        std::fs::write(&src, &data).expect("write");
        let key = ObjectKey::snapshot_artifact("snp-test", name).expect("key");
        let art = objects.put_file(&key, &src).await.expect("upload");
        assert_eq!(art.size, len as u64);
        objects.check(&art).await.expect("stored");
        let back = dir.path().join(format!("{name}.back"));
        objects.get_to_file(&art, &back).await.expect("download");
        assert_eq!(std::fs::read(&back).expect("read"), data, "{name}");
    }

    // Replaced in the bucket by someone else: same size, other bytes; then shorter.
    let key = ObjectKey::snapshot_artifact("snp-test", "state").expect("key");
    let art = objects
        .put_bytes(&key, Bytes::from(pattern(4096, 1)))
        .await
        .expect("upload");
    let out = dir.path().join("state");
    for (what, replacement) in [
        ("changed", pattern(4096, 2)),
        ("truncated", pattern(100, 1)),
    ] {
        objects
            .put_bytes(&key, Bytes::from(replacement))
            .await
            .expect("overwrite");
        let err = objects.get_to_file(&art, &out).await.expect_err(what);
        assert!(matches!(err, ObjectsError::Corrupt { .. }), "{what}: {err}");
        assert!(!out.exists(), "{what}: nothing kept");
    }
    assert!(objects.check(&art).await.is_err(), "the size differs now");
    objects.delete(&key).await.expect("delete");
    assert!(objects
        .get_to_file(&art, &out)
        .await
        .expect_err("gone")
        .is_not_found());
}

/// A reader that yields `total` bytes slowly, so an upload is still running when the test
/// restarts the server.
struct Slow {
    left: usize,
    delay: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl AsyncRead for Slow {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.left == 0 {
            return Poll::Ready(Ok(()));
        }
        let delay = self
            .delay
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(100))));
        if delay.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.delay = None;
        let n = buf.remaining().min(self.left).min(1024 * 1024);
        buf.put_slice(&vec![0xa5; n]);
        self.left -= n;
        Poll::Ready(Ok(()))
    }
}

use std::future::Future as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_survives_the_server_restarting_under_it() {
    let mut garage = Garage::start();
    let objects = Objects::open(&garage.bucket()).expect("open");
    let total = 40 * 1024 * 1024;
    let key = ObjectKey::snapshot_artifact("snp-restart", "memory").expect("key");
    let upload = {
        let (objects, key) = (objects.clone(), key.clone());
        tokio::spawn(async move {
            objects
                .put_reader(
                    &key,
                    Slow {
                        left: total,
                        delay: None,
                    },
                )
                .await
        })
    };
    // Parts are on their way: kill the server and bring it back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!upload.is_finished(), "the upload is still running");
    garage.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    garage.restart();
    let art = tokio::time::timeout(Duration::from_secs(240), upload)
        .await
        .expect("the upload finishes")
        .expect("task")
        .expect("the upload retried and completed");
    assert_eq!(art.size, total as u64);
    let dir = tempfile::tempdir().expect("dir");
    objects
        .get_to_file(&art, &dir.path().join("back"))
        .await
        .expect("verified download");
}

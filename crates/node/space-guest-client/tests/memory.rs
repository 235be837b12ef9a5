//! Memory stays bounded when a hostile guest offers unbounded data. A counting global
//! allocator records the peak of live heap bytes in this test binary, which holds only
//! this one test so nothing else allocates meanwhile.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{fake_guest, guard, send_all, serve_h2};
use futures::StreamExt;
use space_guest_client::{GuestClient, GuestError};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MIB: usize = 1024 * 1024;

/// Peak live bytes above the level at the start, while `fut` runs.
async fn peak_during<T>(fut: impl std::future::Future<Output = T>) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = fut.await;
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

#[tokio::test]
async fn unbounded_answers_use_bounded_memory() {
    // The guest answers every request with 100 MiB: a JSON call gets it as one body, the
    // output stream as one endless NDJSON line.
    let guest = fake_guest(|io| {
        serve_h2(io, |_req, mut respond| async move {
            let resp = http::Response::builder().status(200).body(()).unwrap();
            let Ok(mut s) = respond.send_response(resp, false) else {
                return;
            };
            // Allocated once and shared, so the peer itself adds little to the count.
            let chunk = Bytes::from(vec![b'A'; MIB]);
            for _ in 0..100 {
                if !send_all(&mut s, chunk.clone(), false).await {
                    return;
                }
            }
        })
    });
    let client = guard(GuestClient::connect(&guest.sock, Duration::from_secs(30)))
        .await
        .unwrap();

    let (err, peak) = peak_during(guard(client.health())).await;
    let err = err.unwrap_err();
    assert!(matches!(err, GuestError::Protocol(_)), "{err:?}");
    assert!(
        peak < 16 * MIB,
        "JSON call peaked at {} MiB for a 100 MiB answer",
        peak / MIB
    );

    let (last, peak) = peak_during(guard(async {
        let mut events = client.output(1, None).await.unwrap();
        let mut last = None;
        while let Some(ev) = events.next().await {
            last = Some(ev);
        }
        last
    }))
    .await;
    assert!(
        matches!(last, Some(Err(GuestError::Protocol(_)))),
        "{last:?}"
    );
    assert!(
        peak < 16 * MIB,
        "output stream peaked at {} MiB for an endless line",
        peak / MIB
    );

    // Several at once: each is bounded by its own limit and the connection window.
    let (results, peak) = peak_during(guard(futures::future::join_all(
        (0..8).map(|_| client.health()),
    )))
    .await;
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(GuestError::Protocol(_)))));
    assert!(
        peak < 48 * MIB,
        "8 parallel calls peaked at {} MiB",
        peak / MIB
    );
}

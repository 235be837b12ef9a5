//! One at a time per key: concurrent fetches of one template, kernel bundle or stored
//! snapshot on a node wait for the first, then find its result in place (a burst of
//! creates of one template is one download and one installation).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// Per-key async locks; an entry lives only while someone holds or waits for it.
#[derive(Default)]
pub(crate) struct Coalesce {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Coalesce {
    /// Runs `work` while holding `key`'s lock: callers with one key run one after the
    /// other, so each after the first finds what the first made (and should look for it
    /// first). Callers with other keys are not held up.
    pub(crate) async fn run<T>(&self, key: &str, work: impl Future<Output = T>) -> T {
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_owned())
            .or_default()
            .clone();
        let out = {
            let _one = lock.lock().await;
            work.await
        };
        drop(lock);
        let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Dropped once nobody holds or waits on it (the map holds one reference).
        if map.get(key).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(key);
        }
        out
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn one_key_runs_one_at_a_time_and_leaves_nothing_behind() {
        let c = Arc::new(Coalesce::default());
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (c, running, most) = (c.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    c.run("k", async {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(c.len(), 0);
    }

    #[tokio::test]
    async fn other_keys_do_not_wait() {
        let c = Coalesce::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // "a" waits for "b", which could never run if keys shared one lock.
        let a = c.run("a", async { rx.await.is_ok() });
        let b = c.run("b", async { tx.send(()).is_ok() });
        let (a, b) = tokio::join!(a, b);
        assert!(a && b);
    }
}

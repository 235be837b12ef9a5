//! Resource-use metrics of running sandboxes. A sampler task asks every *running* sandbox's
//! daemon for its counters every `NodeConfig::metrics_interval` (a paused sandbox is never
//! woken for it, and one with an operation under way is skipped that round) and keeps the
//! last [`MAX_METRIC_SAMPLES`] per sandbox, in memory; a sandbox's samples go when it is
//! deleted. [`Node::metrics`] returns them.
//!
//! CPU use is the share of busy ticks between two consecutive samples ([`metric`], pure);
//! the first sample of a sandbox (and the first after its counters went back, as after a
//! rollback) measures since the guest's boot.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use space_core::metrics::SandboxMetric;
use space_core::{SandboxId, SandboxState};
use space_guest_proto::GuestMetrics;

use crate::sandbox_manager::now_ms;
use crate::{Node, NodeError};

/// Samples kept per sandbox (an hour at the default interval).
pub const MAX_METRIC_SAMPLES: usize = 720;
/// How often running sandboxes are sampled by default.
pub const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(5);

/// The sample `cur` makes after `prev` (the previous reading of the same guest, if any).
pub fn metric(prev: Option<&GuestMetrics>, cur: &GuestMetrics, timestamp_ms: i64) -> SandboxMetric {
    // Counters that went back belong to another run of the guest: measure since its boot.
    let base = prev
        .filter(|p| {
            p.cpu_total_ticks <= cur.cpu_total_ticks && p.cpu_busy_ticks <= cur.cpu_busy_ticks
        })
        .map_or((0, 0), |p| (p.cpu_busy_ticks, p.cpu_total_ticks));
    let busy = cur.cpu_busy_ticks - base.0;
    let total = cur.cpu_total_ticks - base.1;
    let cpu_used_pct = if total == 0 {
        0.0
    } else {
        (busy as f64 * 100.0 / total as f64).clamp(0.0, 100.0)
    };
    SandboxMetric {
        timestamp_ms,
        cpu_count: cur.cpu_count,
        cpu_used_pct,
        mem_total: cur.mem_total_bytes,
        mem_used: cur.mem_total_bytes.saturating_sub(cur.mem_available_bytes),
        mem_cache: cur.mem_cache_bytes,
        disk_total: cur.disk_total_bytes,
        disk_used: cur.disk_used_bytes,
    }
}

/// The samples of one sandbox and the reading the next one is measured from.
#[derive(Debug, Default)]
struct Ring {
    last: Option<GuestMetrics>,
    samples: VecDeque<SandboxMetric>,
}

/// Every sandbox's samples.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    rings: Mutex<HashMap<SandboxId, Ring>>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Ring>> {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a reading of `id`'s guest taken at `now_ms`.
    pub(crate) fn record(&self, id: &SandboxId, reading: GuestMetrics, now_ms: i64) {
        let mut rings = self.lock();
        let ring = rings.entry(id.clone()).or_default();
        let sample = metric(ring.last.as_ref(), &reading, now_ms);
        ring.last = Some(reading);
        ring.samples.push_back(sample);
        while ring.samples.len() > MAX_METRIC_SAMPLES {
            ring.samples.pop_front();
        }
    }

    /// `id`'s samples, oldest first.
    pub(crate) fn samples(&self, id: &SandboxId) -> Vec<SandboxMetric> {
        self.lock()
            .get(id)
            .map(|r| r.samples.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Drops `id`'s samples.
    pub(crate) fn forget(&self, id: &SandboxId) {
        self.lock().remove(id);
    }

    /// Drops the samples of every sandbox not in `live`.
    fn forget_except(&self, live: &HashSet<SandboxId>) {
        self.lock().retain(|id, _| live.contains(id));
    }
}

impl Node {
    /// Starts the sampler task.
    pub(crate) fn start_metrics(&self) {
        let weak = Arc::downgrade(&self.inner);
        let interval = self.inner.cfg.metrics_interval;
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Node { inner }.sample_metrics_once(interval).await;
            }
        });
        self.inner
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task.abort_handle());
    }

    /// Samples every running sandbox once; a daemon that does not answer within `limit`
    /// is skipped this time.
    async fn sample_metrics_once(&self, limit: Duration) {
        let running: Vec<SandboxId> = self
            .sandboxes()
            .into_iter()
            .filter(|r| r.state == SandboxState::Running)
            .map(|r| r.id)
            .collect();
        let work = running.into_iter().map(|id| async move {
            // An operation under way (a pause parks the channel, a snapshot freezes) has the
            // sandbox to itself: skip it this round. Holding the lock while sampling keeps
            // the next one from starting mid-sample.
            let Ok(op) = self.op_lock(&id) else { return };
            let Ok(_op) = op.try_lock() else { return };
            // `guest`, not `guest_waking`: sampling never resumes a paused sandbox.
            let Ok(guest) = self.guest(&id) else { return };
            match tokio::time::timeout(limit, guest.metrics()).await {
                Ok(Ok(reading)) => self.inner.metrics.record(&id, reading, now_ms()),
                Ok(Err(e)) => tracing::debug!(%id, error = %e, "metrics sample failed"),
                Err(_) => tracing::debug!(%id, "metrics sample timed out"),
            }
        });
        futures::future::join_all(work).await;
        let live: HashSet<SandboxId> = self
            .sandboxes()
            .into_iter()
            .filter(|r| r.state != SandboxState::Deleted)
            .map(|r| r.id)
            .collect();
        self.inner.metrics.forget_except(&live);
    }

    /// The sandbox's resource-use samples, oldest first (the last [`MAX_METRIC_SAMPLES`],
    /// taken while it ran).
    pub fn metrics(&self, id: &SandboxId) -> Result<Vec<SandboxMetric>, NodeError> {
        match self.sandbox(id) {
            Some(r) if r.state != SandboxState::Deleted => Ok(self.inner.metrics.samples(id)),
            _ => Err(NodeError::SandboxNotFound(id.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(busy: u64, total: u64) -> GuestMetrics {
        GuestMetrics {
            cpu_count: 2,
            cpu_busy_ticks: busy,
            cpu_total_ticks: total,
            mem_total_bytes: 512 << 20,
            mem_available_bytes: 400 << 20,
            mem_cache_bytes: 50 << 20,
            disk_total_bytes: 4 << 30,
            disk_used_bytes: 1 << 30,
        }
    }

    #[test]
    fn cpu_use_comes_from_consecutive_readings() {
        let first = metric(None, &reading(100, 1000), 5);
        assert_eq!(first.cpu_used_pct, 10.0, "since boot");
        assert_eq!(
            (first.mem_used, first.mem_cache, first.cpu_count),
            (112 << 20, 50 << 20, 2)
        );
        assert_eq!(
            (first.disk_total, first.disk_used, first.timestamp_ms),
            (4 << 30, 1 << 30, 5)
        );
        let next = metric(Some(&reading(100, 1000)), &reading(250, 1200), 10);
        assert_eq!(next.cpu_used_pct, 75.0);
        let idle = metric(Some(&reading(250, 1200)), &reading(250, 1200), 15);
        assert_eq!(idle.cpu_used_pct, 0.0, "no ticks: nothing to divide");
        // Counters that went back (a rollback): since boot again.
        let after = metric(Some(&reading(250, 1200)), &reading(30, 100), 20);
        assert_eq!(after.cpu_used_pct, 30.0);
    }

    #[test]
    fn rings_are_bounded_and_forgotten() {
        let m = Metrics::default();
        let (a, b) = (SandboxId::generate(), SandboxId::generate());
        for i in 0..(MAX_METRIC_SAMPLES as u64 + 10) {
            m.record(&a, reading(i, 10 * i + 10), i as i64);
        }
        m.record(&b, reading(1, 10), 0);
        let samples = m.samples(&a);
        assert_eq!(samples.len(), MAX_METRIC_SAMPLES);
        assert_eq!(samples[0].timestamp_ms, 10, "the oldest went first");
        assert!(samples
            .windows(2)
            .all(|w| w[0].timestamp_ms < w[1].timestamp_ms));
        m.forget(&a);
        assert!(m.samples(&a).is_empty());
        m.forget_except(&HashSet::new());
        assert!(m.samples(&b).is_empty());
    }
}

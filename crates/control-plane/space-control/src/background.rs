//! Periodic work of a replica (the heartbeat, the sweeps, the reconciler) until shutdown.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Runs `pass` every `interval` (a late tick is not caught up: the next waits a whole
/// interval) until `stop` turns true; a pass is never cut short by the stop.
pub fn every<F, Fut>(
    interval: Duration,
    mut stop: watch::Receiver<bool>,
    mut pass: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                // A dropped sender is a stop too: `changed` would return at once, forever,
                // and the pass would run in a hot loop.
                changed = stop.changed() => if changed.is_err() { break; },
            }
            if *stop.borrow() {
                break;
            }
            pass().await;
        }
    })
}

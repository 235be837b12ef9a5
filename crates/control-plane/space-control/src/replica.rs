//! This process as one replica of the control plane.
//!
//! Any number of `space server` processes serve one database; none holds state the others
//! need. Each has a [`ReplicaId`] for as long as it runs, a row it heartbeats every
//! [`HEARTBEAT_INTERVAL`], and names itself in what it claims while it works (a create, an
//! idempotency key, a quota hold): see `db::replicas`. A replica silent for
//! [`REPLICA_TIMEOUT`] is dead and the leader forgets it; its unfinished creates are the
//! reconciler's to finish or undo.
//!
//! Work that one replica does at a time (the reconciler, the sweeps) runs only on the
//! **leader**: the replica holding the database's leader lock ([`Db::try_lead`]: a
//! PostgreSQL advisory lock, released with its connection when the leader dies). Every
//! singleton task asks [`Replica::leads`] before each pass. Leadership is for efficiency
//! and order, not for safety: every action of those passes is a conditional statement in
//! the database, so a pass that overlaps another (a leader that has just lost its lock and
//! does not know yet) changes nothing twice.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

use crate::db::{Db, DbError, LeaderLock, ReplicaId};

/// How often a replica heartbeats (and a replica that does not lead tries to).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// A replica silent this long is dead: what it held passes to the others.
pub const REPLICA_TIMEOUT: Duration = Duration::from_secs(10);

/// This process's replica. Cheap to clone.
#[derive(Clone)]
pub struct Replica {
    id: ReplicaId,
    db: Db,
    timeout: Duration,
    lead: Arc<Mutex<Lead>>,
}

/// The leader lock, if held, and when this replica last tried for it.
struct Lead {
    lock: Option<LeaderLock>,
    last_try: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("id", &self.id).finish()
    }
}

impl Replica {
    /// Registers a new replica on `db`, alive from now.
    pub async fn register(db: Db) -> Result<Replica, DbError> {
        Self::register_with_timeout(db, REPLICA_TIMEOUT).await
    }

    /// The same with another liveness timeout (tests shorten it).
    pub async fn register_with_timeout(db: Db, timeout: Duration) -> Result<Replica, DbError> {
        let id = ReplicaId::generate();
        db.register_replica(&id, &host_name()).await?;
        tracing::info!(replica = %id, "control-plane replica registered");
        Ok(Replica {
            id,
            db,
            timeout,
            lead: Arc::new(Mutex::new(Lead {
                lock: None,
                last_try: None,
            })),
        })
    }

    /// Its id.
    pub fn id(&self) -> &ReplicaId {
        &self.id
    }

    /// How long a replica may be silent before it is dead.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether replica `other` is alive (this one always is).
    pub async fn alive(&self, other: &ReplicaId) -> Result<bool, DbError> {
        if *other == self.id {
            return Ok(true);
        }
        self.db.replica_alive(other, self.timeout).await
    }

    /// The replicas alive now (this one included).
    pub async fn live_set(&self) -> Result<HashSet<ReplicaId>, DbError> {
        let mut live = self.db.live_replicas(self.timeout).await?;
        live.insert(self.id.clone());
        Ok(live)
    }

    /// Whether this replica leads now: it holds the leader lock, checked to be still held;
    /// if it does not, it tries for it (at most once per [`HEARTBEAT_INTERVAL`]).
    pub async fn leads(&self) -> bool {
        let mut lead = self.lead.lock().await;
        if let Some(lock) = lead.lock.as_mut() {
            if lock.still_held().await {
                return true;
            }
            tracing::warn!(replica = %self.id, "lost the leader lock (its connection broke)");
            lead.lock = None;
        }
        let now = tokio::time::Instant::now();
        if lead
            .last_try
            .is_some_and(|t| now.duration_since(t) < HEARTBEAT_INTERVAL)
        {
            return false;
        }
        lead.last_try = Some(now);
        match self.db.try_lead().await {
            Ok(Some(lock)) => {
                tracing::info!(replica = %self.id, "this replica leads (reconciler, sweeps)");
                lead.lock = Some(lock);
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(replica = %self.id, error = %e, "cannot try for the leader lock");
                false
            }
        }
    }

    /// One heartbeat; a replica that was forgotten (it could not reach the database for
    /// longer than the timeout) registers again: what it held has passed to others, and
    /// its creates that were finished or undone meanwhile refuse its late results.
    pub async fn heartbeat(&self) -> Result<(), DbError> {
        if !self.db.heartbeat_replica(&self.id).await? {
            tracing::warn!(replica = %self.id, "this replica had been declared dead; registering again");
            self.db.register_replica(&self.id, &host_name()).await?;
        }
        Ok(())
    }

    /// As leader: forgets the replicas that died.
    pub async fn forget_dead(&self) -> Result<(), DbError> {
        for id in self.db.forget_dead_replicas(self.timeout).await? {
            tracing::warn!(replica = %id, "control-plane replica stopped heartbeating: forgotten, with its holds and unfinished idempotency claims");
        }
        Ok(())
    }

    /// At a graceful shutdown: gives up the lead and removes this replica's row, so the
    /// others need not wait for its heartbeat to lapse.
    pub async fn leave(&self) {
        if let Some(lock) = self.lead.lock().await.lock.take() {
            lock.release().await;
        }
        if let Err(e) = self.db.remove_replica(&self.id).await {
            tracing::warn!(replica = %self.id, error = %e, "could not remove this replica's row; it will be forgotten once its heartbeat lapses");
        }
    }

    /// Heartbeats every [`HEARTBEAT_INTERVAL`] and, as leader, forgets dead replicas,
    /// until `stop` turns true.
    pub fn spawn(self, stop: watch::Receiver<bool>) -> JoinHandle<()> {
        crate::background::every(HEARTBEAT_INTERVAL, stop, move || {
            let replica = self.clone();
            async move {
                if let Err(e) = replica.heartbeat().await {
                    tracing::warn!(replica = %replica.id, error = %e, "replica heartbeat failed; retrying");
                    return;
                }
                if replica.leads().await {
                    if let Err(e) = replica.forget_dead().await {
                        tracing::warn!(error = %e, "forgetting dead replicas failed; retrying");
                    }
                }
            }
        })
    }
}

/// This host's name, for the operator's listing of replicas.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().chars().take(253).collect())
        .unwrap_or_else(|_| "unknown".to_owned())
}

//! Snapshots in object storage, and the sandboxes suspended in them.
//!
//! A suspend's snapshot is a row from before its upload starts: `uploading`, naming the
//! replica that drives it (so a replica that dies leaves a row the leader can collect).
//! It becomes `committed` — restorable — only in [`Db::commit_stored_snapshot`]'s one
//! transaction, which records every artifact (key, size, SHA-256, each checked in the store
//! first), marks the snapshot committed and the sandbox suspended in it; a half-uploaded
//! snapshot is never committed, so never resumed. A snapshot given up is `abandoned`, and
//! its objects collected.
//!
//! While a suspended sandbox resumes, its row names the node and the replica doing it
//! (`node`, `creating_replica`); [`Db::finish_resume`] makes it an ordinary live sandbox
//! again.

use space_core::{SandboxId, SnapshotId, SnapshotInfo, TenantId};
use space_node_proto::{SnapshotOrigin, StoredArtifact, StoredSnapshot};
use sqlx::Row;

use super::{now_ms, Db, DbError, DesiredState, ReplicaId};

/// Where a stored snapshot is in its life.
/// What committing a stored snapshot makes of its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Suspended in it: no node holds the sandbox until it resumes.
    Suspended,
    /// Its stored checkpoint (it runs on): what it is restored from if its node is lost;
    /// the one it replaces is no longer referenced, so collected.
    Checkpoint,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredState {
    /// Its artifacts are going up; not restorable.
    Uploading,
    /// Every artifact stored and checked: restorable.
    Committed,
    /// Given up (the suspend failed, or its replica died): its objects are to be collected.
    Abandoned,
}

impl StoredState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            StoredState::Uploading => "uploading",
            StoredState::Committed => "committed",
            StoredState::Abandoned => "abandoned",
        }
    }

    fn parse(s: &str) -> Result<StoredState, DbError> {
        match s {
            "uploading" => Ok(StoredState::Uploading),
            "committed" => Ok(StoredState::Committed),
            "abandoned" => Ok(StoredState::Abandoned),
            other => Err(corrupt(format!("state {other:?}"))),
        }
    }
}

/// One stored snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSnapshotRow {
    /// Its id.
    pub id: SnapshotId,
    /// The sandbox it is of.
    pub sandbox_id: SandboxId,
    /// Whose it is.
    pub tenant_id: TenantId,
    /// Where it is in its life.
    pub state: StoredState,
    /// The node that took it.
    pub node: String,
    /// The replica driving its upload (while uploading).
    pub replica: Option<ReplicaId>,
    /// What was stored (once committed).
    pub manifest: Option<StoredSnapshot>,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
}

/// A persistent snapshot kept in object storage, as listings and creates see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPersistent {
    /// Its description (`stored` set).
    pub info: SnapshotInfo,
    /// The sandbox it was taken of, as a sandbox made from it inherits it.
    pub origin: SnapshotOrigin,
    /// What is stored.
    pub manifest: StoredSnapshot,
}

fn row_to_persistent(row: &sqlx::any::AnyRow) -> Result<StoredPersistent, DbError> {
    let stored = row_to_stored(row)?;
    let parse = |column: &str| -> Result<String, DbError> {
        row.try_get::<Option<String>, _>(column)?.ok_or_else(|| {
            corrupt(format!(
                "committed persistent snapshot {} without {column}",
                stored.id
            ))
        })
    };
    let mut info: SnapshotInfo = serde_json::from_str(&parse("info")?).map_err(corrupt)?;
    info.stored = true;
    info.persistent = true;
    let origin: SnapshotOrigin = serde_json::from_str(&parse("origin")?).map_err(corrupt)?;
    let manifest = stored.manifest.ok_or_else(|| {
        corrupt(format!(
            "committed snapshot {} without a manifest",
            stored.id
        ))
    })?;
    Ok(StoredPersistent {
        info,
        origin,
        manifest,
    })
}

fn corrupt(reason: impl std::fmt::Display) -> DbError {
    DbError::Corrupt {
        table: "stored_snapshots",
        reason: reason.to_string(),
    }
}

fn row_to_stored(row: &sqlx::any::AnyRow) -> Result<StoredSnapshotRow, DbError> {
    let id: String = row.try_get("id")?;
    let sandbox: String = row.try_get("sandbox_id")?;
    let tenant: String = row.try_get("tenant_id")?;
    let state: String = row.try_get("state")?;
    let manifest: Option<String> = row.try_get("manifest")?;
    Ok(StoredSnapshotRow {
        id: id.parse().map_err(corrupt)?,
        sandbox_id: sandbox.parse().map_err(corrupt)?,
        tenant_id: tenant.parse().map_err(corrupt)?,
        state: StoredState::parse(&state)?,
        node: row.try_get("node")?,
        replica: row
            .try_get::<Option<String>, _>("replica")?
            .map(ReplicaId::from_stored),
        manifest: manifest
            .map(|m| serde_json::from_str(&m).map_err(corrupt))
            .transpose()?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

const COLUMNS: &str = "id, sandbox_id, tenant_id, state, node, replica, manifest, created_at_ms";

impl Db {
    /// How many committed stored snapshots were taken of sandboxes of template `digest`
    /// (their manifests name it: a 64-digit hex digest names nothing else): of every
    /// tenant, or of `tenant` only.
    pub async fn count_stored_using_template(
        &self,
        digest: &str,
        tenant: Option<&TenantId>,
    ) -> Result<i64, DbError> {
        const ALL: &str =
            "SELECT COUNT(*) FROM stored_snapshots WHERE state = $1 AND manifest LIKE $2";
        const OF_ONE: &str = "SELECT COUNT(*) FROM stored_snapshots WHERE state = $1 \
             AND manifest LIKE $2 AND tenant_id = $3";
        let query = sqlx::query_scalar(if tenant.is_some() { OF_ONE } else { ALL })
            .bind(StoredState::Committed.as_str())
            .bind(format!("%{digest}%"));
        let query = match tenant {
            Some(t) => query.bind(t.as_str()),
            None => query,
        };
        let n: i64 = query.fetch_one(self.pool()).await?;
        Ok(n)
    }

    /// Records a suspend's snapshot before its upload starts.
    pub async fn begin_stored_snapshot(
        &self,
        id: &SnapshotId,
        sandbox: &SandboxId,
        tenant: &TenantId,
        node: &str,
        replica: &ReplicaId,
    ) -> Result<(), DbError> {
        sqlx::query("INSERT INTO stored_snapshots (id, sandbox_id, tenant_id, state, node, replica, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(id.as_str())
            .bind(sandbox.as_str())
            .bind(tenant.as_str())
            .bind(StoredState::Uploading.as_str())
            .bind(node)
            .bind(replica.as_str())
            .bind(now_ms())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Commits a snapshot whose every artifact is stored and checked, and marks its
    /// sandbox suspended in it, in one transaction. `false` (nothing changed): the snapshot
    /// is no longer uploading (abandoned meanwhile), or the sandbox is no longer live or is
    /// suspended already.
    pub async fn commit_stored_snapshot(
        &self,
        manifest: &StoredSnapshot,
        commit: Commit,
    ) -> Result<bool, DbError> {
        let json = serde_json::to_string(manifest).map_err(|e| DbError::Invalid(e.to_string()))?;
        let mut tx = self.pool().begin().await?;
        let committed = sqlx::query("UPDATE stored_snapshots SET state = $1, manifest = $2, committed_at_ms = $3, replica = NULL WHERE id = $4 AND sandbox_id = $5 AND state = $6")
            .bind(StoredState::Committed.as_str())
            .bind(&json)
            .bind(now_ms())
            .bind(manifest.snapshot.as_str())
            .bind(manifest.sandbox_id.as_str())
            .bind(StoredState::Uploading.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let sql = match commit {
            Commit::Suspended => "UPDATE sandboxes SET suspended_snapshot = $1 WHERE id = $2 AND desired_state = $3 AND suspended_snapshot IS NULL",
            Commit::Checkpoint => "UPDATE sandboxes SET stored_checkpoint = $1, stored_checkpoint_at_ms = $4 WHERE id = $2 AND desired_state = $3 AND suspended_snapshot IS NULL",
        };
        let mut update = sqlx::query(sql)
            .bind(manifest.snapshot.as_str())
            .bind(manifest.sandbox_id.as_str())
            .bind(DesiredState::Running.as_str());
        if commit == Commit::Checkpoint {
            update = update.bind(now_ms());
        }
        let suspended = update.execute(&mut *tx).await?.rows_affected();
        if committed != 1 || suspended != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        for a in &manifest.artifacts {
            insert_artifact(&mut tx, &manifest.snapshot, a).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Commits a persistent snapshot whose every artifact is stored and checked: from now
    /// on the tenant's until deleted ([`Db::drop_stored_persistent`]), whatever becomes of
    /// its sandbox or node. `false` (nothing changed): it is no longer uploading.
    pub async fn commit_stored_persistent(
        &self,
        manifest: &StoredSnapshot,
        info: &SnapshotInfo,
        origin: &SnapshotOrigin,
    ) -> Result<bool, DbError> {
        let json = |r: serde_json::Result<String>| r.map_err(|e| DbError::Invalid(e.to_string()));
        let manifest_json = json(serde_json::to_string(manifest))?;
        let info_json = json(serde_json::to_string(info))?;
        let origin_json = json(serde_json::to_string(origin))?;
        let mut tx = self.pool().begin().await?;
        let committed = sqlx::query("UPDATE stored_snapshots SET state = $1, manifest = $2, info = $3, origin = $4, persistent = 1, committed_at_ms = $5, replica = NULL WHERE id = $6 AND sandbox_id = $7 AND state = $8")
            .bind(StoredState::Committed.as_str())
            .bind(&manifest_json)
            .bind(&info_json)
            .bind(&origin_json)
            .bind(now_ms())
            .bind(manifest.snapshot.as_str())
            .bind(manifest.sandbox_id.as_str())
            .bind(StoredState::Uploading.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if committed != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        for a in &manifest.artifacts {
            insert_artifact(&mut tx, &manifest.snapshot, a).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// `tenant`'s committed persistent snapshots in object storage, oldest first.
    pub async fn stored_persistents(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<StoredPersistent>, DbError> {
        let sql = format!("SELECT {COLUMNS}, info, origin FROM stored_snapshots WHERE tenant_id = $1 AND persistent = 1 AND state = $2 ORDER BY created_at_ms, id");
        let rows = sqlx::query(&sql)
            .bind(tenant.as_str())
            .bind(StoredState::Committed.as_str())
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(row_to_persistent).collect()
    }

    /// One of `tenant`'s committed persistent snapshots in object storage.
    pub async fn stored_persistent(
        &self,
        tenant: &TenantId,
        id: &SnapshotId,
    ) -> Result<Option<StoredPersistent>, DbError> {
        let sql = format!("SELECT {COLUMNS}, info, origin FROM stored_snapshots WHERE id = $1 AND tenant_id = $2 AND persistent = 1 AND state = $3");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .bind(tenant.as_str())
            .bind(StoredState::Committed.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(row_to_persistent).transpose()
    }

    /// Deletes one of `tenant`'s persistent snapshots in object storage: it is no longer
    /// listed or usable, and its objects are collected. `false` if there was none.
    pub async fn drop_stored_persistent(
        &self,
        tenant: &TenantId,
        id: &SnapshotId,
    ) -> Result<bool, DbError> {
        let done = sqlx::query("UPDATE stored_snapshots SET state = $1 WHERE id = $2 AND tenant_id = $3 AND persistent = 1 AND state = $4")
            .bind(StoredState::Abandoned.as_str())
            .bind(id.as_str())
            .bind(tenant.as_str())
            .bind(StoredState::Committed.as_str())
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives up an uploading snapshot; `false` if it was not uploading.
    /// Sandbox `id`, whose node is lost, becomes suspended in its stored checkpoint (then
    /// resumed like any suspended sandbox); false if it has none, or is suspended,
    /// resuming or deleted meanwhile. Its next checkpoint is due an interval from now.
    pub async fn suspend_in_stored_checkpoint(&self, id: &SandboxId) -> Result<bool, DbError> {
        let done = sqlx::query(
            "UPDATE sandboxes SET suspended_snapshot = stored_checkpoint, stored_checkpoint = NULL, stored_checkpoint_at_ms = $3 \
             WHERE id = $1 AND desired_state = $2 AND suspended_snapshot IS NULL AND stored_checkpoint IS NOT NULL AND creating_replica IS NULL",
        )
        .bind(id.as_str())
        .bind(DesiredState::Running.as_str())
        .bind(now_ms())
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(done == 1)
    }

    pub async fn abandon_stored_snapshot(&self, id: &SnapshotId) -> Result<bool, DbError> {
        let done = sqlx::query(
            "UPDATE stored_snapshots SET state = $1, replica = NULL WHERE id = $2 AND state = $3",
        )
        .bind(StoredState::Abandoned.as_str())
        .bind(id.as_str())
        .bind(StoredState::Uploading.as_str())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// One stored snapshot.
    pub async fn stored_snapshot(
        &self,
        id: &SnapshotId,
    ) -> Result<Option<StoredSnapshotRow>, DbError> {
        let sql = format!("SELECT {COLUMNS} FROM stored_snapshots WHERE id = $1");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(row_to_stored).transpose()
    }

    /// The stored snapshots whose objects are to be collected: abandoned ones (deleted
    /// persistent ones among them), uploading ones whose replica is not among
    /// `live_replicas` (it died mid-upload), and committed ones that are not persistent and
    /// no live sandbox is suspended in or has as its stored checkpoint. At most `limit`.
    pub async fn stored_snapshots_to_collect(
        &self,
        live_replicas: &std::collections::HashSet<ReplicaId>,
        limit: i64,
    ) -> Result<Vec<StoredSnapshotRow>, DbError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM stored_snapshots s WHERE s.state = $1 \
             OR s.state = $2 \
             OR (s.state = $3 AND s.persistent = 0 AND NOT EXISTS (SELECT 1 FROM sandboxes b WHERE (b.suspended_snapshot = s.id OR b.stored_checkpoint = s.id) AND b.desired_state = $4)) \
             ORDER BY s.created_at_ms LIMIT $5"
        );
        let rows = sqlx::query(&sql)
            .bind(StoredState::Abandoned.as_str())
            .bind(StoredState::Uploading.as_str())
            .bind(StoredState::Committed.as_str())
            .bind(DesiredState::Running.as_str())
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        let all: Vec<StoredSnapshotRow> =
            rows.iter().map(row_to_stored).collect::<Result<_, _>>()?;
        Ok(all
            .into_iter()
            .filter(|s| match s.state {
                StoredState::Uploading => !s
                    .replica
                    .as_ref()
                    .is_some_and(|r| live_replicas.contains(r)),
                _ => true,
            })
            .collect())
    }

    /// Whether a replica in `live_replicas` is uploading a snapshot of sandbox `sandbox`.
    pub async fn suspend_under_way(
        &self,
        sandbox: &SandboxId,
        live_replicas: &std::collections::HashSet<ReplicaId>,
    ) -> Result<bool, DbError> {
        let replicas: Vec<Option<String>> = sqlx::query_scalar(
            "SELECT replica FROM stored_snapshots WHERE sandbox_id = $1 AND state = $2",
        )
        .bind(sandbox.as_str())
        .bind(StoredState::Uploading.as_str())
        .fetch_all(self.pool())
        .await?;
        Ok(replicas
            .into_iter()
            .flatten()
            .any(|r| live_replicas.contains(&ReplicaId::from_stored(r))))
    }

    /// Forgets a stored snapshot whose objects are gone (its artifacts with it).
    pub async fn delete_stored_snapshot(&self, id: &SnapshotId) -> Result<(), DbError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("DELETE FROM stored_artifacts WHERE snapshot_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM stored_snapshots WHERE id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A suspended sandbox starts resuming on `node`, driven by `replica`. `false`: it is
    /// not suspended (any more), or another resume of it is under way.
    pub async fn begin_resume(
        &self,
        sandbox: &SandboxId,
        node: &str,
        replica: &ReplicaId,
    ) -> Result<bool, DbError> {
        let done = sqlx::query("UPDATE sandboxes SET node = $1, creating_replica = $2 WHERE id = $3 AND desired_state = $4 AND suspended_snapshot IS NOT NULL AND creating_replica IS NULL")
            .bind(node)
            .bind(replica.as_str())
            .bind(sandbox.as_str())
            .bind(DesiredState::Running.as_str())
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A resume finished: the sandbox is an ordinary live sandbox on its node again.
    pub async fn finish_resume(&self, sandbox: &SandboxId) -> Result<bool, DbError> {
        let done = sqlx::query("UPDATE sandboxes SET suspended_snapshot = NULL, creating_replica = NULL WHERE id = $1 AND suspended_snapshot IS NOT NULL AND desired_state = $2")
            .bind(sandbox.as_str())
            .bind(DesiredState::Running.as_str())
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A resume did not happen: the sandbox stays suspended, no replica resuming it.
    pub async fn undo_resume(&self, sandbox: &SandboxId) -> Result<(), DbError> {
        sqlx::query("UPDATE sandboxes SET creating_replica = NULL WHERE id = $1 AND suspended_snapshot IS NOT NULL")
            .bind(sandbox.as_str())
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

async fn insert_artifact(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    snapshot: &SnapshotId,
    a: &StoredArtifact,
) -> Result<(), DbError> {
    sqlx::query("INSERT INTO stored_artifacts (snapshot_id, name, object_key, size, sha256) VALUES ($1, $2, $3, $4, $5)")
        .bind(snapshot.as_str())
        .bind(&a.name)
        .bind(&a.key)
        .bind(i64::try_from(a.size).map_err(|e| DbError::Invalid(e.to_string()))?)
        .bind(&a.sha256)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

//! Sandbox rows: the desired state of every sandbox, per tenant.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use space_core::sandbox::{PublicPorts, TimeoutAction};
use space_core::{Resources, SandboxId, SnapshotId, TenantId};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{unique_violation, Db, DbError};

/// What the control plane wants for a sandbox.
///
/// Pause, stop, snapshots and rollback change what a sandbox is doing, not whether it should
/// exist: the node owns and persists those states (and pauses idle sandboxes on its own), so
/// the desired state stays `running` through all of them and the reconciler treats every
/// live node state as converged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DesiredState {
    /// It should exist, in whatever live state the node reports (creating, running, paused,
    /// stopped, a transient operation, or failed).
    Running,
    /// It should be gone; the row is kept for listing and auditing.
    Deleted,
}

impl DesiredState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredState::Running => "running",
            DesiredState::Deleted => "deleted",
        }
    }

    fn parse(s: &str) -> Result<Self, DbError> {
        match s {
            "running" => Ok(DesiredState::Running),
            "deleted" => Ok(DesiredState::Deleted),
            other => Err(DbError::Corrupt {
                table: "sandboxes",
                reason: format!("desired_state {other:?}"),
            }),
        }
    }
}

/// The stored creation spec. Environment variable values are secrets and are never
/// stored: they go to the node at create time only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Resources (template defaults already filled in).
    pub resources: Resources,
    /// Names of the sandbox-wide environment variables.
    pub env_keys: Vec<String>,
    /// For a fork: the sandbox it was forked from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<SandboxId>,
    /// For a sandbox created from a snapshot: the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<SnapshotId>,
    /// Ports host routes serve without a credential (rows from before it: none).
    #[serde(default, skip_serializing_if = "PublicPorts::is_none")]
    pub public_ports: PublicPorts,
    /// What happens if its node is lost (rows from before it: `fail`).
    #[serde(default)]
    pub on_node_loss: space_core::sandbox::OnNodeLoss,
    /// With `restore`: seconds between its stored checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_secs: Option<u64>,
    /// Where its persistent snapshots are kept (rows from before it: on the node).
    #[serde(default)]
    pub snapshot_storage: space_core::sandbox::SnapshotStorage,
}

/// The generation and validity of the access tokens handed out for a sandbox (the E2B
/// surface's envd and traffic tokens, derived from the sandbox id and `epoch`): a token of
/// another epoch, or presented after `valid_until_ms`, is refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SandboxTokens {
    /// Bumped by a revocation (of the sandbox's tokens, or of an API key of its tenant).
    pub epoch: u64,
    /// The current tokens are valid until then, ms since the Unix epoch; renewed when they
    /// are handed out. 0: none are valid.
    pub valid_until_ms: i64,
}

impl SandboxTokens {
    /// Whether tokens of this epoch are valid at `now_ms`.
    pub fn valid_at(&self, now_ms: i64) -> bool {
        now_ms < self.valid_until_ms
    }
}

/// One row of `sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRow {
    /// Id.
    pub id: SandboxId,
    /// Owner.
    pub tenant_id: TenantId,
    /// Node it is placed on.
    pub node: String,
    /// Template name.
    pub template: String,
    /// Template digest (from the template at admission; updated from the node's record).
    pub template_digest: String,
    /// Resources and env names.
    pub spec: SandboxSpec,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Desired state.
    pub desired_state: DesiredState,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
    /// When the timeout passes (the `on_timeout` action is due), ms since the Unix epoch.
    pub expires_at_ms: i64,
    /// The timeout, seconds: the deadline is renewed to now + this whenever the sandbox runs
    /// again (a resume or start) and set by `PUT /timeout`.
    pub timeout_secs: u64,
    /// What happens when the timeout passes.
    pub on_timeout: TimeoutAction,
    /// Whether the next call that needs the guest wakes a sandbox its timeout paused or
    /// stopped.
    pub auto_resume: bool,
    /// When the timeout paused or stopped it (or found it paused or stopped): it has no
    /// deadline until it runs again. `None` while the deadline stands.
    pub timed_out_at_ms: Option<i64>,
    /// When deletion was requested.
    pub deleted_at_ms: Option<i64>,
    /// Create request to ready, ms; `None` until created.
    pub create_latency_ms: Option<i64>,
    /// The replica running its create (or its resume from object storage), until the
    /// outcome is recorded (or settled by the reconciler once that replica died).
    pub creating_replica: Option<super::ReplicaId>,
    /// The stored snapshot it is suspended in: no node holds it until it resumes.
    pub suspended_snapshot: Option<space_core::SnapshotId>,
    /// Its last checkpoint stored in object storage (`on_node_loss: restore`): what it is
    /// restored from if its node is lost.
    pub stored_checkpoint: Option<space_core::SnapshotId>,
    /// When that checkpoint was stored (or, after a restore, when the restore began): the
    /// next one is due an interval later.
    pub stored_checkpoint_at_ms: Option<i64>,
    /// Its access tokens' generation and validity.
    pub tokens: SandboxTokens,
}

/// Which rows a listing returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxFilter {
    /// Desired running.
    Live,
    /// Desired deleted.
    Deleted,
    /// Both.
    All,
}

const COLUMNS: &str =
    "id, tenant_id, node, template, template_digest, spec, labels, desired_state, \
                       created_at_ms, expires_at_ms, deleted_at_ms, create_latency_ms, \
                       timeout_secs, on_timeout, auto_resume, timed_out_at_ms, token_epoch, \
                       tokens_valid_until_ms, creating_replica, suspended_snapshot, \
                       stored_checkpoint, stored_checkpoint_at_ms";

/// The `SET` of a revocation of sandboxes' tokens: a new epoch, none valid until handed out
/// again (one sandbox's, or a tenant's when its API key is revoked).
pub(super) const REVOKE_TOKENS: &str = "token_epoch = token_epoch + 1, tokens_valid_until_ms = 0";

fn corrupt(reason: impl std::fmt::Display) -> DbError {
    DbError::Corrupt {
        table: "sandboxes",
        reason: reason.to_string(),
    }
}

fn row_to_sandbox(row: &AnyRow) -> Result<SandboxRow, DbError> {
    let id: String = row.try_get("id")?;
    let tenant: String = row.try_get("tenant_id")?;
    let spec: String = row.try_get("spec")?;
    let labels: String = row.try_get("labels")?;
    let desired: String = row.try_get("desired_state")?;
    let on_timeout: String = row.try_get("on_timeout")?;
    let timeout_secs: i64 = row.try_get("timeout_secs")?;
    let auto_resume: i64 = row.try_get("auto_resume")?;
    let token_epoch: i64 = row.try_get("token_epoch")?;
    Ok(SandboxRow {
        id: id.parse().map_err(corrupt)?,
        tenant_id: tenant.parse().map_err(corrupt)?,
        node: row.try_get("node")?,
        template: row.try_get("template")?,
        template_digest: row.try_get("template_digest")?,
        spec: serde_json::from_str(&spec).map_err(corrupt)?,
        labels: serde_json::from_str(&labels).map_err(corrupt)?,
        desired_state: DesiredState::parse(&desired)?,
        created_at_ms: row.try_get("created_at_ms")?,
        expires_at_ms: row.try_get("expires_at_ms")?,
        deleted_at_ms: row.try_get("deleted_at_ms")?,
        create_latency_ms: row.try_get("create_latency_ms")?,
        timeout_secs: u64::try_from(timeout_secs).map_err(corrupt)?,
        on_timeout: TimeoutAction::parse(&on_timeout)
            .ok_or_else(|| corrupt(format!("on_timeout {on_timeout:?}")))?,
        auto_resume: auto_resume != 0,
        timed_out_at_ms: row.try_get("timed_out_at_ms")?,
        creating_replica: row
            .try_get::<Option<String>, _>("creating_replica")?
            .map(super::ReplicaId::from_stored),
        suspended_snapshot: row
            .try_get::<Option<String>, _>("suspended_snapshot")?
            .map(|s| s.parse().map_err(corrupt))
            .transpose()?,
        stored_checkpoint: row
            .try_get::<Option<String>, _>("stored_checkpoint")?
            .map(|s| s.parse().map_err(corrupt))
            .transpose()?,
        stored_checkpoint_at_ms: row.try_get("stored_checkpoint_at_ms")?,
        tokens: SandboxTokens {
            epoch: u64::try_from(token_epoch).map_err(corrupt)?,
            valid_until_ms: row.try_get("tokens_valid_until_ms")?,
        },
    })
}

/// `secs` from `now_ms`, in ms, saturating.
fn deadline(now_ms: i64, secs: u64) -> i64 {
    now_ms.saturating_add(i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX))
}

fn to_json<T: Serialize>(v: &T) -> Result<String, DbError> {
    serde_json::to_string(v).map_err(|e| DbError::Invalid(e.to_string()))
}

impl Db {
    /// Records a new sandbox (before the node is asked to create it).
    pub async fn insert_sandbox(&self, row: &SandboxRow) -> Result<(), DbError> {
        let sql = format!("INSERT INTO sandboxes ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)");
        sqlx::query(&sql)
            .bind(row.id.as_str())
            .bind(row.tenant_id.as_str())
            .bind(&row.node)
            .bind(&row.template)
            .bind(&row.template_digest)
            .bind(to_json(&row.spec)?)
            .bind(to_json(&row.labels)?)
            .bind(row.desired_state.as_str())
            .bind(row.created_at_ms)
            .bind(row.expires_at_ms)
            .bind(row.deleted_at_ms)
            .bind(row.create_latency_ms)
            .bind(i64::try_from(row.timeout_secs).map_err(|e| DbError::Invalid(e.to_string()))?)
            .bind(row.on_timeout.as_str())
            .bind(i64::from(row.auto_resume))
            .bind(row.timed_out_at_ms)
            .bind(i64::try_from(row.tokens.epoch).map_err(|e| DbError::Invalid(e.to_string()))?)
            .bind(row.tokens.valid_until_ms)
            .bind(row.creating_replica.as_ref().map(|r| r.as_str().to_owned()))
            .bind(
                row.suspended_snapshot
                    .as_ref()
                    .map(|s| s.as_str().to_owned()),
            )
            .bind(
                row.stored_checkpoint
                    .as_ref()
                    .map(|s| s.as_str().to_owned()),
            )
            .bind(row.stored_checkpoint_at_ms)
            .execute(self.pool())
            .await
            .map_err(|e| unique_violation(e, || format!("sandbox {}", row.id)))?;
        Ok(())
    }

    /// One sandbox of a tenant, in any desired state; `None` if missing or another tenant's.
    pub async fn sandbox(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Result<Option<SandboxRow>, DbError> {
        let sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE id = $1 AND tenant_id = $2");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .bind(tenant.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(row_to_sandbox).transpose()
    }

    /// One sandbox regardless of tenant (for the reconciler and admin tools).
    pub async fn sandbox_any_tenant(&self, id: &SandboxId) -> Result<Option<SandboxRow>, DbError> {
        let sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE id = $1");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(row_to_sandbox).transpose()
    }

    /// A tenant's sandboxes, newest first.
    pub async fn sandboxes(
        &self,
        tenant: &TenantId,
        filter: SandboxFilter,
    ) -> Result<Vec<SandboxRow>, DbError> {
        let (cond, state) = match filter {
            SandboxFilter::Live => ("AND desired_state = $2", Some(DesiredState::Running)),
            SandboxFilter::Deleted => ("AND desired_state = $2", Some(DesiredState::Deleted)),
            SandboxFilter::All => ("", None),
        };
        let sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE tenant_id = $1 {cond} ORDER BY created_at_ms DESC, id DESC");
        let mut q = sqlx::query(&sql).bind(tenant.as_str());
        if let Some(state) = state {
            q = q.bind(state.as_str());
        }
        let rows = q.fetch_all(self.pool()).await?;
        rows.iter().map(row_to_sandbox).collect()
    }

    /// Every sandbox that should exist, all tenants (the reconciler's input).
    pub async fn live_sandboxes(&self) -> Result<Vec<SandboxRow>, DbError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM sandboxes WHERE desired_state = $1 ORDER BY created_at_ms, id"
        );
        let rows = sqlx::query(&sql)
            .bind(DesiredState::Running.as_str())
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(row_to_sandbox).collect()
    }

    /// How many sandboxes that are not deleted were made from template `digest`: of every
    /// tenant, or of `tenant` only.
    pub async fn count_using_template(
        &self,
        digest: &str,
        tenant: Option<&TenantId>,
    ) -> Result<i64, DbError> {
        const ALL: &str =
            "SELECT COUNT(*) FROM sandboxes WHERE template_digest = $1 AND desired_state <> $2";
        const OF_ONE: &str = "SELECT COUNT(*) FROM sandboxes WHERE template_digest = $1 \
             AND desired_state <> $2 AND tenant_id = $3";
        let query = sqlx::query_scalar(if tenant.is_some() { OF_ONE } else { ALL })
            .bind(digest)
            .bind(DesiredState::Deleted.as_str());
        let query = match tenant {
            Some(t) => query.bind(t.as_str()),
            None => query,
        };
        let n: i64 = query.fetch_one(self.pool()).await?;
        Ok(n)
    }

    /// The live sandboxes placed on node `node` that are restored elsewhere if it is lost
    /// (`on_node_loss: restore`; also those without a stored checkpoint yet, so that a node
    /// knows one well before its first checkpoint could make it restorable).
    pub async fn restorable_on(&self, node: &str) -> Result<Vec<SandboxId>, DbError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM sandboxes WHERE node = $1 AND desired_state = $2 AND suspended_snapshot IS NULL"
        );
        let rows = sqlx::query(&sql)
            .bind(node)
            .bind(DesiredState::Running.as_str())
            .fetch_all(self.pool())
            .await?;
        let mut ids = Vec::new();
        for row in &rows {
            let row = row_to_sandbox(row)?;
            if row.spec.on_node_loss == space_core::sandbox::OnNodeLoss::Restore {
                ids.push(row.id);
            }
        }
        Ok(ids)
    }

    /// Marks a sandbox deleted. Returns `false` if it already was (or does not exist), so
    /// exactly one caller wins a race to delete.
    pub async fn mark_deleted(&self, id: &SandboxId, now_ms: i64) -> Result<bool, DbError> {
        let sql = format!(
            "UPDATE sandboxes SET desired_state = '{}', deleted_at_ms = $1 WHERE id = $2 AND desired_state = $3",
            DesiredState::Deleted.as_str()
        );
        self.update_live(&sql, id, now_ms).await
    }

    /// `PUT /timeout`: the live sandbox's timeout becomes `timeout_secs`, its deadline
    /// that far from `now_ms` (a timed-out sandbox has one again). `false` if it is not live.
    pub async fn set_timeout(
        &self,
        id: &SandboxId,
        timeout_secs: u64,
        now_ms: i64,
    ) -> Result<bool, DbError> {
        let secs = i64::try_from(timeout_secs).map_err(|e| DbError::Invalid(e.to_string()))?;
        let done = sqlx::query(
            "UPDATE sandboxes SET timeout_secs = $1, expires_at_ms = $2, timed_out_at_ms = NULL WHERE id = $3 AND desired_state = $4",
        )
        .bind(secs)
        .bind(deadline(now_ms, timeout_secs))
        .bind(id.as_str())
        .bind(DesiredState::Running.as_str())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The live sandbox's deadline is `now_ms`: the reconciler's next pass does its timeout
    /// action, as at any deadline. Its timeout (what a renewal uses) is kept. `false` if it
    /// is not live.
    pub async fn expire_now(&self, id: &SandboxId, now_ms: i64) -> Result<bool, DbError> {
        self.update_live(
            "UPDATE sandboxes SET expires_at_ms = $1, timed_out_at_ms = NULL WHERE id = $2 AND desired_state = $3",
            id,
            now_ms,
        )
        .await
    }

    /// The live sandbox runs again (resumed or started): its deadline becomes `now_ms` plus
    /// its timeout, and it is no longer timed out. `false` if it is not live.
    pub async fn renew_timeout(&self, id: &SandboxId, now_ms: i64) -> Result<bool, DbError> {
        self.update_live(
            "UPDATE sandboxes SET expires_at_ms = $1 + timeout_secs * 1000, timed_out_at_ms = NULL WHERE id = $2 AND desired_state = $3",
            id,
            now_ms,
        )
        .await
    }

    /// [`Db::renew_timeout`] for at least `min_secs`: the deadline becomes `now_ms` plus the
    /// longer of its timeout and `min_secs` (its timeout itself is kept). `false` if it is
    /// not live.
    pub async fn renew_timeout_at_least(
        &self,
        id: &SandboxId,
        now_ms: i64,
        min_secs: u64,
    ) -> Result<bool, DbError> {
        let min_ms = i64::try_from(min_secs.saturating_mul(1000))
            .map_err(|e| DbError::Invalid(e.to_string()))?;
        let done = sqlx::query(
            "UPDATE sandboxes SET expires_at_ms = $1 + CASE WHEN timeout_secs * 1000 > $2 THEN timeout_secs * 1000 ELSE $2 END, timed_out_at_ms = NULL WHERE id = $3 AND desired_state = $4",
        )
        .bind(now_ms)
        .bind(min_ms)
        .bind(id.as_str())
        .bind(DesiredState::Running.as_str())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Hands out the current tokens of a sandbox that is not deleted: they are valid until
    /// `valid_until_ms` (never shortened). `None` if it is deleted or missing.
    pub async fn renew_tokens(
        &self,
        id: &SandboxId,
        valid_until_ms: i64,
    ) -> Result<Option<SandboxTokens>, DbError> {
        let sql = format!(
            "UPDATE sandboxes SET tokens_valid_until_ms = $1 WHERE id = $2 AND desired_state <> '{}' AND tokens_valid_until_ms < $1",
            DesiredState::Deleted.as_str()
        );
        sqlx::query(&sql)
            .bind(valid_until_ms)
            .bind(id.as_str())
            .execute(self.pool())
            .await?;
        Ok(self
            .sandbox_any_tenant(id)
            .await?
            .filter(|row| row.desired_state != DesiredState::Deleted)
            .map(|row| row.tokens))
    }

    /// Revokes every token handed out for a sandbox: a new epoch, none valid until they are
    /// handed out again. `false` if it does not exist.
    pub async fn revoke_tokens(&self, id: &SandboxId) -> Result<bool, DbError> {
        let done = sqlx::query(&format!(
            "UPDATE sandboxes SET {REVOKE_TOKENS} WHERE id = $1"
        ))
        .bind(id.as_str())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The timeout of a live sandbox acted (paused or stopped it, or found it so) at
    /// `now_ms`: it has no deadline until it runs again. `false` if it is not live, already
    /// timed out, or its deadline moved past `now_ms` meanwhile (a renewal wins).
    pub async fn mark_timed_out(&self, id: &SandboxId, now_ms: i64) -> Result<bool, DbError> {
        self.update_live(
            "UPDATE sandboxes SET timed_out_at_ms = $1 WHERE id = $2 AND desired_state = $3 AND timed_out_at_ms IS NULL AND expires_at_ms <= $1",
            id,
            now_ms,
        )
        .await
    }

    /// Runs `sql`, an update of one sandbox whose parameters are `$1` = `now_ms`, `$2` = its
    /// id and `$3` = the live desired state; whether a row changed.
    async fn update_live(&self, sql: &str, id: &SandboxId, now_ms: i64) -> Result<bool, DbError> {
        let done = sqlx::query(sql)
            .bind(now_ms)
            .bind(id.as_str())
            .bind(DesiredState::Running.as_str())
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Moves a sandbox that is being created from node `from` to node `to` (its create
    /// never reached `from`); `false` if its row names another node by now.
    pub async fn move_placement(
        &self,
        id: &SandboxId,
        from: &str,
        to: &str,
    ) -> Result<bool, DbError> {
        let moved = sqlx::query("UPDATE sandboxes SET node = $1 WHERE id = $2 AND node = $3 AND desired_state = 'running'")
            .bind(to)
            .bind(id.as_str())
            .bind(from)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(moved == 1)
    }

    /// Records what the node reported once the sandbox was created, and that no replica
    /// runs its create any more. `false`: the row is no longer live (the reconciler undid
    /// the create of a replica it took for dead, or the sandbox was deleted meanwhile), so
    /// the create must not be reported as done.
    pub async fn set_created(
        &self,
        id: &SandboxId,
        template_digest: &str,
        spec: &SandboxSpec,
        create_latency_ms: i64,
    ) -> Result<bool, DbError> {
        let done = sqlx::query("UPDATE sandboxes SET template_digest = $1, spec = $2, create_latency_ms = $3, creating_replica = NULL WHERE id = $4 AND desired_state = $5")
            .bind(template_digest)
            .bind(to_json(spec)?)
            .bind(create_latency_ms)
            .bind(id.as_str())
            .bind(DesiredState::Running.as_str())
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

//! Cluster membership: nodes, their liveness and generation, and one-time join tokens.
//!
//! Every rule that keeps two replicas (or a node and a replica) from disagreeing is a
//! single conditional statement here, so PostgreSQL (or SQLite) decides the race:
//! - a join token is spent by one `UPDATE … WHERE used_at_ms IS NULL AND expires_at_ms > now`;
//! - a heartbeat counts only `WHERE generation = $g AND liveness = 'ready'` and the
//!   certificate is the one issued at the last join;
//! - a node is declared lost, and its generation bumped, by one `UPDATE` over the nodes
//!   whose last heartbeat is too old (whichever replica runs it first; the others find
//!   nothing left to do);
//! - a fenced node is let back only from the generation it was fenced at.

use space_core::{SandboxId, SandboxState};
use space_node_proto::NodeStatus;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now_ms, Db, DbError};

/// Whether a node answers its heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeLiveness {
    /// Heartbeating.
    Ready,
    /// Missed its heartbeats; fenced until it rejoins.
    Lost,
}

impl NodeLiveness {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeLiveness::Ready => "ready",
            NodeLiveness::Lost => "lost",
        }
    }

    fn parse(s: &str) -> Result<Self, DbError> {
        match s {
            "ready" => Ok(NodeLiveness::Ready),
            "lost" => Ok(NodeLiveness::Lost),
            other => Err(DbError::Corrupt {
                table: "nodes",
                reason: format!("liveness {other:?}"),
            }),
        }
    }
}

/// A node as the database knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// Its name (a DNS label; what sandbox rows name).
    pub name: String,
    /// `host:port` of its agent.
    pub address: String,
    /// Bumped each time it is declared lost.
    pub generation: u64,
    /// Heartbeating or lost.
    pub liveness: NodeLiveness,
    /// Closed to new placements by the operator.
    pub cordoned: bool,
    /// `sha256:<hex>` of the certificate issued at its last join.
    pub cert_fingerprint: String,
    /// What its last heartbeat reported (`None` before the first).
    pub status: Option<NodeStatus>,
    /// ms since the Unix epoch.
    pub joined_at_ms: i64,
    /// Its last counted heartbeat (the join counts as one).
    pub heartbeat_at_ms: i64,
    /// When it was last declared lost.
    pub lost_at_ms: Option<i64>,
}

/// A node joining (or joining again, replacing its certificate).
#[derive(Debug, Clone)]
pub struct NewNode<'a> {
    /// Its name.
    pub name: &'a str,
    /// `host:port` of its agent.
    pub address: &'a str,
    /// Fingerprint of the certificate just issued to it.
    pub cert_fingerprint: &'a str,
}

/// Why a join token was not accepted. The messages say what happened without helping a
/// guesser: an unknown id and a wrong secret read the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinTokenError {
    /// No such token, or the secret does not match.
    #[error("the join token is not valid")]
    Invalid,
    /// Spent already (each token joins one node once).
    #[error("the join token was already used")]
    Used,
    /// Past its expiry.
    #[error("the join token has expired")]
    Expired,
}

/// Why a heartbeat or rejoin was not counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// No node of that name has joined.
    #[error("node {0} has not joined this cluster")]
    UnknownNode(String),
    /// The certificate presented is not the one issued at the node's last join.
    #[error("node {0} presented a certificate other than the one it was last issued")]
    StaleCertificate(String),
    /// The node was declared lost (or rejoined) since that generation.
    #[error("node {name} is fenced: generation {presented} is not its current one ({current}); it must rejoin")]
    Fenced {
        /// The node.
        name: String,
        /// What it said.
        presented: u64,
        /// What the database holds.
        current: u64,
    },
}

/// A join token as listed (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTokenInfo {
    /// Its id.
    pub id: String,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
    /// It cannot be used after this.
    pub expires_at_ms: i64,
    /// When it was spent, and by which node.
    pub used: Option<(i64, String)>,
}

const NODE_COLUMNS: &str = "name, address, generation, liveness, cordoned, cert_fingerprint, status, joined_at_ms, heartbeat_at_ms, lost_at_ms";

fn node_row(r: &AnyRow) -> Result<NodeRow, DbError> {
    let corrupt = |reason: String| DbError::Corrupt {
        table: "nodes",
        reason,
    };
    let status: Option<String> = r.try_get("status")?;
    let status = status
        .map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(|e| corrupt(format!("status: {e}")))?;
    let generation: i64 = r.try_get("generation")?;
    Ok(NodeRow {
        name: r.try_get("name")?,
        address: r.try_get("address")?,
        generation: u64::try_from(generation).map_err(|_| corrupt("generation".into()))?,
        liveness: NodeLiveness::parse(&r.try_get::<String, _>("liveness")?)?,
        cordoned: r.try_get::<i64, _>("cordoned")? != 0,
        cert_fingerprint: r.try_get("cert_fingerprint")?,
        status,
        joined_at_ms: r.try_get("joined_at_ms")?,
        heartbeat_at_ms: r.try_get("heartbeat_at_ms")?,
        lost_at_ms: r.try_get("lost_at_ms")?,
    })
}

fn gen_i64(g: u64) -> i64 {
    i64::try_from(g).unwrap_or(i64::MAX)
}

impl Db {
    /// Stores a join token (its id and the sha256 of its secret), valid until `expires_at_ms`.
    pub async fn create_join_token(
        &self,
        id: &str,
        secret_hash: &str,
        expires_at_ms: i64,
    ) -> Result<JoinTokenInfo, DbError> {
        let now = now_ms();
        sqlx::query("INSERT INTO node_join_tokens (id, secret_hash, created_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4)")
            .bind(id)
            .bind(secret_hash)
            .bind(now)
            .bind(expires_at_ms)
            .execute(self.pool())
            .await
            .map_err(|e| super::unique_violation(e, || format!("join token {id}")))?;
        Ok(JoinTokenInfo {
            id: id.to_owned(),
            created_at_ms: now,
            expires_at_ms,
            used: None,
        })
    }

    /// Join tokens, newest first.
    pub async fn join_tokens(&self) -> Result<Vec<JoinTokenInfo>, DbError> {
        let rows = sqlx::query("SELECT id, created_at_ms, expires_at_ms, used_at_ms, used_by FROM node_join_tokens ORDER BY created_at_ms DESC, id")
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| {
                let used_at: Option<i64> = r.try_get("used_at_ms")?;
                let used_by: Option<String> = r.try_get("used_by")?;
                Ok(JoinTokenInfo {
                    id: r.try_get("id")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                    expires_at_ms: r.try_get("expires_at_ms")?,
                    used: used_at.zip(used_by),
                })
            })
            .collect()
    }

    /// Spends join token `token_id` (whose secret hashes to `secret_hash`) on node `node`
    /// and records the node, in one transaction: at most one join ever succeeds with a
    /// token, only before its expiry, and a join that fails (or a replica killed in the
    /// middle) spends nothing. A new name gets a row at generation 1; the same name joining
    /// again (its disk was replaced, say) gets the new address and certificate and its
    /// generation bumped, which fences whatever still holds the old certificate.
    pub async fn join_node(
        &self,
        token_id: &str,
        secret_hash: &str,
        node: &NewNode<'_>,
    ) -> Result<Result<NodeRow, JoinTokenError>, DbError> {
        let now = now_ms();
        let mut tx = self.pool().begin().await?;
        let spent = sqlx::query("UPDATE node_join_tokens SET used_at_ms = $1, used_by = $2 WHERE id = $3 AND secret_hash = $4 AND used_at_ms IS NULL AND expires_at_ms > $1")
            .bind(now)
            .bind(node.name)
            .bind(token_id)
            .bind(secret_hash)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if spent != 1 {
            drop(tx);
            return Ok(Err(self.why_not_spent(token_id, secret_hash).await?));
        }
        sqlx::query(
            "INSERT INTO nodes (name, address, generation, liveness, cordoned, cert_fingerprint, joined_at_ms, heartbeat_at_ms) \
             VALUES ($1, $2, 1, 'ready', 0, $3, $4, $4) \
             ON CONFLICT (name) DO UPDATE SET address = $2, generation = nodes.generation + 1, liveness = 'ready', cert_fingerprint = $3, joined_at_ms = $4, heartbeat_at_ms = $4",
        )
        .bind(node.name)
        .bind(node.address)
        .bind(node.cert_fingerprint)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.node(node.name)
            .await?
            .ok_or_else(|| DbError::NotFound(format!("node {}", node.name)))
            .map(Ok)
    }

    /// Why a token was not spent. The secret is matched too, so a wrong secret for a real
    /// id reads "invalid", like an unknown id. (`secret_hash` is the sha256 of a 256-bit
    /// secret: comparing hashes in the database leaks nothing usable.)
    async fn why_not_spent(
        &self,
        token_id: &str,
        secret_hash: &str,
    ) -> Result<JoinTokenError, DbError> {
        let row = sqlx::query(
            "SELECT used_at_ms FROM node_join_tokens WHERE id = $1 AND secret_hash = $2",
        )
        .bind(token_id)
        .bind(secret_hash)
        .fetch_optional(self.pool())
        .await?;
        Ok(match row {
            None => JoinTokenError::Invalid,
            Some(r) if r.try_get::<Option<i64>, _>("used_at_ms")?.is_some() => JoinTokenError::Used,
            Some(_) => JoinTokenError::Expired,
        })
    }

    /// The node called `name`.
    pub async fn node(&self, name: &str) -> Result<Option<NodeRow>, DbError> {
        let row = sqlx::query(&format!("SELECT {NODE_COLUMNS} FROM nodes WHERE name = $1"))
            .bind(name)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(node_row).transpose()
    }

    /// Every node, by name.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, DbError> {
        let rows = sqlx::query(&format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY name"))
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(node_row).collect()
    }

    /// Counts a heartbeat of node `name` at `generation`, presenting the certificate
    /// `fingerprint`: stores its status and the live states of the sandboxes placed on it.
    /// Sandboxes it names that are not placed on it are left alone and returned.
    pub async fn node_heartbeat(
        &self,
        name: &str,
        generation: u64,
        fingerprint: &str,
        status: &NodeStatus,
        sandboxes: &[(SandboxId, SandboxState)],
    ) -> Result<Result<Vec<SandboxId>, MembershipError>, DbError> {
        let now = now_ms();
        let status_json =
            serde_json::to_string(status).map_err(|e| DbError::Invalid(e.to_string()))?;
        let mut tx = self.pool().begin().await?;
        let counted = sqlx::query("UPDATE nodes SET status = $1, heartbeat_at_ms = $2 WHERE name = $3 AND generation = $4 AND liveness = 'ready' AND cert_fingerprint = $5")
            .bind(&status_json)
            .bind(now)
            .bind(name)
            .bind(gen_i64(generation))
            .bind(fingerprint)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if counted != 1 {
            drop(tx);
            return Ok(Err(self
                .why_not_member(name, generation, fingerprint)
                .await?));
        }
        let mut not_yours = Vec::new();
        for (id, state) in sandboxes {
            let updated = sqlx::query("UPDATE sandboxes SET live_state = $1, live_state_at_ms = $2 WHERE id = $3 AND node = $4")
                .bind(state.as_str())
                .bind(now)
                .bind(id.as_str())
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if updated == 0 {
                not_yours.push(id.clone());
            }
        }
        tx.commit().await?;
        Ok(Ok(not_yours))
    }

    async fn why_not_member(
        &self,
        name: &str,
        generation: u64,
        fingerprint: &str,
    ) -> Result<MembershipError, DbError> {
        Ok(match self.node(name).await? {
            None => MembershipError::UnknownNode(name.to_owned()),
            Some(n) if n.cert_fingerprint != fingerprint => {
                MembershipError::StaleCertificate(name.to_owned())
            }
            Some(n) => MembershipError::Fenced {
                name: name.to_owned(),
                presented: generation,
                // A lost node's current generation is fenced too: it must rejoin.
                current: n.generation,
            },
        })
    }

    /// Declares lost every ready node whose last heartbeat is older than `cutoff_ms`,
    /// bumping its generation. Returns the names, once: a second caller finds them lost.
    pub async fn mark_lost_nodes(&self, cutoff_ms: i64) -> Result<Vec<String>, DbError> {
        let now = now_ms();
        let rows = sqlx::query("UPDATE nodes SET liveness = 'lost', generation = generation + 1, lost_at_ms = $1 WHERE liveness = 'ready' AND heartbeat_at_ms < $2 RETURNING name")
            .bind(now)
            .bind(cutoff_ms)
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>("name").map_err(DbError::from))
            .collect()
    }

    /// Checks that node `name`, presenting `fingerprint`, may rejoin from `generation`
    /// (lost, with that generation or the one its loss bumped it to): the caller then
    /// reconciles it and calls [`Db::finish_rejoin`].
    pub async fn check_rejoin(
        &self,
        name: &str,
        generation: u64,
        fingerprint: &str,
    ) -> Result<Result<NodeRow, MembershipError>, DbError> {
        let Some(node) = self.node(name).await? else {
            return Ok(Err(MembershipError::UnknownNode(name.to_owned())));
        };
        if node.cert_fingerprint != fingerprint {
            return Ok(Err(MembershipError::StaleCertificate(name.to_owned())));
        }
        // A node at its current generation that is ready has nothing to rejoin; one older
        // than the loss before last is a replay of something long gone.
        let fits = generation == node.generation || generation + 1 == node.generation;
        if node.liveness != NodeLiveness::Lost || !fits {
            return Ok(Err(MembershipError::Fenced {
                name: name.to_owned(),
                presented: generation,
                current: node.generation,
            }));
        }
        Ok(Ok(node))
    }

    /// Lets a reconciled node serve again at `generation` (what [`Db::check_rejoin`] saw):
    /// `false` if something changed in between (it was rejoined by another replica, or
    /// joined again), and the caller must not tell it to serve.
    pub async fn finish_rejoin(&self, name: &str, generation: u64) -> Result<bool, DbError> {
        let done = sqlx::query("UPDATE nodes SET liveness = 'ready', heartbeat_at_ms = $1 WHERE name = $2 AND generation = $3 AND liveness = 'lost'")
            .bind(now_ms())
            .bind(name)
            .bind(gen_i64(generation))
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(done == 1)
    }

    /// Cordons (`true`: no new placements) or uncordons node `name`; `false` if no such node.
    pub async fn set_node_cordoned(&self, name: &str, cordoned: bool) -> Result<bool, DbError> {
        let done = sqlx::query("UPDATE nodes SET cordoned = $1 WHERE name = $2")
            .bind(i64::from(cordoned))
            .bind(name)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(done == 1)
    }

    /// Removes node `name` from the cluster if no live sandbox is placed on it.
    pub async fn remove_node(&self, name: &str) -> Result<RemoveNode, DbError> {
        let mut tx = self.pool().begin().await?;
        let holding: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sandboxes WHERE node = $1 AND desired_state <> 'deleted'",
        )
        .bind(name)
        .fetch_one(&mut *tx)
        .await?;
        if holding > 0 {
            return Ok(RemoveNode::HoldsSandboxes(
                u64::try_from(holding).unwrap_or(0),
            ));
        }
        let done = sqlx::query("DELETE FROM nodes WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(if done == 1 {
            RemoveNode::Removed
        } else {
            RemoveNode::NotFound
        })
    }
}

/// What [`Db::remove_node`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveNode {
    /// Gone from the cluster.
    Removed,
    /// No such node.
    NotFound,
    /// It still holds this many live sandboxes: nothing changed.
    HoldsSandboxes(u64),
}

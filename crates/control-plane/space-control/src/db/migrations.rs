//! The database schema, as embedded, numbered migrations.
//!
//! Portable SQL only (TEXT, BIGINT, `$n` placeholders), so the same statements run on
//! SQLite and PostgreSQL. Each migration runs in one transaction and is recorded in
//! `schema_migrations`; applied migrations are never edited, only new ones appended.

/// One schema change.
pub struct Migration {
    /// Increasing number; recorded once applied.
    pub version: i64,
    /// What it does, for the log.
    pub description: &'static str,
    /// Statements, run in order in one transaction.
    pub statements: &'static [&'static str],
}

/// Creates the bookkeeping table itself (idempotent).
pub const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at_ms BIGINT NOT NULL
)";

/// Every migration, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "tenants, api keys, sandboxes",
        statements: &[
            "CREATE TABLE tenants (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            created_at_ms BIGINT NOT NULL
        )",
            "CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(id),
            key_hash TEXT NOT NULL UNIQUE,
            prefix TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            revoked_at_ms BIGINT
        )",
            "CREATE INDEX api_keys_tenant ON api_keys (tenant_id)",
            // `spec` holds resources and environment variable NAMES; values are secrets and are
            // only handed to the node at create time.
            "CREATE TABLE sandboxes (
            id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(id),
            node TEXT NOT NULL,
            template TEXT NOT NULL,
            template_digest TEXT NOT NULL,
            spec TEXT NOT NULL,
            labels TEXT NOT NULL,
            desired_state TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL,
            deleted_at_ms BIGINT,
            create_latency_ms BIGINT
        )",
            "CREATE INDEX sandboxes_tenant ON sandboxes (tenant_id, desired_state, created_at_ms)",
            "CREATE INDEX sandboxes_desired ON sandboxes (desired_state, expires_at_ms)",
        ],
    },
    // One row per (tenant, Idempotency-Key); see `db::idempotency`. `token` names the
    // request that claimed the key; the response columns are set once it is `done`.
    Migration {
        version: 2,
        description: "idempotency keys",
        statements: &[
            "CREATE TABLE idempotency_keys (
                tenant_id TEXT NOT NULL REFERENCES tenants(id),
                idem_key TEXT NOT NULL,
                token TEXT NOT NULL,
                method TEXT NOT NULL,
                path TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                state TEXT NOT NULL,
                response_status BIGINT,
                response_headers TEXT,
                response_body_encoding TEXT,
                response_body TEXT,
                created_at_ms BIGINT NOT NULL,
                completed_at_ms BIGINT,
                PRIMARY KEY (tenant_id, idem_key)
            )",
            "CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at_ms)",
        ],
    },
    // A tenant's default egress policy (JSON `EgressPolicy`), for its sandboxes whose create
    // request names none. No row: the node's default.
    Migration {
        version: 3,
        description: "tenant egress policies",
        statements: &["CREATE TABLE tenant_egress_policies (
                tenant_id TEXT PRIMARY KEY REFERENCES tenants(id),
                policy TEXT NOT NULL,
                updated_at_ms BIGINT NOT NULL
            )"],
    },
    // What a sandbox's timeout does (`TimeoutAction`: delete, pause, stop), whether the next
    // call that needs its guest wakes it afterwards (0/1), its timeout as a duration (the
    // deadline is renewed from it whenever the sandbox runs again; rows from before this
    // migration get the span they were created with), and when the timeout paused or
    // stopped it (set: no deadline until it runs again).
    Migration {
        version: 4,
        description: "sandbox timeout actions",
        statements: &[
            "ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'delete'",
            "ALTER TABLE sandboxes ADD COLUMN auto_resume BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE sandboxes ADD COLUMN timeout_secs BIGINT NOT NULL DEFAULT 3600",
            "UPDATE sandboxes SET timeout_secs = CASE WHEN expires_at_ms - created_at_ms >= 1000 THEN (expires_at_ms - created_at_ms) / 1000 ELSE 1 END",
            "ALTER TABLE sandboxes ADD COLUMN timed_out_at_ms BIGINT",
        ],
    },
    // The generation of a sandbox's access tokens (`SandboxTokens`): bumped to revoke every
    // token handed out so far; and until when the current ones are valid (0: none handed
    // out yet, or revoked). Rows from before: generation 0, valid until handed out again.
    Migration {
        version: 5,
        description: "sandbox token epochs",
        statements: &[
            "ALTER TABLE sandboxes ADD COLUMN token_epoch BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE sandboxes ADD COLUMN tokens_valid_until_ms BIGINT NOT NULL DEFAULT 0",
        ],
    },
    // The action log (`db::audit`): one hash chain per tenant, dense positions from 1; and
    // where each chain's kept part starts once old records were removed.
    Migration {
        version: 6,
        description: "action log",
        statements: &[
            "CREATE TABLE audit_log (
                tenant_id TEXT NOT NULL REFERENCES tenants(id),
                seq BIGINT NOT NULL,
                ts_ms BIGINT NOT NULL,
                api_key_id TEXT,
                action TEXT NOT NULL,
                target TEXT NOT NULL,
                outcome TEXT NOT NULL,
                status BIGINT NOT NULL,
                prev_hash TEXT NOT NULL,
                hash TEXT NOT NULL,
                PRIMARY KEY (tenant_id, seq)
            )",
            "CREATE INDEX audit_log_time ON audit_log (ts_ms)",
            "CREATE TABLE audit_anchors (
                tenant_id TEXT PRIMARY KEY REFERENCES tenants(id),
                seq BIGINT NOT NULL,
                hash TEXT NOT NULL
            )",
        ],
    },
    // A tenant's own quota (JSON `TenantQuota`), over the operator's defaults. No row: the
    // defaults.
    Migration {
        version: 7,
        description: "tenant quotas",
        statements: &["CREATE TABLE tenant_quotas (
                tenant_id TEXT PRIMARY KEY REFERENCES tenants(id),
                quota TEXT NOT NULL,
                updated_at_ms BIGINT NOT NULL
            )"],
    },
    // Cluster membership (`db::nodes`). A node's `generation` is bumped when it is
    // declared lost: what it says with an older one is refused (fencing). `cordoned` is
    // the operator's (no new placements), apart from liveness. `status` is the JSON
    // `NodeStatus` of its last heartbeat. Join tokens: only the secret's sha256 is kept;
    // `used_at_ms` set once, by the join that spent it. A sandbox's `live_state` is the
    // state its node last reported (heartbeat, or the answer to a call), for listings that
    // do not ask every node.
    Migration {
        version: 8,
        description: "nodes, join tokens, sandboxes' live states",
        statements: &[
            "CREATE TABLE nodes (
                name TEXT PRIMARY KEY,
                address TEXT NOT NULL,
                generation BIGINT NOT NULL,
                liveness TEXT NOT NULL,
                cordoned BIGINT NOT NULL DEFAULT 0,
                cert_fingerprint TEXT NOT NULL,
                status TEXT,
                joined_at_ms BIGINT NOT NULL,
                heartbeat_at_ms BIGINT NOT NULL,
                lost_at_ms BIGINT
            )",
            "CREATE TABLE node_join_tokens (
                id TEXT PRIMARY KEY,
                secret_hash TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL,
                expires_at_ms BIGINT NOT NULL,
                used_at_ms BIGINT,
                used_by TEXT
            )",
            "ALTER TABLE sandboxes ADD COLUMN live_state TEXT",
            "ALTER TABLE sandboxes ADD COLUMN live_state_at_ms BIGINT",
            "CREATE INDEX sandboxes_node ON sandboxes (node, desired_state)",
        ],
    },
    // Control-plane replicas (`db::replicas`) and what each holds while it works: the
    // replica running a sandbox's create (cleared when the create is recorded), the one
    // running an idempotent request, quota held for work under way; and API keys' request
    // buckets (`db::rate`), shared by every replica. Times by the database's clock.
    Migration {
        version: 9,
        description: "replicas, their claims and holds, shared request buckets",
        statements: &[
            "CREATE TABLE replicas (
                id TEXT PRIMARY KEY,
                host TEXT NOT NULL,
                started_at_ms BIGINT NOT NULL,
                heartbeat_at_ms BIGINT NOT NULL
            )",
            "ALTER TABLE sandboxes ADD COLUMN creating_replica TEXT",
            "ALTER TABLE idempotency_keys ADD COLUMN replica TEXT",
            "CREATE TABLE quota_holds (
                id TEXT PRIMARY KEY,
                tenant_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                amount BIGINT NOT NULL,
                replica TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL
            )",
            "CREATE INDEX quota_holds_tenant ON quota_holds (tenant_id, kind)",
            "CREATE INDEX quota_holds_replica ON quota_holds (replica)",
            "CREATE TABLE rate_buckets (
                key_id TEXT PRIMARY KEY,
                level BIGINT NOT NULL,
                updated_at_ms BIGINT NOT NULL
            )",
        ],
    },
    // The credential catalog (`db::credentials`): metadata (JSON `Credential`) and the
    // value sealed by the control plane; one name per scope; and the catalog's revision,
    // counting every change, that nodes report how far they were synced to.
    Migration {
        version: 10,
        description: "credential catalog",
        statements: &[
            "CREATE TABLE credentials (
                id TEXT PRIMARY KEY,
                tenant_id TEXT NOT NULL REFERENCES tenants(id),
                scope_key TEXT NOT NULL,
                name TEXT NOT NULL,
                metadata TEXT NOT NULL,
                sealed_value TEXT NOT NULL,
                updated_at_ms BIGINT NOT NULL
            )",
            "CREATE UNIQUE INDEX credentials_name ON credentials (tenant_id, scope_key, name)",
            "CREATE TABLE credential_catalog (
                id BIGINT PRIMARY KEY,
                revision BIGINT NOT NULL
            )",
            "INSERT INTO credential_catalog (id, revision) VALUES (1, 0)",
        ],
    },
    // Snapshots in object storage (`db::stored_snapshots`): a suspend's, tracked from before
    // its upload starts (`uploading`, naming the replica that drives it) until it is
    // `committed` (every artifact stored and checked, in one transaction with its
    // artifacts) or `abandoned`; and the snapshot a suspended sandbox resumes from.
    Migration {
        version: 11,
        description: "stored snapshots",
        statements: &[
            "CREATE TABLE stored_snapshots (
                id TEXT PRIMARY KEY,
                sandbox_id TEXT NOT NULL,
                tenant_id TEXT NOT NULL REFERENCES tenants(id),
                state TEXT NOT NULL,
                node TEXT NOT NULL,
                replica TEXT,
                manifest TEXT,
                created_at_ms BIGINT NOT NULL,
                committed_at_ms BIGINT
            )",
            "CREATE INDEX stored_snapshots_sandbox ON stored_snapshots (sandbox_id, state)",
            "CREATE INDEX stored_snapshots_state ON stored_snapshots (state)",
            "CREATE TABLE stored_artifacts (
                snapshot_id TEXT NOT NULL REFERENCES stored_snapshots(id),
                name TEXT NOT NULL,
                object_key TEXT NOT NULL,
                size BIGINT NOT NULL,
                sha256 TEXT NOT NULL,
                PRIMARY KEY (snapshot_id, name)
            )",
            "ALTER TABLE sandboxes ADD COLUMN suspended_snapshot TEXT",
        ],
    },
    // A restorable sandbox's last checkpoint in object storage (`on_node_loss: restore`):
    // a committed stored snapshot it is not suspended in, kept until a newer one commits.
    Migration {
        version: 12,
        description: "stored checkpoints",
        statements: &[
            "ALTER TABLE sandboxes ADD COLUMN stored_checkpoint TEXT",
            "ALTER TABLE sandboxes ADD COLUMN stored_checkpoint_at_ms BIGINT",
        ],
    },
    // Persistent snapshots kept in object storage (`snapshot_storage: object_store`): a
    // committed one is the tenant's until deleted, whatever becomes of its sandbox or node;
    // `info` and `origin` describe it for listings and creates without asking a node.
    Migration {
        version: 13,
        description: "persistent snapshots in object storage",
        statements: &[
            "ALTER TABLE stored_snapshots ADD COLUMN persistent BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE stored_snapshots ADD COLUMN info TEXT",
            "ALTER TABLE stored_snapshots ADD COLUMN origin TEXT",
            "CREATE INDEX stored_snapshots_tenant ON stored_snapshots (tenant_id, persistent, state)",
        ],
    },
    // Customer keys (`db::customer_keys`): a tenant's key at one of the operator's key
    // services, in versions (a rotation adds one; how SPACE reaches each is sealed under
    // the control plane's credential key), and the data keys wrapped under them, one per
    // artifact sealed at rest.
    Migration {
        version: 14,
        description: "customer keys and data keys",
        statements: &[
            "CREATE TABLE customer_keys (
                tenant_id TEXT PRIMARY KEY REFERENCES tenants(id),
                current_version BIGINT NOT NULL,
                created_at_ms BIGINT NOT NULL,
                updated_at_ms BIGINT NOT NULL
            )",
            "CREATE TABLE customer_key_versions (
                tenant_id TEXT NOT NULL REFERENCES tenants(id),
                version BIGINT NOT NULL,
                provider TEXT NOT NULL,
                key_id TEXT NOT NULL,
                sealed_access TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL,
                PRIMARY KEY (tenant_id, version)
            )",
            "CREATE TABLE data_keys (
                id TEXT PRIMARY KEY,
                tenant_id TEXT NOT NULL REFERENCES tenants(id),
                key_version BIGINT NOT NULL,
                wrapped TEXT NOT NULL,
                artifact TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL
            )",
            "CREATE INDEX data_keys_tenant ON data_keys (tenant_id, key_version)",
        ],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_increase() {
        for pair in MIGRATIONS.windows(2) {
            assert!(pair[0].version < pair[1].version);
        }
        assert!(MIGRATIONS
            .iter()
            .all(|m| m.version > 0 && !m.statements.is_empty()));
    }
}

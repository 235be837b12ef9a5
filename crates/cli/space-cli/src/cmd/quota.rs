//! `space quota`: a tenant's limits and usage; the operator sets and clears tenants' own.

use clap::{Args, Subcommand};
use space_core::quota::TenantQuota;

use crate::render;
use crate::Global;

/// `space quota …`.
#[derive(Subcommand, Debug)]
pub enum QuotaCmd {
    /// Limits in effect and usage: the caller's, or (operator) a named tenant's.
    Show {
        /// A tenant by name (the operator's key only).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Sets a tenant's own limits, over the operator's defaults (the operator's key only).
    /// Fields not given keep the defaults.
    Set {
        /// The tenant's name.
        tenant: String,
        #[command(flatten)]
        limits: Limits,
    },
    /// Clears a tenant's own limits: the defaults apply (the operator's key only).
    Clear {
        /// The tenant's name.
        tenant: String,
    },
}

/// The limits of `space quota set`.
#[derive(Args, Debug)]
pub struct Limits {
    /// Sandboxes at once.
    #[arg(long)]
    max_sandboxes: Option<u64>,
    /// vCPUs of its sandboxes, summed.
    #[arg(long)]
    max_vcpus: Option<u64>,
    /// Memory of its sandboxes, MiB, summed.
    #[arg(long)]
    max_memory_mib: Option<u64>,
    /// Bytes of its snapshots and checkpoints.
    #[arg(long)]
    max_snapshot_bytes: Option<u64>,
    /// Credentials stored.
    #[arg(long)]
    max_credentials: Option<u64>,
    /// Snapshot diffs at once.
    #[arg(long)]
    max_concurrent_diffs: Option<u64>,
    /// Egress connections its sandboxes hold open at once on each node.
    #[arg(long)]
    max_connections: Option<u64>,
    /// Requests per second of each of its API keys.
    #[arg(long)]
    requests_per_sec: Option<u64>,
    /// Requests an API key may make at once above that rate.
    #[arg(long)]
    request_burst: Option<u64>,
}

impl Limits {
    fn quota(&self) -> TenantQuota {
        TenantQuota {
            max_sandboxes: self.max_sandboxes,
            max_vcpus: self.max_vcpus,
            max_memory_mib: self.max_memory_mib,
            max_snapshot_bytes: self.max_snapshot_bytes,
            max_credentials: self.max_credentials,
            max_concurrent_diffs: self.max_concurrent_diffs,
            max_connections: self.max_connections,
            requests_per_sec: self.requests_per_sec,
            request_burst: self.request_burst,
        }
    }
}

/// Runs a quota command.
pub async fn run(g: &Global, c: QuotaCmd) -> anyhow::Result<u8> {
    let client = g.client()?;
    match c {
        QuotaCmd::Show { tenant: None } => render::json(&client.my_quota().await?)?,
        QuotaCmd::Show { tenant: Some(name) } => render::json(&client.tenant_quota(&name).await?)?,
        QuotaCmd::Set { tenant, limits } => {
            render::json(&client.set_tenant_quota(&tenant, &limits.quota()).await?)?
        }
        QuotaCmd::Clear { tenant } => client.clear_tenant_quota(&tenant).await?,
    }
    Ok(0)
}

//! `space audit`: the tenant's action log (list, verify) and the credential audit log.

use clap::{Args, Subcommand};
use space_control::api::audit::{AuditLog, AuditLogParams};

use crate::Global;

/// `space audit …`.
#[derive(Subcommand, Debug)]
pub enum AuditCmd {
    /// The action log: every control-plane action, one JSON object per line.
    List(ListArgs),
    /// Fetches the whole action log and checks its hash chain: a record edited, removed
    /// or inserted is named, and the exit status is 1. Prints the head (`SEQ:HASH`): kept
    /// elsewhere and given back with `--head`, it also catches a rewrite of the whole chain.
    Verify(VerifyArgs),
    /// The credential audit log: every resolution, injection and denial.
    Credentials(CredentialArgs),
}

/// `space audit list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only records at or after this instant (ms since the Unix epoch).
    #[arg(long)]
    since_ms: Option<i64>,
    /// Only records before this instant.
    #[arg(long)]
    until_ms: Option<i64>,
    /// Only this action (`POST /v1/sandboxes/{id}/pause`, `api_key.revoke`, …).
    #[arg(long)]
    action: Option<String>,
    /// Only targets starting with this (`/v1/sandboxes/sbx-…`).
    #[arg(long)]
    target: Option<String>,
    /// Only this outcome (`ok` or an error code).
    #[arg(long)]
    outcome: Option<String>,
    /// Only what this API key (by id) did.
    #[arg(long)]
    api_key_id: Option<String>,
    /// At most this many records (default: all).
    #[arg(long)]
    limit: Option<usize>,
}

/// `space audit verify`.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// A head printed by an earlier verify (`SEQ:HASH`): that record must still be in the
    /// chain with that hash.
    #[arg(long)]
    head: Option<String>,
}

/// `space audit credentials`.
#[derive(Args, Debug)]
pub struct CredentialArgs {
    /// Only this sandbox's entries.
    #[arg(long)]
    sandbox: Option<String>,
    /// Only this credential's entries.
    #[arg(long)]
    credential: Option<String>,
    /// Only entries at or after this instant (ms since the Unix epoch).
    #[arg(long)]
    since_ms: Option<i64>,
    /// At most this many, the most recent (default 100).
    #[arg(long)]
    limit: Option<usize>,
}

/// Records per page fetched.
const PAGE: usize = 1000;

/// Runs an audit command.
pub async fn run(g: &Global, c: AuditCmd) -> anyhow::Result<u8> {
    let client = g.client()?;
    match c {
        AuditCmd::List(a) => {
            let params = AuditLogParams {
                since_ms: a.since_ms,
                until_ms: a.until_ms,
                action: a.action,
                target: a.target,
                outcome: a.outcome,
                api_key_id: a.api_key_id,
                ..Default::default()
            };
            each_page(&client, params, a.limit, |page| {
                for r in &page.records {
                    println!("{}", serde_json::to_string(r)?);
                }
                Ok(())
            })
            .await?;
            Ok(0)
        }
        AuditCmd::Verify(a) => verify(&client, a.head.as_deref()).await,
        AuditCmd::Credentials(a) => {
            let list = client
                .credential_audit(
                    a.sandbox.as_deref(),
                    a.credential.as_deref(),
                    a.since_ms,
                    a.limit,
                )
                .await?;
            for e in &list.events {
                println!("{}", serde_json::to_string(e)?);
            }
            Ok(0)
        }
    }
}

/// Fetches `params`' records page by page, at most `limit` (`None`: all), in chain order,
/// handing each page to `each`.
async fn each_page(
    client: &space_cli::client::SpaceClient,
    mut params: AuditLogParams,
    limit: Option<usize>,
    mut each: impl FnMut(AuditLog) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut left = limit.unwrap_or(usize::MAX);
    while left > 0 {
        params.limit = Some(left.min(PAGE));
        let page = client.audit_log(&params).await?;
        left = left.saturating_sub(page.records.len());
        let next = page.next_after_seq;
        each(page)?;
        match next {
            Some(seq) => params.after_seq = Some(seq),
            None => break,
        }
    }
    Ok(())
}

/// Checks the whole chain here, trusting nothing the server says about it but the
/// records: 0 if intact (and `head`, if given, still in it), 1 (and why) if not.
async fn verify(client: &space_cli::client::SpaceClient, head: Option<&str>) -> anyhow::Result<u8> {
    let head = head
        .map(|h| {
            let (seq, hash) = h
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("--head must be SEQ:HASH, got {h:?}"))?;
            Ok::<_, anyhow::Error>((seq.parse::<i64>()?, hash.to_owned()))
        })
        .transpose()?;
    let mut records = Vec::new();
    let mut first: Option<(String, Option<space_core::audit::AuditAnchor>)> = None;
    each_page(client, AuditLogParams::default(), None, |page| {
        first.get_or_insert_with(|| (page.tenant.clone(), page.anchor.clone()));
        records.extend(page.records);
        Ok(())
    })
    .await?;
    let Some((tenant, anchor)) = first else {
        anyhow::bail!("the server sent no page of the action log");
    };
    if let Err(e) = space_core::audit::verify(&tenant, anchor.as_ref(), &records) {
        println!("broken: {e}");
        return Ok(1);
    }
    if let Some((seq, hash)) = &head {
        let kept = records
            .iter()
            .find(|r| r.seq == *seq)
            .map(|r| r.hash.as_str())
            .or_else(|| {
                anchor
                    .as_ref()
                    .filter(|a| a.seq == *seq)
                    .map(|a| a.hash.as_str())
            });
        match kept {
            Some(h) if h == hash => {}
            Some(_) => {
                println!(
                    "broken: record {seq} is not the one recorded before (the chain was rewritten)"
                );
                return Ok(1);
            }
            None if anchor.as_ref().is_some_and(|a| a.seq > *seq) => {
                println!("note: record {seq} aged out; the chain from the anchor is intact");
            }
            None => {
                println!("broken: record {seq} is missing (the chain was cut back)");
                return Ok(1);
            }
        }
    }
    let from = anchor.as_ref().map_or_else(
        || "its first record".to_owned(),
        |a| format!("record {} (older ones aged out)", a.seq + 1),
    );
    println!(
        "ok: {} records, the chain is intact from {from}",
        records.len()
    );
    if let Some(last) = records.last() {
        println!("head: {}:{}", last.seq, last.hash);
    }
    Ok(0)
}

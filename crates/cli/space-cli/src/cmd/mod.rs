//! One module per command group.

pub mod audit;
pub mod bench;
pub mod cluster;
pub mod credential;
pub mod customer_key;
pub mod egress;
pub mod exec;
pub mod files;
pub mod key;
pub mod node;
pub mod node_manager;
pub mod pool;
pub mod quota;
pub mod sandbox;
pub mod server;
pub mod shell;
pub mod snapshot;
pub mod template;

use std::collections::BTreeMap;

/// Parses `K=V` pairs (for `--env` and `--label`).
pub fn parse_pairs(items: &[String], what: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("{what} must be KEY=VALUE, got {item:?}"))?;
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// Parses a sandbox id argument.
pub fn sandbox_id(s: &str) -> anyhow::Result<space_core::SandboxId> {
    s.parse()
        .map_err(|e| anyhow::anyhow!("bad sandbox id {s:?}: {e}"))
}

/// Parses a snapshot id argument.
pub fn snapshot_id(s: &str) -> anyhow::Result<space_core::SnapshotId> {
    s.parse()
        .map_err(|e| anyhow::anyhow!("bad snapshot id {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs() {
        let m = parse_pairs(&["A=1".into(), "B=x=y".into()], "env").unwrap();
        assert_eq!(m["B"], "x=y");
        assert!(parse_pairs(&["nope".into()], "env").is_err());
    }
}

//! `space egress ...`: a sandbox's egress policy and the tenant's default.
//!
//! A policy is given as a JSON file (`--file`, `-` for stdin) in the API's format, or built
//! from `--allow`/`--deny` domain patterns: `--allow '*.github.com' --allow pypi.org` is an
//! allowlist of those names on any port.

use clap::{Args, Subcommand};
use space_core::egress::{DomainPattern, EgressMode, EgressPolicy, EgressRule};

use super::sandbox_id;
use crate::{render, Global};

/// Egress policy commands.
#[derive(Subcommand, Debug)]
pub enum EgressCmd {
    /// Print a sandbox's policy.
    Get {
        /// Sandbox id.
        id: String,
    },
    /// Replace a sandbox's policy (takes effect at once, also while it runs).
    Set {
        /// Sandbox id.
        id: String,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Print the tenant's default policy for new sandboxes.
    GetDefault,
    /// Set the tenant's default policy for new sandboxes.
    SetDefault {
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Remove the tenant's default (new sandboxes get the node's).
    ClearDefault,
}

/// A policy from the command line.
#[derive(Args, Debug, Default)]
pub struct PolicyArgs {
    /// JSON policy file (`-`: stdin), e.g. `{"mode": "allowlist", "rules": [...]}`.
    #[arg(long, conflicts_with_all = ["allow", "deny", "none"])]
    file: Option<String>,
    /// Allow this domain (`example.com` or `*.example.com`; repeatable): an allowlist.
    #[arg(long, value_name = "DOMAIN")]
    allow: Vec<String>,
    /// Deny this domain (repeatable); without --allow: everything public but these.
    #[arg(long, value_name = "DOMAIN")]
    deny: Vec<String>,
    /// No network at all.
    #[arg(long, conflicts_with_all = ["allow", "deny"])]
    none: bool,
}

impl PolicyArgs {
    /// The policy, or `None` if no policy flag was given.
    pub fn policy(&self) -> anyhow::Result<Option<EgressPolicy>> {
        if let Some(path) = &self.file {
            let text = if path == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read {path}: {e}"))?
            };
            let policy = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("bad egress policy in {path}: {e}"))?;
            return Ok(Some(policy));
        }
        if self.none {
            return Ok(Some(EgressPolicy::default()));
        }
        if self.allow.is_empty() && self.deny.is_empty() {
            return Ok(None);
        }
        let pattern = |d: &String| {
            DomainPattern::parse(d).map_err(|e| anyhow::anyhow!("bad domain {d:?}: {e}"))
        };
        let mut rules = Vec::new();
        for d in &self.allow {
            rules.push(EgressRule::allow(pattern(d)?));
        }
        for d in &self.deny {
            rules.push(EgressRule::deny(pattern(d)?));
        }
        let mode = if self.allow.is_empty() {
            EgressMode::Denylist
        } else {
            EgressMode::Allowlist
        };
        let policy = EgressPolicy { mode, rules };
        policy.validate()?;
        Ok(Some(policy))
    }

    fn required(&self) -> anyhow::Result<EgressPolicy> {
        self.policy()?
            .ok_or_else(|| anyhow::anyhow!("give a policy: --file, --allow/--deny or --none"))
    }
}

/// Runs an egress command.
pub async fn run(g: &Global, c: EgressCmd) -> anyhow::Result<u8> {
    let client = g.client()?;
    let policy = match c {
        EgressCmd::Get { id } => client.egress_policy(&sandbox_id(&id)?).await?,
        EgressCmd::Set { id, policy } => {
            client
                .set_egress_policy(&sandbox_id(&id)?, &policy.required()?)
                .await?
        }
        EgressCmd::GetDefault => client.default_egress_policy().await?,
        EgressCmd::SetDefault { policy } => {
            let p = policy.required()?;
            client.set_default_egress_policy(Some(&p)).await?;
            p
        }
        EgressCmd::ClearDefault => {
            client.set_default_egress_policy(None).await?;
            eprintln!("default egress policy removed: new sandboxes get the node's");
            return Ok(0);
        }
    };
    render::json(&policy)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_build_the_policy() {
        let args = PolicyArgs {
            allow: vec!["*.github.com".into(), "pypi.org".into()],
            deny: vec!["evil.github.com".into()],
            ..Default::default()
        };
        let p = args.policy().unwrap().unwrap();
        assert_eq!(p.mode, EgressMode::Allowlist);
        assert_eq!(p.rules.len(), 3);
        let deny_only = PolicyArgs {
            deny: vec!["x.com".into()],
            ..Default::default()
        };
        assert_eq!(
            deny_only.policy().unwrap().unwrap().mode,
            EgressMode::Denylist
        );
        assert!(PolicyArgs::default().policy().unwrap().is_none());
        let none = PolicyArgs {
            none: true,
            ..Default::default()
        };
        assert_eq!(none.policy().unwrap(), Some(EgressPolicy::default()));
        let bad = PolicyArgs {
            allow: vec!["a b".into()],
            ..Default::default()
        };
        assert!(bad.policy().is_err());
    }
}

//! `space credential ...`: secrets the egress gateway injects into sandbox
//! requests, and what it did with them. Values are read from stdin or a file, never from the
//! command line (which other users can see in the process list).

use std::io::Read;

use clap::{Args, Subcommand};
use space_control::api::credentials::{CredentialRequest, CredentialScope};
use space_secrets::rule::CredentialRule;

use super::sandbox_id;
use crate::{render, Global};

/// Credential commands.
#[derive(Subcommand, Debug)]
pub enum CredentialCmd {
    /// Store a credential; its value is read from stdin (or --value-file).
    Create(CredentialArgs),
    /// Replace a credential (rule, scope and value).
    Replace {
        /// Credential id.
        id: String,
        #[command(flatten)]
        args: CredentialArgs,
    },
    /// List the tenant's credentials (never values).
    #[command(alias = "ls")]
    List,
    /// One credential (never its value).
    Get {
        /// Credential id.
        id: String,
    },
    /// Delete a credential.
    Rm {
        /// Credential id.
        id: String,
    },
}

/// What a credential is and where it goes.
#[derive(Args, Debug)]
pub struct CredentialArgs {
    /// Name, unique within its scope.
    #[arg(long)]
    name: String,
    /// Rule as JSON: `{"hosts": ["api.example.com"], "injection": {"kind": "header",
    /// "name": "Authorization", "template": "Bearer {}"}}` (`@FILE` reads a file).
    #[arg(long)]
    rule: String,
    /// Only for this project's sandboxes.
    #[arg(long, conflicts_with = "sandbox")]
    project: Option<String>,
    /// Only for this sandbox.
    #[arg(long)]
    sandbox: Option<String>,
    /// Expiry, ms since the Unix epoch.
    #[arg(long)]
    expires_at_ms: Option<i64>,
    /// Read the value from this file instead of stdin.
    #[arg(long)]
    value_file: Option<String>,
}

impl CredentialArgs {
    fn request(self) -> anyhow::Result<CredentialRequest> {
        let rule_text = match self.rule.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {path}: {e}"))?,
            None => self.rule,
        };
        let rule: CredentialRule =
            serde_json::from_str(&rule_text).map_err(|e| anyhow::anyhow!("bad --rule: {e}"))?;
        let scope = match (self.project, self.sandbox) {
            (Some(project), _) => CredentialScope::Project { project },
            (None, Some(s)) => CredentialScope::Sandbox {
                sandbox: sandbox_id(&s)?,
            },
            (None, None) => CredentialScope::Tenant,
        };
        let mut value = String::new();
        match &self.value_file {
            Some(path) => std::fs::File::open(path)
                .and_then(|mut f| f.read_to_string(&mut value))
                .map_err(|e| anyhow::anyhow!("cannot read {path}: {e}"))?,
            None => std::io::stdin().read_to_string(&mut value)?,
        };
        // A trailing newline from `echo` or an editor is never part of a token.
        let value = value.trim_end_matches(['\n', '\r']).to_owned();
        Ok(CredentialRequest {
            name: self.name,
            scope,
            rule,
            expires_at_ms: self.expires_at_ms,
            value,
        })
    }
}

/// Runs a credential command.
pub async fn run(g: &Global, c: CredentialCmd) -> anyhow::Result<u8> {
    let client = g.client()?;
    match c {
        CredentialCmd::Create(a) => render::json(&client.create_credential(&a.request()?).await?)?,
        CredentialCmd::Replace { id, args } => {
            render::json(&client.replace_credential(&id, &args.request()?).await?)?
        }
        CredentialCmd::List => render::json(&client.credentials().await?)?,
        CredentialCmd::Get { id } => render::json(&client.credential(&id).await?)?,
        CredentialCmd::Rm { id } => client.delete_credential(&id).await?,
    }
    Ok(0)
}

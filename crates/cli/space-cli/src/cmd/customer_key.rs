//! `space customer-key`: the tenant's own key at one of the operator's key services, which
//! its data at rest is sealed under (`/v1/customer-key`).
//!
//! Credentials come from files (a client certificate and key) or standard input (a PIN),
//! never from the command line, where other users of the machine could read them.

use std::io::Read as _;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use space_control::service::customer_keys::{CustomerKeyRequest, RotateRequest};
use space_kms::KeyCredentials;
use zeroize::Zeroizing;

use crate::render;
use crate::Global;

/// `space customer-key …`.
#[derive(Subcommand, Debug)]
pub enum CustomerKeyCmd {
    /// The key services this server offers.
    Services,
    /// The tenant's customer key: versions, and how many data keys each wraps.
    Show,
    /// Registers the tenant's customer key (it must wrap and unwrap at its key service).
    Set {
        /// The key service (`space customer-key services`).
        #[arg(long)]
        provider: String,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Asks the key service now whether the key is usable.
    Check,
    /// Adds a version (another key, or new credentials) and re-wraps every data key under
    /// it, online; nothing is re-encrypted.
    Rotate {
        /// Another key service (default: the current version's).
        #[arg(long)]
        provider: Option<String>,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Removes the customer key (only once nothing is sealed under it).
    Remove,
}

/// Which key, and how SPACE reaches it.
#[derive(Args, Debug)]
pub struct KeyArgs {
    /// The key at the service: a KMIP unique identifier, a PKCS#11 key label, a helper's
    /// key id (leave out for the local key service, which makes one).
    #[arg(long)]
    key_id: Option<String>,
    /// PKCS#11: the label of the key's token.
    #[arg(long)]
    token: Option<String>,
    /// KMIP: the client certificate (PEM) SPACE authenticates with.
    #[arg(long, value_name = "FILE", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// KMIP: its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// PKCS#11: read the token's user PIN from standard input.
    #[arg(long, conflicts_with = "client_cert")]
    pin_stdin: bool,
}

impl KeyArgs {
    fn credentials(&self) -> anyhow::Result<Option<KeyCredentials>> {
        use anyhow::Context as _;
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            return Ok(Some(KeyCredentials::ClientCertificate {
                certificate_pem: std::fs::read_to_string(cert)
                    .with_context(|| format!("reading {}", cert.display()))?,
                private_key_pem: Zeroizing::new(
                    std::fs::read_to_string(key)
                        .with_context(|| format!("reading {}", key.display()))?,
                ),
            }));
        }
        if self.pin_stdin {
            let mut pin = Zeroizing::new(String::new());
            std::io::stdin()
                .take(4096)
                .read_to_string(&mut pin)
                .context("reading the PIN from standard input")?;
            let trimmed = Zeroizing::new(pin.trim_end_matches(['\n', '\r']).to_owned());
            return Ok(Some(KeyCredentials::Pin { pin: trimmed }));
        }
        Ok(None)
    }
}

/// Runs a customer-key command.
pub async fn run(g: &Global, c: CustomerKeyCmd) -> anyhow::Result<u8> {
    let client = g.client()?;
    match c {
        CustomerKeyCmd::Services => render::json(&client.key_services().await?)?,
        CustomerKeyCmd::Show => render::json(&client.customer_key().await?)?,
        CustomerKeyCmd::Set { provider, key } => {
            let req = CustomerKeyRequest {
                provider,
                credentials: key.credentials()?.unwrap_or_default(),
                key_id: key.key_id,
                token: key.token,
            };
            render::json(&client.set_customer_key(&req).await?)?
        }
        CustomerKeyCmd::Check => render::json(&client.check_customer_key().await?)?,
        CustomerKeyCmd::Rotate { provider, key } => {
            let req = RotateRequest {
                provider,
                credentials: key.credentials()?,
                key_id: key.key_id,
                token: key.token,
            };
            render::json(&client.rotate_customer_key(&req).await?)?
        }
        CustomerKeyCmd::Remove => client.remove_customer_key().await?,
    }
    Ok(0)
}

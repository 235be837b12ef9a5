//! `space cluster init`: makes the cluster CA on a control-plane host (once per cluster).

use std::path::PathBuf;

use clap::Subcommand;

use crate::Global;

/// `space cluster …`.
#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Makes a new cluster CA in DIR (the certificate, its key, and the key replicas sign
    /// API tokens with, both mode 0600). Give every
    /// control-plane replica a copy (`space server --cluster-dir DIR`); nodes never see
    /// the key.
    Init {
        /// Where (default: DATA_DIR/cluster-ca).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// The default cluster directory of a control-plane host.
pub fn default_dir(g: &Global) -> PathBuf {
    g.data_dir.join("cluster-ca")
}

/// Runs a `space cluster` command.
pub async fn run(g: &Global, c: ClusterCmd) -> anyhow::Result<u8> {
    match c {
        ClusterCmd::Init { dir } => {
            let dir = dir.unwrap_or_else(|| default_dir(g));
            let ca = space_control::cluster::authority::init(&dir)?;
            println!("cluster CA and shared token key made in {}", dir.display());
            println!("  fingerprint {}", ca.fingerprint()?);
            println!(
                "run every control-plane replica with --cluster-dir {} --cluster-listen ADDR",
                dir.display()
            );
            Ok(0)
        }
    }
}

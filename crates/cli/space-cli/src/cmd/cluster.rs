//! `space cluster init`: makes the cluster CA on a control-plane host (once per cluster).

use std::path::PathBuf;

use clap::Subcommand;

use crate::Global;

/// `space cluster …`.
#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Makes a new cluster CA in DIR (the certificate, its key, and the keys the replicas
    /// share: one signs API tokens, one seals credential values; all mode 0600). Give every
    /// control-plane replica a copy (`space server --cluster-dir DIR`); nodes never see
    /// them.
    Init {
        /// Where (default: DATA_DIR/cluster-ca).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Keep the CA DIR has; only add the shared keys it lacks (a directory made by an
        /// older version). Then copy DIR to every replica again.
        #[arg(long)]
        add_keys: bool,
    },
}

/// The default cluster directory of a control-plane host.
pub fn default_dir(g: &Global) -> PathBuf {
    g.data_dir.join("cluster-ca")
}

/// Runs a `space cluster` command.
pub async fn run(g: &Global, c: ClusterCmd) -> anyhow::Result<u8> {
    match c {
        ClusterCmd::Init {
            dir,
            add_keys: true,
        } => {
            let dir = dir.unwrap_or_else(|| default_dir(g));
            space_control::cluster::authority::load(&dir)?;
            let made = space_control::cluster::authority::add_shared_keys(&dir)?;
            if made.is_empty() {
                println!("{} has every shared key already", dir.display());
            } else {
                println!("made {} in {}", made.join(", "), dir.display());
                println!("copy the directory to every control-plane replica again");
            }
            Ok(0)
        }
        ClusterCmd::Init {
            dir,
            add_keys: false,
        } => {
            let dir = dir.unwrap_or_else(|| default_dir(g));
            let ca = space_control::cluster::authority::init(&dir)?;
            println!("cluster CA and shared keys made in {}", dir.display());
            println!("  fingerprint {}", ca.fingerprint()?);
            println!(
                "run every control-plane replica with --cluster-dir {} --cluster-listen ADDR",
                dir.display()
            );
            Ok(0)
        }
    }
}

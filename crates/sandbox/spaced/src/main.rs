//! spaced: the space daemon inside every sandbox (init, process and file service over the
//! private channel).
//!
//! `spaced init` runs as PID 1: it mounts the pseudo file systems, starts `spaced agent`,
//! reaps zombies and powers the VM off when the agent dies. `spaced agent` serves the
//! platform's HTTP/2 API (see `space-guest-proto`) over the channel: processes (all in the
//! workload cgroup, `workload.rs`), files (and directory watches) and connections to the
//! guest's TCP ports (`ports.rs`), plus what snapshots, forks and idleness need (file-system
//! freeze `fsfreeze.rs`, identity, activity counters `activity.rs`), and resource use for
//! the node's metrics (`metrics.rs`).

mod activity;
mod agent;
mod api;
mod channel;
mod error;
mod fdstream;
mod files;
mod fsfreeze;
mod fsuser;
mod handshake;
mod init;
mod metrics;
mod mountinfo;
mod netconfig;
mod portbridge;
mod ports;
mod process;
mod resize;
mod session;
mod state;
mod system;
mod trust;
mod users;
mod workload;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::channel::ChannelSpec;

#[derive(Debug, Parser)]
#[command(
    name = "spaced",
    version,
    about = "The space daemon inside every sandbox"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run as PID 1: set up the system, start the agent, reap, power off when it dies.
    Init {
        /// Channel passed to the agent.
        #[arg(long, default_value = "auto")]
        channel: ChannelSpec,
    },
    /// Serve the platform's API on the private channel.
    Agent {
        /// auto | virtio-serial:NAME | vsock:PORT | unix:PATH (unix: listens; development only).
        #[arg(long, default_value = "auto")]
        channel: ChannelSpec,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Init { channel } => init::run(&channel),
        Command::Agent { channel } => agent::run(channel),
    }
}

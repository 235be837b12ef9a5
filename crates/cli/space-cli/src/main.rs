//! `space`: the SPACE command line. `space server` runs the platform; the other commands
//! talk to a server over its HTTP API (`--url`, `--api-key`), except the local admin
//! commands (`key`, `template build|rm`) that work on the data directory directly.

mod build_context;
mod cmd;
mod dockerfile;
mod render;
mod term;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use space_cli::client::{ClientError, SpaceClient};

/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/space";

#[derive(Parser, Debug)]
#[command(
    name = "space",
    version,
    about = "SPACE: sandboxes for AI agents, each a microVM"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command understands.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Server URL.
    #[arg(
        long,
        global = true,
        env = "SPACE_URL",
        default_value = "http://127.0.0.1:7070"
    )]
    pub url: String,
    /// API key (default: the key file in the data directory, if readable).
    #[arg(long, global = true, env = "SPACE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Data directory (database, first API key, node store).
    #[arg(long, global = true, env = "SPACE_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the control plane and a local node.
    Server(Box<cmd::server::ServerArgs>),
    /// Run the node manager: the node's only root process, doing the privileged work of
    /// the sandbox manager (`space server --node-manager`).
    NodeManager(cmd::node_manager::NodeManagerArgs),
    /// The cluster CA (once per cluster, on a control-plane host).
    #[command(subcommand)]
    Cluster(cmd::cluster::ClusterCmd),
    /// A node of a cluster: join and run it (on the node), list, tokens, cordon (the
    /// operator's).
    #[command(subcommand)]
    Node(cmd::node::NodeCmd),
    /// Templates: list (API), build and remove (local store).
    #[command(subcommand)]
    Template(cmd::template::TemplateCmd),
    /// Sandboxes: create, list, get, rm, timeout, pause/resume, stop/start, rollback, fork,
    /// events.
    #[command(subcommand)]
    Sandbox(cmd::sandbox::SandboxCmd),
    /// Snapshots of a sandbox: list, create, rm, diff.
    #[command(subcommand)]
    Snapshot(cmd::snapshot::SnapshotCmd),
    /// The node's warm pool of ready VMs.
    Pool,
    /// Run a command in a sandbox; exits with its exit code.
    Exec(cmd::exec::ExecArgs),
    /// Interactive shell in a sandbox.
    Shell(cmd::shell::ShellArgs),
    /// Files in a sandbox.
    #[command(subcommand)]
    Files(cmd::files::FilesCmd),
    /// The tail of a sandbox's serial console.
    Console(cmd::sandbox::ConsoleArgs),
    /// What may leave a sandbox: its egress policy, and the tenant's default.
    #[command(subcommand)]
    Egress(cmd::egress::EgressCmd),
    /// Credentials the egress gateway injects into sandbox requests (write-only values).
    #[command(subcommand)]
    Credential(cmd::credential::CredentialCmd),
    /// The tenant's own key, which its data at rest is sealed under: register, check,
    /// rotate, remove.
    #[command(subcommand)]
    CustomerKey(cmd::customer_key::CustomerKeyCmd),
    /// The action log (every control-plane action, hash-chained: `space audit verify`)
    /// and the credential audit log.
    #[command(subcommand)]
    Audit(cmd::audit::AuditCmd),
    /// Tenants' quotas: limits and usage.
    #[command(subcommand)]
    Quota(cmd::quota::QuotaCmd),
    /// API keys (local admin on the database).
    #[command(subcommand)]
    Key(cmd::key::KeyCmd),
    /// Measure create latency, exec round trip, file throughput and VMM memory (run on the node).
    Bench(cmd::bench::BenchArgs),
}

impl Global {
    /// The API key: flag or env, else the data directory's key file.
    pub fn api_key(&self) -> Option<String> {
        if let Some(k) = &self.api_key {
            return Some(k.trim().to_owned());
        }
        let path = space_control::bootstrap::api_key_path(&self.data_dir);
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    }

    /// A client for `--url`.
    pub fn client(&self) -> Result<SpaceClient, ClientError> {
        SpaceClient::new(&self.url, self.api_key())
    }
}

fn init_logging(verbose_default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPACE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(verbose_default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Prints an error the CLI way: `error: <message> (<code>)`.
pub fn print_error(err: &anyhow::Error) {
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::Api { body, .. }) => eprintln!("error: {} ({})", body.message, body.code),
        Some(ClientError::Http(e)) if e.is_connect() => eprintln!(
            "error: cannot connect to the server: {e} (is `space server` running? see --url)"
        ),
        _ => eprintln!("error: {err:#}"),
    }
}

fn main() {
    // The jailed image unpacker (`space template build --from`'s child): it must unshare
    // its user namespace while the process has one thread, so before the runtime starts.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == space_images::oci::jail::CHILD_ARG)
    {
        std::process::exit(space_images::oci::jail::child_main());
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(run());
}

async fn run() {
    let cli = Cli::parse();
    init_logging(
        if matches!(
            cli.command,
            Command::Server(_)
                | Command::NodeManager(_)
                | Command::Node(cmd::node::NodeCmd::Run { .. })
        ) {
            "info"
        } else {
            "warn"
        },
    );
    let g = cli.global;
    let result = match cli.command {
        Command::Server(a) => cmd::server::run(&g, *a).await,
        Command::NodeManager(a) => cmd::node_manager::run(&g, a).await,
        Command::Cluster(c) => cmd::cluster::run(&g, c).await,
        Command::Node(c) => cmd::node::run(&g, c).await,
        Command::Template(c) => cmd::template::run(&g, c).await,
        Command::Sandbox(c) => cmd::sandbox::run(&g, c).await,
        Command::Snapshot(c) => cmd::snapshot::run(&g, c).await,
        Command::Pool => cmd::pool::run(&g).await,
        Command::Exec(a) => cmd::exec::run(&g, a).await,
        Command::Shell(a) => cmd::shell::run(&g, a).await,
        Command::Files(c) => cmd::files::run(&g, c).await,
        Command::Console(a) => cmd::sandbox::console(&g, a).await,
        Command::Egress(c) => cmd::egress::run(&g, c).await,
        Command::Credential(c) => cmd::credential::run(&g, c).await,
        Command::Audit(a) => cmd::audit::run(&g, a).await,
        Command::Quota(c) => cmd::quota::run(&g, c).await,
        Command::CustomerKey(c) => cmd::customer_key::run(&g, c).await,
        Command::Key(c) => cmd::key::run(&g, c).await,
        Command::Bench(a) => cmd::bench::run(&g, a).await,
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            print_error(&e);
            1
        }
    };
    // Exit here rather than return: a thread blocked reading our stdin (exec --stdin, shell)
    // would otherwise keep the runtime, and the process, alive.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(i32::from(code));
}

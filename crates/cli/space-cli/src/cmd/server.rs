//! `space server`: runs the control plane with a local node until SIGINT/SIGTERM.

use std::net::SocketAddr;

use clap::Args;
use space_control::api::DEFAULT_MAX_UPLOAD_BYTES;
use space_control::{Server, ServerConfig};

use crate::Global;

/// What the node of this process is like (`space server`'s local node, `space node run`).
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// Accelerator (default: KVM when the CPU has hardware virtualisation, else TCG).
    #[arg(long, value_parser = ["kvm", "tcg"])]
    accel: Option<String>,
    /// Warm VMs kept ready per template shape (0: none; creates then restore or boot).
    #[arg(long)]
    pool_size: Option<usize>,
    /// Give sandboxes no network card at all. By default each VM has one, in a namespace of
    /// its own behind the egress gateway, and each sandbox's egress policy decides what leaves.
    #[arg(long)]
    no_sandbox_network: bool,
    /// The egress policy of sandboxes whose request and tenant name none (JSON file;
    /// default: mode none, no network).
    #[arg(long, value_name = "FILE")]
    egress_default: Option<std::path::PathBuf>,
    /// A non-public network sandboxes' egress policies may open (repeatable), e.g. an
    /// internal package mirror's. Without one, no policy reaches loopback, private, CGNAT,
    /// link-local or metadata addresses, or this node's own addresses: the egress ceiling.
    #[arg(long, value_name = "CIDR")]
    egress_grant: Vec<ipnet::IpNet>,
    /// Upstream DNS server of the gateways (repeatable; default: /etc/resolv.conf's).
    #[arg(long, value_name = "IP:PORT")]
    upstream_dns: Vec<SocketAddr>,
    /// Ask this external helper for credential values instead of the built-in encrypted
    /// store (git-credential-helper style; see docs).
    #[arg(long, value_name = "PROGRAM")]
    credential_helper: Option<std::path::PathBuf>,
    /// The socket of this node's `space node-manager`, which then does every privileged
    /// operation (default: this process does them, and must be root).
    #[arg(long, value_name = "SOCKET", env = "SPACE_NODE_MANAGER")]
    node_manager: Option<std::path::PathBuf>,
    /// Where suspended sandboxes' snapshots go: a JSON file, `{"kind": "s3", "endpoint":
    /// …, "region": …, "bucket": …, "access_key_id": …, "secret_access_key_file": …}` or
    /// `{"kind": "local", "dir": …}` (default: DATA_DIR/objects, for one machine). Every
    /// node and control-plane replica of a cluster names the same store.
    #[arg(long, value_name = "FILE")]
    object_store: Option<std::path::PathBuf>,
    /// A template made ready at start (memory image, warm pool), so the first sandbox of
    /// it is as quick as the next (repeatable; default: `base`). `--warm-template none`
    /// warms nothing.
    #[arg(long, value_name = "NAME")]
    warm_template: Vec<String>,
    /// A registry (`HOST:PORT`) template builds speak plain HTTP to, e.g. an internal one
    /// without TLS (repeatable; every other registry is reached over TLS).
    #[arg(long, value_name = "HOST")]
    registry_plain_http: Vec<String>,
    /// CA certificates (PEM) template builds trust for registries, besides the system's.
    #[arg(long, value_name = "FILE")]
    registry_ca: Option<std::path::PathBuf>,
}

impl NodeArgs {
    /// The object store the options name, if any.
    pub fn object_store(&self) -> anyhow::Result<Option<space_objects::ObjectStoreConfig>> {
        self.object_store
            .as_deref()
            .map(space_objects::ObjectStoreConfig::load)
            .transpose()
            .map_err(anyhow::Error::from)
    }
}

impl NodeArgs {
    /// Applies the options to a node's configuration.
    pub fn apply(self, node: &mut space_node::NodeConfig) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.node_manager.is_some() || nix::unistd::geteuid().is_root(),
            "without --node-manager, the node does its privileged work itself (the store's \
             mount, network namespaces, VMM jails) and must run as root: start `space \
             node-manager --client {}` as root and pass its socket with --node-manager",
            nix::unistd::getuid()
        );
        if let Some(store) = self.object_store()? {
            node.object_store = Some(store);
        }
        node.accel = self.accel;
        if let Some(n) = self.pool_size {
            node.pool_size = n;
        }
        node.sandbox_network = !self.no_sandbox_network;
        if let Some(path) = &self.egress_default {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            node.egress = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("bad egress policy in {}: {e}", path.display()))?;
        }
        node.egress_grants = self.egress_grant;
        if !self.warm_template.is_empty() {
            node.warm_templates = self
                .warm_template
                .into_iter()
                .filter(|t| t != "none")
                .collect();
        }
        node.registry_plain_http = self.registry_plain_http;
        if let Some(path) = &self.registry_ca {
            node.registry_ca_pem = Some(
                std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?,
            );
        }
        node.upstream_dns = self.upstream_dns;
        node.node_manager = self.node_manager;
        if let Some(program) = self.credential_helper {
            node.credentials = space_node::config::CredentialBackend::Command(
                space_secrets::CommandConfig::new(program),
            );
        }
        Ok(())
    }
}

/// Options of `space server`.
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, default_value = space_control::server::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Database: sqlite:PATH or postgres://... (default: SQLite in the data directory).
    #[arg(long, env = "SPACE_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Largest file upload, bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_UPLOAD_BYTES)]
    max_upload_bytes: u64,
    /// Node name shown in sandbox records.
    #[arg(long)]
    node_name: Option<String>,
    /// The domain sandbox hosts of the E2B-compatible API are named under
    /// (`{port}-{sandbox id}.DOMAIN`, what the E2B SDKs' `get_host(port)` returns); may carry
    /// a port. Point E2B_DOMAIN at it, and E2B_API_URL and E2B_SANDBOX_URL at this server.
    #[arg(long, value_name = "DOMAIN", default_value = space_e2b::surface::DEFAULT_DOMAIN)]
    e2b_domain: String,
    /// How long a sandbox's E2B envd and traffic tokens stay valid after they were last
    /// handed out (create, connect and get renew them), seconds.
    #[arg(long, value_name = "SECS", default_value_t = space_e2b::surface::DEFAULT_TOKEN_TTL_SECS)]
    e2b_token_ttl_secs: u64,
    /// Accepted for old scripts, and ignored: sandbox ports are private by default now (a
    /// create request's `public_ports`, or E2B's `allowPublicTraffic`, makes them public).
    #[arg(long, hide = true)]
    e2b_private_ports: bool,
    /// Do not serve the E2B-compatible API (only SPACE's own `/v1`).
    #[arg(long)]
    no_e2b: bool,
    /// Also serve everything over TLS on this address (with --tls-cert and --tls-key). The
    /// E2B SDKs reach sandboxes at https://{port}-{sandbox id}.DOMAIN when E2B_SANDBOX_URL
    /// is not set: give a certificate for *.DOMAIN (--e2b-domain).
    #[arg(long, value_name = "ADDR", requires_all = ["tls_cert", "tls_key"])]
    tls_listen: Option<SocketAddr>,
    /// PEM certificate chain of the TLS listener, leaf first.
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of the TLS listener.
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    tls_key: Option<std::path::PathBuf>,
    /// Serve TLS only (--tls-listen): no plaintext HTTP on --listen. For servers other
    /// hosts reach, so that keys and tokens never cross the network in clear.
    #[arg(long, requires = "tls_listen")]
    no_plaintext_listener: bool,
    /// How many days the action log and the credential decision log keep a record (older
    /// ones are removed; the action log keeps the chain's anchor so the rest still
    /// verifies).
    #[arg(long, value_name = "DAYS", default_value_t = space_control::server::DEFAULT_AUDIT_RETENTION_DAYS,
          value_parser = clap::value_parser!(u64).range(1..=36_500))]
    audit_retention_days: u64,
    /// The operator's quota for every tenant, as JSON (`{"max_sandboxes": 20,
    /// "requests_per_sec": 50, …}`; fields left out keep the embedded defaults). A
    /// tenant's own (`space quota set`) overrides it field by field.
    #[arg(long, value_name = "FILE")]
    default_quota: Option<std::path::PathBuf>,
    /// Run as a replica of a cluster: no node of its own, the nodes that joined (see
    /// `space cluster init`, `space node join`). The directory holds the cluster CA; give
    /// every replica the same one, and the same --database-url (PostgreSQL).
    #[arg(long, value_name = "DIR", requires = "cluster_listen")]
    cluster_dir: Option<std::path::PathBuf>,
    /// Where nodes reach this replica's membership service (with --cluster-dir).
    #[arg(long, value_name = "ADDR", requires = "cluster_dir")]
    cluster_listen: Option<SocketAddr>,
    /// A node silent this long is declared lost, with its sandboxes (seconds).
    #[arg(long, value_name = "SECS", default_value_t = space_control::cluster::DEFAULT_HEARTBEAT_TIMEOUT.as_secs())]
    heartbeat_timeout_secs: u64,
    /// The key services tenants' customer keys may be at, as JSON (`{"providers": {"corp":
    /// {"kind": "kmip", "address": "kms:5696", "ca_file": …}, "hsm": {"kind": "pkcs11",
    /// "module": …}, "cloud": {"kind": "command", "program": …}, "local": {"kind":
    /// "local", "master_key_dir": …}}}`; default: the local one alone, keys in
    /// /etc/space/local-kms). Every replica of a cluster names the same ones.
    #[arg(long, value_name = "FILE")]
    key_services: Option<std::path::PathBuf>,
    /// How long a passed check of a tenant's customer key is trusted before its key service
    /// is asked again (every start, resume and restore needs a passed check).
    #[arg(long, value_name = "SECS", default_value_t = space_control::service::customer_keys::DEFAULT_CHECK_TTL.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    customer_key_check_ttl_secs: u64,
    #[command(flatten)]
    node: NodeArgs,
}

/// Runs the server.
pub async fn run(g: &Global, a: ServerArgs) -> anyhow::Result<u8> {
    let mut cfg = ServerConfig::new(&g.data_dir);
    cfg.listen = a.listen;
    cfg.database_url = a.database_url;
    cfg.max_upload_bytes = a.max_upload_bytes;
    if let (Some(listen), Some(cert), Some(key)) = (a.tls_listen, a.tls_cert, a.tls_key) {
        cfg.tls = Some(space_control::tls::TlsListen { listen, cert, key });
    }
    cfg.plaintext = !a.no_plaintext_listener;
    cfg.audit_retention = std::time::Duration::from_secs(a.audit_retention_days * 86_400);
    cfg.node.credential_audit.retention_days = a.audit_retention_days;
    if let Some(path) = &a.default_quota {
        use anyhow::Context as _;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the default quota {}", path.display()))?;
        let own: space_core::quota::TenantQuota = serde_json::from_str(&text)
            .with_context(|| format!("parsing the default quota {}", path.display()))?;
        own.validate().map_err(anyhow::Error::msg)?;
        cfg.default_quota = own.over(&space_core::quota::TenantQuota::embedded_default());
    }
    if let Some(path) = &a.key_services {
        cfg.key_services = space_kms::KmsConfig::from_file(path)?;
    }
    cfg.customer_key_check_ttl = std::time::Duration::from_secs(a.customer_key_check_ttl_secs);
    if let Some(name) = a.node_name {
        cfg.node.node_name = name;
    }
    if let (Some(dir), Some(listen)) = (a.cluster_dir, a.cluster_listen) {
        let mut cluster = space_control::cluster::ClusterConfig::new(dir, listen);
        cluster.heartbeat_timeout = std::time::Duration::from_secs(a.heartbeat_timeout_secs.max(1));
        cfg.cluster = Some(cluster);
        cfg.object_store = a.node.object_store()?;
    } else {
        a.node.apply(&mut cfg.node)?;
    }
    if a.e2b_private_ports {
        tracing::warn!("--e2b-private-ports is obsolete: sandbox ports are private by default");
    }
    let e2b = (!a.no_e2b).then(|| space_e2b::E2bConfig {
        domain: a.e2b_domain.clone(),
        token_ttl_secs: a.e2b_token_ttl_secs,
    });
    if let Some(config) = &e2b {
        cfg.surface = Some(std::sync::Arc::new(space_e2b::E2bApi::new(config.clone())));
    }
    let server = Server::start(cfg).await?;
    let url = server.url();
    println!("SPACE listening on {url}");
    if let Some(tls) = server.tls_addr() {
        println!("  and on https://{tls}");
    }
    let key_file = server.api_key_file().display().to_string();
    match server.first_api_key() {
        Some(key) => {
            println!();
            println!("API key (shown once; also saved to {key_file}, mode 0600):");
            println!("  {key}");
        }
        None => println!("API key: in {key_file} (created on first start), or make one with `space key create --tenant NAME`"),
    }
    if let Some(addr) = server.cluster_addr() {
        println!(
            "Cluster replica: nodes join at {addr} (space node token create; space node join)"
        );
        println!();
        server.run_until_signal().await?;
        return Ok(0);
    }
    let templates = server.local_node().templates().unwrap_or_default();
    println!();
    println!("Try it:");
    if !url.ends_with(":7070") || !url.contains("127.0.0.1") {
        println!("  export SPACE_URL={url}");
    }
    println!("  export SPACE_API_KEY=$(cat {key_file})");
    match templates.first() {
        Some(t) => println!("  ID=$(space sandbox create --template {} --quiet)", t.name),
        None => {
            println!("  space template build base          # no templates yet");
            println!("  ID=$(space sandbox create --template base --quiet)");
        }
    }
    println!("  space exec $ID -- uname -a");
    println!("  space shell $ID");
    println!("  space sandbox rm $ID");
    if let Some(config) = &e2b {
        println!();
        println!("E2B SDKs (docs/e2b-compat.md):");
        println!("  export E2B_API_KEY=$(space key convert --format e2b < {key_file})");
        println!("  export E2B_API_URL={url} E2B_SANDBOX_URL={url}");
        let domain = config.advertised_domain(server.addr(), server.tls_addr());
        println!("  export E2B_DOMAIN={domain}");
        if server.tls_addr().is_some() {
            println!("  (or, where *.{} resolves to this server, leave E2B_SANDBOX_URL unset: the SDKs then use https://{{port}}-{{id}}.{domain})", config.host_domain());
        }
    }
    println!();
    server.run_until_signal().await?;
    Ok(0)
}

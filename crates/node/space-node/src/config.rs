//! Node configuration and the capacity a node offers by default.

use std::path::PathBuf;

use space_core::NodeCapacity;

/// How to run this node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Name reported in sandbox records.
    pub node_name: String,
    /// Data directory (on btrfs, or a loop-mounted btrfs image is created in it).
    pub data_dir: PathBuf,
    /// What sandboxes may use in total; `None` = derived from the host.
    pub capacity: Option<NodeCapacity>,
    /// Accelerator override: "kvm" or "tcg"; `None` = detect.
    pub accel: Option<String>,
    /// Size of the sparse btrfs image when the data dir is not on btrfs.
    pub loop_size_bytes: u64,
    /// Seconds a booting sandbox has to report ready.
    pub ready_timeout_secs: u64,
    /// TCG translation cache per VM, MiB (bounds VMM memory under TCG).
    pub tcg_tb_size_mib: Option<u32>,
    /// Start sandboxes from memory images of their templates (saved once per template and
    /// shape) instead of booting them.
    pub memory_images: bool,
    /// Warm pool members kept per template shape that creates ask for (0 = no pool).
    pub pool_size: usize,
    /// Give every sandbox VM a network card in a network namespace of its own, behind the
    /// default-deny firewall of `space_net::datapath`, with an egress gateway (resolver and
    /// proxy) that lets out what the sandbox's egress policy allows.
    pub sandbox_network: bool,
    /// Egress policy of a sandbox whose create request (and tenant) names none.
    pub egress: space_core::egress::EgressPolicy,
    /// Non-public networks the operator opens to sandboxes' egress policies (`--egress-grant`);
    /// everything else non-public, and the node's own addresses, stay beyond every policy
    /// ([`space_core::egress::EgressCeiling`]).
    pub egress_grants: Vec<ipnet::IpNet>,
    /// Where credential values live (metadata and values, encrypted, or an external helper).
    pub credentials: CredentialBackend,
    /// Bounds of the credential decision log (retention, each tenant's bytes per day,
    /// collapsing of repeated denials).
    pub credential_audit: space_secrets::audit::AuditLimits,
    /// Network namespace the gateways connect out from; `None`: this process's (the host's).
    pub uplink_netns: Option<String>,
    /// Upstream DNS servers of the gateways; empty: those of `/etc/resolv.conf`.
    pub upstream_dns: Vec<std::net::SocketAddr>,
    /// PEM certificates trusted for upstream TLS besides the public roots (tests).
    pub upstream_extra_ca_pem: Option<String>,
    /// How often running sandboxes' resource use is sampled (`Node::metrics`).
    pub metrics_interval: std::time::Duration,
    /// Run every VMM in a jail of its own (`space_vmm::jail`). Off only to measure what the
    /// jail costs: unjailed VMMs run as root, unconfined.
    pub vmm_jail: bool,
    /// The socket of this node's `space node-manager`, which then does every privileged
    /// operation (and `vmm_jail` is its setting, not this one). `None`: they are done in
    /// this process, which must be root.
    pub node_manager: Option<std::path::PathBuf>,
    /// Where suspended sandboxes' snapshots go (and come from): `None` refuses suspend and
    /// resume.
    pub object_store: Option<space_objects::ObjectStoreConfig>,
    /// Publish this node's templates and kernel bundles to the object store, for nodes
    /// that lack them (a cluster's nodes; not the single machine, whose store only it
    /// reads).
    pub publish_templates: bool,
    /// Templates made ready at start (memory image made, warm pool filled), so that even
    /// the first sandbox of them after a start is quick; those the node lacks are skipped.
    pub warm_templates: Vec<String>,
    /// Registries (`HOST[:PORT]`) template builds speak plain HTTP to (an operator's own
    /// registry on a private network); every other one is reached over TLS, trusting the
    /// system's roots and `registry_ca_pem`.
    pub registry_plain_http: Vec<String>,
    /// PEM CA certificates template builds trust for registries besides the system's (a
    /// private registry's).
    pub registry_ca_pem: Option<String>,
    /// The cluster's credential placeholder key file, given at join (it must exist): a
    /// sandbox that moves between nodes keeps its placeholders. `None`: the node's own
    /// `placeholder.key` in its data directory, created on first use.
    pub placeholder_key: Option<PathBuf>,
}

/// Where the node's credential manager keeps credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialBackend {
    /// The built-in store: `<data_dir>/credentials/`, one file per credential encrypted
    /// with XChaCha20-Poly1305 under `<data_dir>/credentials.key` (made on first start,
    /// mode 0600; keep it off backups of the data directory).
    Store,
    /// An external helper asked for values (git-credential-helper style; see
    /// `space_secrets::command`).
    Command(space_secrets::CommandConfig),
}

/// Default warm pool members per template shape. A paused member costs no CPU and about
/// 45 MiB of host memory (it shares the image's pages), so 32 cost ~1.4 GiB; the pool sheds
/// members when host memory runs low. Under TCG a member takes ~0.5 s of CPU to make, so a
/// burst of creates outruns the refill: the pool is sized to absorb bursts.
pub const DEFAULT_POOL_SIZE: usize = 32;
/// Size of the store's btrfs image when the data directory is not on btrfs.
pub const DEFAULT_STORE_SIZE: u64 = 64 << 30;

impl NodeConfig {
    /// A config with defaults for everything but the data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            node_name: "local".into(),
            data_dir: data_dir.into(),
            capacity: None,
            accel: None,
            loop_size_bytes: DEFAULT_STORE_SIZE,
            ready_timeout_secs: 120,
            tcg_tb_size_mib: Some(64),
            memory_images: true,
            pool_size: DEFAULT_POOL_SIZE,
            sandbox_network: true,
            egress: Default::default(),
            egress_grants: Vec::new(),
            credentials: CredentialBackend::Store,
            credential_audit: Default::default(),
            uplink_netns: None,
            upstream_dns: Vec::new(),
            upstream_extra_ca_pem: None,
            metrics_interval: crate::metrics::DEFAULT_METRICS_INTERVAL,
            vmm_jail: true,
            node_manager: None,
            object_store: None,
            publish_templates: false,
            placeholder_key: None,
            registry_plain_http: Vec::new(),
            registry_ca_pem: None,
            warm_templates: vec!["base".into()],
        }
    }
}

/// Longest data directory path: sandbox sockets live under `<data_dir>/run/<id>/`, and
/// Unix socket paths are limited to 107 bytes.
pub const MAX_DATA_DIR_LEN: usize = 60;

/// vCPUs handed out per host core by default.
pub const VCPU_OVERCOMMIT: u32 = 8;

/// Default capacity: vCPUs overcommitted 8× the host's cores (agent sandboxes idle most of
/// the time), 80 % of host memory, and the
/// store's size for disks (sandbox disks are sparse reflinks, this bounds the worst case).
pub fn default_capacity(store_bytes: u64) -> NodeCapacity {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| parse_mem_total_kib(&s))
        .unwrap_or(1 << 20);
    NodeCapacity {
        vcpus: cores * VCPU_OVERCOMMIT,
        memory_mib: mem_kib / 1024 * 8 / 10,
        disk_mib: store_bytes >> 20,
    }
}

fn parse_mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

impl NodeConfig {
    /// The certificates of `upstream_extra_ca_pem`.
    pub(crate) fn upstream_extra_roots(
        &self,
    ) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, crate::NodeError> {
        let Some(pem) = &self.upstream_extra_ca_pem else {
            return Ok(Vec::new());
        };
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| crate::NodeError::Invalid(format!("upstream_extra_ca_pem: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        assert_eq!(
            parse_mem_total_kib("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24576000)
        );
        assert_eq!(parse_mem_total_kib("nothing"), None);
    }
}

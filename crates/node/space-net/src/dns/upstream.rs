//! Where the resolver looks allowed names up: the [`Upstream`] trait, and
//! [`HickoryUpstream`], the real one (hickory-resolver, a stub resolver talking to the
//! node's own name servers).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_proto::rr::{RData, RecordType};
use hickory_proto::xfer::Protocol;
use hickory_resolver::config::{
    NameServerConfig, NameServerConfigGroup, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::{Name, TokioResolver};
use space_core::egress::Hostname;

/// One address an upstream lookup returned, with its remaining TTL in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamAddr {
    /// The address (A or AAAA data).
    pub addr: IpAddr,
    /// Seconds the upstream says it may be cached.
    pub ttl: u32,
}

/// Why an upstream lookup gave no address. "The name exists but has no record of this
/// type" is not an error: it is `Ok` with no address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The name does not exist (NXDOMAIN).
    #[error("the name does not exist")]
    NxDomain,
    /// The lookup failed (timeout, SERVFAIL, unreachable name servers, …).
    #[error("upstream lookup failed: {0}")]
    Failed(String),
}

/// Looks names up for the resolver. Shared by every sandbox of the node (`Arc`).
pub trait Upstream: Send + Sync + 'static {
    /// The addresses of `name` of `record_type` (only ever `A` or `AAAA`). `name` is
    /// absolute: no search domain may be appended.
    fn lookup(
        &self,
        name: &Hostname,
        record_type: RecordType,
    ) -> impl Future<Output = Result<Vec<UpstreamAddr>, UpstreamError>> + Send;
}

/// Why the real upstream could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamConfigError {
    /// `/etc/resolv.conf` could not be read or parsed.
    #[error("reading the system resolver configuration: {0}")]
    SystemConf(String),
    /// No name server to ask.
    #[error("no upstream name server configured")]
    NoNameServers,
}

/// The real upstream: hickory-resolver over UDP (TCP when an answer is truncated) to the
/// node's name servers.
///
/// Queries are made from the node's own network namespace: hickory opens its sockets per
/// query on the thread that runs it, and the node's runtime threads never stay in a
/// sandbox's namespace. Its cache is shared by all sandboxes of the node (a sandbox could
/// time whether another recently looked a name up; names are not secrets of a tenant, and
/// the cache spares the upstream).
#[derive(Clone)]
pub struct HickoryUpstream {
    resolver: TokioResolver,
}

impl std::fmt::Debug for HickoryUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HickoryUpstream")
            .field("name_servers", &self.resolver.config().name_servers())
            .finish()
    }
}

impl HickoryUpstream {
    /// The name servers of the node's `/etc/resolv.conf` (only them: its `search`, `domain`
    /// and options are ignored, and so is `/etc/hosts`).
    pub fn from_system_conf() -> Result<Self, UpstreamConfigError> {
        let (config, _options) = hickory_resolver::system_conf::read_system_conf()
            .map_err(|e| UpstreamConfigError::SystemConf(e.to_string()))?;
        Self::from_name_server_configs(config.name_servers().to_vec())
    }

    /// These name servers (plain DNS, UDP then TCP, each at its own port: tests run theirs
    /// on loopback).
    pub fn with_name_servers(servers: &[SocketAddr]) -> Result<Self, UpstreamConfigError> {
        let mut configs = Vec::with_capacity(servers.len() * 2);
        for server in servers {
            for protocol in [Protocol::Udp, Protocol::Tcp] {
                let mut config = NameServerConfig::new(*server, protocol);
                config.trust_negative_responses = true;
                configs.push(config);
            }
        }
        Self::from_name_server_configs(configs)
    }

    fn from_name_server_configs(
        servers: Vec<NameServerConfig>,
    ) -> Result<Self, UpstreamConfigError> {
        if servers.is_empty() {
            return Err(UpstreamConfigError::NoNameServers);
        }
        let config =
            ResolverConfig::from_parts(None, Vec::new(), NameServerConfigGroup::from(servers));
        let mut options = ResolverOpts::default();
        // Never answer from the node's /etc/hosts (it names the node's own addresses).
        options.use_hosts_file = ResolveHosts::Never;
        // The resolver's own deadline (3 s by default) is the one that counts; this one
        // only bounds a single attempt.
        options.timeout = Duration::from_secs(2);
        options.attempts = 2;
        options.ndots = 0;
        options.cache_size = 4096;
        options.edns0 = true;
        let resolver =
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
                .with_options(options)
                .build();
        Ok(Self { resolver })
    }
}

impl Upstream for HickoryUpstream {
    async fn lookup(
        &self,
        name: &Hostname,
        record_type: RecordType,
    ) -> Result<Vec<UpstreamAddr>, UpstreamError> {
        let mut query = Name::from_ascii(name.as_str())
            .map_err(|e| UpstreamError::Failed(format!("name {}: {e}", name.as_str())))?;
        // Absolute: hickory then never tries search domains.
        query.set_fqdn(true);
        match self.resolver.lookup(query, record_type).await {
            Ok(lookup) => {
                // Cached answers carry their original TTL: count down to the deadline.
                let remaining = lookup
                    .valid_until()
                    .saturating_duration_since(Instant::now())
                    .as_secs();
                let remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
                Ok(lookup
                    .record_iter()
                    .filter_map(|record| {
                        let addr = match (record_type, record.data()) {
                            (RecordType::A, RData::A(a)) => IpAddr::V4(a.0),
                            (RecordType::AAAA, RData::AAAA(aaaa)) => IpAddr::V6(aaaa.0),
                            _ => return None,
                        };
                        Some(UpstreamAddr {
                            addr,
                            ttl: record.ttl().min(remaining),
                        })
                    })
                    .collect())
            }
            Err(e) if e.is_nx_domain() => Err(UpstreamError::NxDomain),
            Err(e) if e.is_no_records_found() => Ok(Vec::new()),
            Err(e) => Err(UpstreamError::Failed(e.to_string())),
        }
    }
}

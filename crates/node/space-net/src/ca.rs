//! The per-sandbox certificate authority, and the leaf certificates it mints, for TLS
//! termination.
//!
//! When a sandbox's egress policy asks for inspection or credential injection on a TLS
//! connection, the node's proxy terminates the guest's TLS itself. The guest trusts one CA of
//! its own ([`SandboxCa`], installed into its trust store by [`SandboxCa::cert_pem`]); the
//! proxy presents a leaf certificate for the name the guest asked for, minted on demand and
//! cached ([`LeafCache`], which is also the rustls certificate resolver). A CA per sandbox
//! means a key leaked from one sandbox's records can impersonate servers only to that
//! sandbox, which already trusts the node.
//!
//! Every certificate is ECDSA P-256 and every TLS object here uses one explicitly chosen
//! crypto provider, [`crypto_provider`] (rustls with ring): never the process default, which
//! other crates in the process may install differently.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lru::LruCache;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use space_core::egress::Hostname;
use time::OffsetDateTime;

/// How long a sandbox CA is valid. Ten years: a CA lives as long as its sandbox (and its
/// snapshots and forks, which keep trusting it), and nothing else trusts it, so a long life
/// costs nothing; rotating it would mean rewriting the guest's trust store.
pub const CA_VALIDITY: Duration = Duration::from_secs(3650 * 24 * 60 * 60);

/// How long a leaf certificate is valid. Short, because leaves are cheap to mint and a short
/// life bounds what a leaked leaf key is worth.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How far in the past certificates start, so a guest whose clock lags the node's (a VM
/// restored from a snapshot, before it has synced its clock) still accepts them.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(60 * 60);

/// A cached leaf is re-minted once it has less than this left, so that no connection is
/// handed a certificate about to expire mid-session.
pub const LEAF_RENEW_BEFORE: Duration = Duration::from_secs(24 * 60 * 60);

/// Default number of leaves a [`LeafCache`] keeps (least recently used evicted first). Each
/// is about 1 KiB; a sandbox rarely talks to more than a few dozen names, and a guest that
/// asks for many more only makes us mint again, never grow.
pub const LEAF_CACHE_CAPACITY: usize = 1024;

/// Longest CA common name (X.520 `ub-common-name`).
const MAX_COMMON_NAME_LEN: usize = 64;

/// Why a CA or leaf could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The CA common name is empty, too long or has control characters.
    #[error("invalid CA common name: {0}")]
    InvalidCommonName(&'static str),
    /// Certificate or key generation, signing or encoding failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused a key or configuration.
    #[error("TLS configuration failed: {0}")]
    Tls(#[from] rustls::Error),
    /// The stored CA certificate cannot be used.
    #[error("invalid CA certificate: {0}")]
    InvalidCaCert(&'static str),
    /// The stored CA key cannot be used.
    #[error("invalid CA key: {0}")]
    InvalidCaKey(&'static str),
    /// The stored CA key is not the certificate's key.
    #[error("CA key does not match the CA certificate")]
    KeyMismatch,
    /// The system clock is outside what a certificate can express.
    #[error("system clock out of range for certificate validity")]
    Clock,
}

/// The crypto provider of everything TLS in this crate: rustls's ring provider.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A sandbox's certificate authority: an ECDSA P-256 key and its self-signed CA certificate.
pub struct SandboxCa {
    /// rcgen's issuer view of the CA. After [`SandboxCa::from_pem_pair`] it is re-derived
    /// from the stored certificate (same subject and key, so leaves chain to the stored one);
    /// `cert_der` and `cert_pem` always hold the certificate the guest trusts.
    issuer: rcgen::Certificate,
    key: KeyPair,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
}

impl fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("SandboxCa")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl SandboxCa {
    /// Generates a new CA whose subject is `CN=<common_name>`, valid from
    /// [`CLOCK_SKEW_ALLOWANCE`] ago for [`CA_VALIDITY`]. Not path-length or name constrained:
    /// only the one guest trusts it.
    pub fn generate(common_name: &str) -> Result<SandboxCa, CaError> {
        check_common_name(common_name)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        (params.not_before, params.not_after) = validity(SystemTime::now(), CA_VALIDITY)?;
        let issuer = params.self_signed(&key)?;
        let cert_der = issuer.der().clone();
        let cert_pem = issuer.pem();
        tracing::debug!(common_name, "generated sandbox CA");
        Ok(SandboxCa {
            issuer,
            key,
            cert_der,
            cert_pem,
        })
    }

    /// Loads a CA saved with [`SandboxCa::to_pem_pair`]. Checks that the certificate is a CA
    /// certificate and that the key is its ECDSA P-256 key.
    pub fn from_pem_pair(cert_pem: &str, key_pem: &str) -> Result<SandboxCa, CaError> {
        let key = KeyPair::from_pem(key_pem)
            .map_err(|_| CaError::InvalidCaKey("not a PKCS#8 PEM key"))?;
        if !key.is_compatible(&PKCS_ECDSA_P256_SHA256) {
            return Err(CaError::InvalidCaKey("not an ECDSA P-256 key"));
        }
        let cert_der = check_ca_cert(cert_pem, &key)?;
        // Re-derive rcgen's issuer parameters (subject, key identifier) from the stored
        // certificate; the re-signed copy is only an issuer handle and is never sent.
        let params = CertificateParams::from_ca_cert_pem(cert_pem)
            .map_err(|_| CaError::InvalidCaCert("unsupported by the certificate generator"))?;
        let issuer = params.self_signed(&key)?;
        Ok(SandboxCa {
            issuer,
            key,
            cert_der,
            cert_pem: cert_pem.to_owned(),
        })
    }

    /// The CA certificate, PEM, for the guest's trust store.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// `(certificate PEM, private key PEM)`, for the node to persist. The key is a secret: the
    /// caller chooses where it goes and with which file mode.
    pub fn to_pem_pair(&self) -> (String, String) {
        (self.cert_pem.clone(), self.key.serialize_pem())
    }

    /// Mints a leaf for `name`, valid from [`CLOCK_SKEW_ALLOWANCE`] before `now` for
    /// [`LEAF_VALIDITY`], with a fresh key.
    fn mint_leaf(
        &self,
        name: &Hostname,
        now: SystemTime,
        provider: &CryptoProvider,
    ) -> Result<Leaf, CaError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(vec![name.as_str().to_owned()])?;
        params.distinguished_name = common_name_dn(name.as_str());
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = validity(now, LEAF_VALIDITY)?;
        let cert = params.signed_by(&key, &self.issuer, &self.key)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        // Only the leaf: the guest has the CA as a trust anchor and needs no intermediate.
        let certified = CertifiedKey::from_der(vec![cert.der().clone()], key_der, provider)?;
        let renew_at = now
            .checked_add(LEAF_VALIDITY.saturating_sub(CLOCK_SKEW_ALLOWANCE + LEAF_RENEW_BEFORE))
            .ok_or(CaError::Clock)?;
        tracing::debug!(host = %name, "minted leaf certificate");
        Ok(Leaf {
            key: Arc::new(certified),
            renew_at,
        })
    }
}

fn check_common_name(common_name: &str) -> Result<(), CaError> {
    if common_name.trim().is_empty() {
        return Err(CaError::InvalidCommonName("empty"));
    }
    if common_name.len() > MAX_COMMON_NAME_LEN {
        return Err(CaError::InvalidCommonName("longer than 64 bytes"));
    }
    if common_name.chars().any(char::is_control) {
        return Err(CaError::InvalidCommonName("control character"));
    }
    Ok(())
}

fn common_name_dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// `(not_before, not_after)` for a certificate valid for `lifetime`, starting
/// [`CLOCK_SKEW_ALLOWANCE`] before `now`.
fn validity(
    now: SystemTime,
    lifetime: Duration,
) -> Result<(OffsetDateTime, OffsetDateTime), CaError> {
    let not_before = now
        .checked_sub(CLOCK_SKEW_ALLOWANCE)
        .ok_or(CaError::Clock)?;
    let not_after = not_before.checked_add(lifetime).ok_or(CaError::Clock)?;
    Ok((to_datetime(not_before)?, to_datetime(not_after)?))
}

fn to_datetime(t: SystemTime) -> Result<OffsetDateTime, CaError> {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| CaError::Clock)?
        .as_secs();
    let secs = i64::try_from(secs).map_err(|_| CaError::Clock)?;
    OffsetDateTime::from_unix_timestamp(secs).map_err(|_| CaError::Clock)
}

/// Checks a stored CA certificate against its key; returns its DER.
fn check_ca_cert(cert_pem: &str, key: &KeyPair) -> Result<CertificateDer<'static>, CaError> {
    let (rest, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|_| CaError::InvalidCaCert("not a PEM certificate"))?;
    if !rest.iter().all(u8::is_ascii_whitespace) {
        return Err(CaError::InvalidCaCert("more than one PEM block"));
    }
    let cert = pem
        .parse_x509()
        .map_err(|_| CaError::InvalidCaCert("not an X.509 certificate"))?;
    if !cert.is_ca() {
        return Err(CaError::InvalidCaCert("not a CA certificate"));
    }
    // rcgen's subject parser supports exactly one attribute per RDN (and would panic on an
    // empty one): check here so a damaged file is an error.
    if cert.subject().iter().any(|rdn| rdn.iter().count() != 1) {
        return Err(CaError::InvalidCaCert("unsupported subject"));
    }
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(CaError::KeyMismatch);
    }
    Ok(CertificateDer::from(pem.contents.clone()))
}

/// A minted leaf and when to replace it.
#[derive(Clone)]
struct Leaf {
    key: Arc<CertifiedKey>,
    renew_at: SystemTime,
}

/// Leaf certificates of one [`SandboxCa`], minted on demand per host name and kept in a
/// bounded LRU cache. As a [`ResolvesServerCert`] it mints for the ClientHello's SNI, so a
/// ClientHello without a (valid) SNI gets no certificate and its handshake fails.
pub struct LeafCache {
    ca: Arc<SandboxCa>,
    provider: Arc<CryptoProvider>,
    leaves: Mutex<LruCache<Hostname, Leaf>>,
}

impl fmt::Debug for LeafCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeafCache")
            .field("ca", &self.ca)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl LeafCache {
    /// A cache of up to [`LEAF_CACHE_CAPACITY`] leaves.
    pub fn new(ca: Arc<SandboxCa>) -> LeafCache {
        LeafCache::with_capacity(ca, LEAF_CACHE_CAPACITY)
    }

    /// A cache of up to `capacity` leaves (at least one).
    pub fn with_capacity(ca: Arc<SandboxCa>, capacity: usize) -> LeafCache {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        LeafCache {
            ca,
            provider: crypto_provider(),
            leaves: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// The CA the leaves are signed by.
    pub fn ca(&self) -> &Arc<SandboxCa> {
        &self.ca
    }

    /// The crypto provider the leaves' keys are loaded with.
    pub fn provider(&self) -> &Arc<CryptoProvider> {
        &self.provider
    }

    /// Number of cached leaves.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no leaf is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The leaf for `name`: the cached one while it is fresh, else a newly minted one.
    pub fn certified_key(&self, name: &Hostname) -> Result<Arc<CertifiedKey>, CaError> {
        self.certified_key_at(name, SystemTime::now())
    }

    fn certified_key_at(
        &self,
        name: &Hostname,
        now: SystemTime,
    ) -> Result<Arc<CertifiedKey>, CaError> {
        if let Some(key) = self.fresh(name, now) {
            return Ok(key);
        }
        // Mint without holding the lock (signing takes a while); if another caller minted the
        // same name meanwhile, everyone converges on the first one cached.
        let leaf = self.ca.mint_leaf(name, now, &self.provider)?;
        let mut leaves = self.lock();
        if let Some(cached) = leaves.get(name).filter(|cached| now < cached.renew_at) {
            return Ok(cached.key.clone());
        }
        let key = leaf.key.clone();
        leaves.put(name.clone(), leaf);
        Ok(key)
    }

    fn fresh(&self, name: &Hostname, now: SystemTime) -> Option<Arc<CertifiedKey>> {
        let mut leaves = self.lock();
        let leaf = leaves.get(name)?;
        (now < leaf.renew_at).then(|| leaf.key.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Hostname, Leaf>> {
        // Every update is a single `put`, so a panic elsewhere cannot leave the cache
        // half-written: a poisoned lock is still a consistent cache.
        self.leaves.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ResolvesServerCert for LeafCache {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let Some(sni) = client_hello.server_name() else {
            tracing::debug!("TLS termination refused: ClientHello without server_name");
            return None;
        };
        let name = match Hostname::from_sni(sni.as_bytes()) {
            Ok(name) => name,
            Err(error) => {
                tracing::debug!(%error, "TLS termination refused: invalid server_name");
                return None;
            }
        };
        match self.certified_key(&name) {
            Ok(key) => Some(key),
            Err(error) => {
                tracing::warn!(host = %name, %error, "could not mint a leaf certificate");
                None
            }
        }
    }
}

/// Application protocols the terminating side may offer the guest (by ALPN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alpn {
    /// HTTP/2, `h2`.
    H2,
    /// HTTP/1.1, `http/1.1`.
    Http11,
}

impl Alpn {
    /// The ALPN protocol id.
    pub const fn id(self) -> &'static [u8] {
        match self {
            Alpn::H2 => b"h2",
            Alpn::Http11 => b"http/1.1",
        }
    }
}

/// A rustls server configuration terminating a sandbox's TLS with leaves from `leaves`,
/// offering `alpn` in order of preference. A client that offers ALPN but none of these fails
/// the handshake (rustls's rule); a client that offers none gets no ALPN.
pub fn server_config(leaves: Arc<LeafCache>, alpn: &[Alpn]) -> Result<Arc<ServerConfig>, CaError> {
    let provider = leaves.provider.clone();
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(leaves);
    config.alpn_protocols = alpn.iter().map(|p| p.id().to_vec()).collect();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests;

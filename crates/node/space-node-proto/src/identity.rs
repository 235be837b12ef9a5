//! Who is at the other end of a node protocol connection: the cluster CA, the certificates
//! it issues, and the role a certificate carries.
//!
//! Every peer has a certificate from the cluster CA whose URI SAN names its role:
//! `spiffe://space.cluster/control-plane` or `spiffe://space.cluster/node/<name>`. A node's
//! certificate also holds the DNS name [`node_dns_name`] the control plane dials it by, so
//! the ordinary server-name check proves which node answered. The agent serves only a peer
//! whose role is the control plane: a node's certificate (even a valid one of this
//! cluster) cannot act as the control plane. Chain, validity dates and key usage are
//! checked by rustls (webpki); the role here.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The trust domain of the role URIs.
pub const TRUST_DOMAIN: &str = "space.cluster";
/// How long the CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long an issued certificate is valid by default.
pub const PEER_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// Clocks of the cluster may disagree by this much.
const CLOCK_SKEW: Duration = Duration::from_secs(300);
/// Longest node name (a DNS label).
pub const MAX_NODE_NAME: usize = 63;

/// Why an identity cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A node name that is not a DNS label.
    #[error("node name {0:?} is not 1 to 63 lowercase letters, digits or '-' (not first or last)")]
    BadNodeName(String),
    /// The certificate generator failed or refused the input.
    #[error("certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A PEM or DER input cannot be read.
    #[error("{0}")]
    Malformed(String),
    /// The certificate names no role, or more than one.
    #[error("the certificate names no SPACE role (a URI SAN spiffe://{TRUST_DOMAIN}/...)")]
    NoRole,
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The system clock is out of range.
    #[error("the system clock is out of range")]
    Clock,
}

/// What a certificate lets its holder be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerRole {
    /// A control-plane replica.
    ControlPlane,
    /// The node agent of the node so named.
    Node(String),
}

impl PeerRole {
    /// The role's URI SAN.
    pub fn uri(&self) -> String {
        match self {
            PeerRole::ControlPlane => format!("spiffe://{TRUST_DOMAIN}/control-plane"),
            PeerRole::Node(name) => format!("spiffe://{TRUST_DOMAIN}/node/{name}"),
        }
    }

    /// The role a URI SAN names, if it is one of ours.
    pub fn from_uri(uri: &str) -> Option<PeerRole> {
        let path = uri.strip_prefix(&format!("spiffe://{TRUST_DOMAIN}/"))?;
        match path.split_once('/') {
            None if path == "control-plane" => Some(PeerRole::ControlPlane),
            Some(("node", name)) if check_node_name(name).is_ok() => {
                Some(PeerRole::Node(name.to_owned()))
            }
            _ => None,
        }
    }
}

/// Checks a node name: a DNS label, lowercase.
pub fn check_node_name(name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NODE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(IdentityError::BadNodeName(
            name.chars().take(80).collect::<String>(),
        ))
    }
}

/// The DNS name a node's certificate holds and the control plane checks.
pub fn node_dns_name(name: &str) -> String {
    format!("{name}.node.{TRUST_DOMAIN}")
}

/// A certificate and its key, PEM. The key is a secret: never in `Debug` output.
#[derive(Clone)]
pub struct Identity {
    /// The certificate (leaf only: peers have the CA).
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// The cluster CA: issues every peer's certificate.
pub struct ClusterCa {
    issuer: rcgen::Certificate,
    key: KeyPair,
    cert_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new CA (ECDSA P-256), valid for [`CA_VALIDITY`].
    pub fn generate() -> Result<ClusterCa, IdentityError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "SPACE cluster CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        (params.not_before, params.not_after) = validity(SystemTime::now(), CA_VALIDITY)?;
        let issuer = params.self_signed(&key)?;
        let cert_pem = issuer.pem();
        Ok(ClusterCa {
            issuer,
            key,
            cert_pem,
        })
    }

    /// The CA saved as [`ClusterCa::identity`] returned it.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, IdentityError> {
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| IdentityError::Malformed(format!("CA key: {e}")))?;
        let params = CertificateParams::from_ca_cert_pem(cert_pem)
            .map_err(|e| IdentityError::Malformed(format!("CA certificate: {e}")))?;
        // Re-signed only to serve as rcgen's issuer handle; the stored PEM is what peers get.
        let issuer = params.self_signed(&key)?;
        Ok(ClusterCa {
            issuer,
            key,
            cert_pem: cert_pem.to_owned(),
        })
    }

    /// The CA's certificate, PEM (every peer's trust anchor).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's certificate and key, to persist (the key is a secret).
    pub fn identity(&self) -> Identity {
        Identity {
            cert_pem: self.cert_pem.clone(),
            key_pem: self.key.serialize_pem(),
        }
    }

    /// A certificate for `role`, valid for `lifetime` from now (less the clock skew).
    pub fn issue(&self, role: &PeerRole, lifetime: Duration) -> Result<Identity, IdentityError> {
        self.issue_at(role, SystemTime::now(), lifetime)
    }

    /// [`ClusterCa::issue`] as of `now` (tests make expired certificates with it).
    pub fn issue_at(
        &self,
        role: &PeerRole,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<Identity, IdentityError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = leaf_params(role, now, lifetime)?.signed_by(&key, &self.issuer, &self.key)?;
        Ok(Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A certificate for node `name` over the public key of `csr_pem` (the key never left
    /// the node). The request's signature is checked (the requester holds the key); what it
    /// asks for beyond its key is ignored: names, role and dates are this CA's.
    pub fn sign_node_request(
        &self,
        csr_pem: &str,
        name: &str,
        lifetime: Duration,
    ) -> Result<String, IdentityError> {
        if csr_pem.len() > MAX_CSR_PEM {
            return Err(IdentityError::Malformed(format!(
                "a certificate request is at most {MAX_CSR_PEM} bytes"
            )));
        }
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| IdentityError::Malformed(format!("certificate request: {e}")))?;
        csr.params = leaf_params(
            &PeerRole::Node(name.to_owned()),
            SystemTime::now(),
            lifetime,
        )?;
        Ok(csr.signed_by(&self.issuer, &self.key)?.pem())
    }

    /// The CA certificate's fingerprint (what a join token pins).
    pub fn fingerprint(&self) -> Result<String, IdentityError> {
        ca_fingerprint(&self.cert_pem)
    }
}

/// Longest certificate request accepted.
pub const MAX_CSR_PEM: usize = 16 * 1024;

/// The parameters of a leaf for `role`: its role URI, a node's DNS name (the control
/// plane's for the control plane), usable as client and server.
fn leaf_params(
    role: &PeerRole,
    now: SystemTime,
    lifetime: Duration,
) -> Result<CertificateParams, IdentityError> {
    let dns = match role {
        PeerRole::Node(name) => {
            check_node_name(name)?;
            node_dns_name(name)
        }
        PeerRole::ControlPlane => CONTROL_PLANE_DNS_NAME.to_owned(),
    };
    let mut params = CertificateParams::new(vec![dns])?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, role.uri());
    params.distinguished_name = dn;
    params.subject_alt_names.push(SanType::URI(
        role.uri()
            .try_into()
            .map_err(|e| IdentityError::Malformed(format!("role URI: {e}")))?,
    ));
    params.is_ca = IsCa::NoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    (params.not_before, params.not_after) = validity(now, lifetime)?;
    Ok(params)
}

/// The DNS name a control-plane certificate holds (nodes check it when they dial the
/// control plane's cluster listener).
pub const CONTROL_PLANE_DNS_NAME: &str = "control-plane.space.cluster";

/// A node's key pair and its certificate request for `name`: the key stays on the node.
pub fn node_key_and_request(name: &str) -> Result<(String, String), IdentityError> {
    check_node_name(name)?;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let params = CertificateParams::new(vec![node_dns_name(name)])?;
    let csr = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.pem()?))
}

/// `sha256:<hex>` of the first certificate of `pem` (its DER).
pub fn ca_fingerprint(pem: &str) -> Result<String, IdentityError> {
    let cert = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or_else(|| IdentityError::Malformed("PEM holds no certificate".into()))?
        .map_err(|e| IdentityError::Malformed(format!("certificate PEM: {e}")))?;
    Ok(fingerprint_der(&cert))
}

fn fingerprint_der(der: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(der)))
}

/// The certificate fingerprint of a peer's leaf (DER), as [`ca_fingerprint`] writes it.
pub fn cert_fingerprint(der: &[u8]) -> String {
    fingerprint_der(der)
}

/// The role of a peer's certificate (the leaf, DER), as its URI SAN names it.
pub fn peer_role(cert_der: &[u8]) -> Result<PeerRole, IdentityError> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| IdentityError::Malformed(format!("peer certificate: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| IdentityError::Malformed(format!("peer certificate SAN: {e}")))?
        .ok_or(IdentityError::NoRole)?;
    let mut roles = san.value.general_names.iter().filter_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(uri) => PeerRole::from_uri(uri),
        _ => None,
    });
    match (roles.next(), roles.next()) {
        (Some(role), None) => Ok(role),
        _ => Err(IdentityError::NoRole),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca_pem: &str) -> Result<rustls::RootCertStore, IdentityError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| IdentityError::Malformed(format!("CA PEM: {e}")))?;
        roots.add(cert)?;
    }
    if roots.is_empty() {
        return Err(IdentityError::Malformed(
            "CA PEM holds no certificate".into(),
        ));
    }
    Ok(roots)
}

fn chain_and_key(
    id: &Identity,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), IdentityError> {
    let chain = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| IdentityError::Malformed(format!("certificate PEM: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())
        .map_err(|_| IdentityError::Malformed("private key PEM".into()))?;
    Ok((chain, key))
}

/// The node agent's TLS: its identity, client certificates required and checked against
/// the cluster CA (the role is checked after the handshake, [`peer_role`]), HTTP/2 only.
pub fn server_config(id: &Identity, ca_pem: &str) -> Result<rustls::ServerConfig, IdentityError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(ca_pem)?),
        provider(),
    )
    .build()
    .map_err(|e| IdentityError::Malformed(format!("client verifier: {e}")))?;
    let (chain, key) = chain_and_key(id)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The control plane's TLS towards node agents: its identity, the cluster CA as the only
/// trust anchor, HTTP/2 only.
pub fn client_config(id: &Identity, ca_pem: &str) -> Result<rustls::ClientConfig, IdentityError> {
    let (chain, key) = chain_and_key(id)?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The control plane's cluster listener: its identity (leaf and CA, so a joining node can
/// check the CA against its token's pin), client certificates checked against the cluster
/// CA when given but not required (a joining node has none yet; every route but the join
/// requires one), HTTP/2 or HTTP/1.1.
pub fn cluster_server_config(
    id: &Identity,
    ca_pem: &str,
) -> Result<rustls::ServerConfig, IdentityError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(ca_pem)?),
        provider(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| IdentityError::Malformed(format!("client verifier: {e}")))?;
    let (mut chain, key) = chain_and_key(id)?;
    chain.extend(
        CertificateDer::pem_slice_iter(ca_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| IdentityError::Malformed(format!("CA PEM: {e}")))?,
    );
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A node's TLS towards the control plane's cluster listener once it has joined: its
/// identity, the cluster CA as the only trust anchor.
pub fn node_client_config(
    id: &Identity,
    ca_pem: &str,
) -> Result<rustls::ClientConfig, IdentityError> {
    let (chain, key) = chain_and_key(id)?;
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(chain, key)?)
}

/// A joining node's TLS: it has no CA yet, only the fingerprint its join token pins. The
/// server must present, after its leaf, a CA certificate with that fingerprint, and the
/// leaf must verify against that CA for [`CONTROL_PLANE_DNS_NAME`] (chain, dates, name):
/// whoever cannot is not this cluster's control plane, and never sees the token.
pub fn join_client_config(ca_fingerprint: &str) -> Result<rustls::ClientConfig, IdentityError> {
    let verifier = PinnedCaVerifier {
        fingerprint: ca_fingerprint.to_owned(),
        provider: provider(),
    };
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// See [`join_client_config`].
#[derive(Debug)]
struct PinnedCaVerifier {
    fingerprint: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| fingerprint_der(c) == self.fingerprint)
            .ok_or_else(|| {
                rustls::Error::General("the server's CA is not the one the join token names".into())
            })?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(format!("verifier: {e}")))?;
        inner.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn validity(
    now: SystemTime,
    lifetime: Duration,
) -> Result<(time::OffsetDateTime, time::OffsetDateTime), IdentityError> {
    let start = now.checked_sub(CLOCK_SKEW).ok_or(IdentityError::Clock)?;
    let end = start.checked_add(lifetime).ok_or(IdentityError::Clock)?;
    Ok((datetime(start)?, datetime(end)?))
}

fn datetime(t: SystemTime) -> Result<time::OffsetDateTime, IdentityError> {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| IdentityError::Clock)?
        .as_secs();
    let secs = i64::try_from(secs).map_err(|_| IdentityError::Clock)?;
    time::OffsetDateTime::from_unix_timestamp(secs).map_err(|_| IdentityError::Clock)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der(id: &Identity) -> Vec<u8> {
        chain_and_key(id).unwrap().0[0].to_vec()
    }

    #[test]
    fn certificates_carry_their_role() {
        let ca = ClusterCa::generate().unwrap();
        let cp = ca.issue(&PeerRole::ControlPlane, PEER_VALIDITY).unwrap();
        let node = ca
            .issue(&PeerRole::Node("n1".into()), PEER_VALIDITY)
            .unwrap();
        assert_eq!(peer_role(&der(&cp)).unwrap(), PeerRole::ControlPlane);
        assert_eq!(peer_role(&der(&node)).unwrap(), PeerRole::Node("n1".into()));
        assert!(!format!("{cp:?}").contains("PRIVATE KEY"));
        // A CA read back issues certificates the same roots accept.
        let again = ClusterCa::from_pem(ca.cert_pem(), &ca.identity().key_pem).unwrap();
        let n2 = again
            .issue(&PeerRole::Node("n2".into()), PEER_VALIDITY)
            .unwrap();
        assert!(server_config(&n2, ca.cert_pem()).is_ok());
        assert!(client_config(&cp, ca.cert_pem()).is_ok());
    }

    #[test]
    fn only_our_uris_are_roles() {
        assert_eq!(
            PeerRole::from_uri("spiffe://space.cluster/node/a-1"),
            Some(PeerRole::Node("a-1".into()))
        );
        for bad in [
            "spiffe://other/control-plane",
            "spiffe://space.cluster/node/",
            "spiffe://space.cluster/node/A",
            "spiffe://space.cluster/node/a/b",
            "spiffe://space.cluster/control-plane/x",
            "https://space.cluster/control-plane",
        ] {
            assert_eq!(PeerRole::from_uri(bad), None, "{bad}");
        }
        assert!(check_node_name("-a").is_err());
        assert!(check_node_name(&"a".repeat(64)).is_err());
        assert!(ClusterCa::generate()
            .unwrap()
            .issue(&PeerRole::Node("Bad Name".into()), PEER_VALIDITY)
            .is_err());
    }
}

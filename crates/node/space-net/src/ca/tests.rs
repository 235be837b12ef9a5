//! Tests of the per-sandbox CA: real rustls handshakes against minted leaves, reload from PEM.

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, ConnectionCommon, RootCertStore, ServerConnection};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

use super::*;
use crate::test_util::client_tls;

fn name(s: &str) -> Hostname {
    Hostname::parse(s).unwrap()
}

fn test_ca() -> Arc<SandboxCa> {
    Arc::new(SandboxCa::generate("SPACE sandbox test CA").unwrap())
}

/// A client trusting only `ca`, offering `alpn`.
fn client_config(ca: &SandboxCa, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    Arc::new(client_tls(ca.cert_der(), alpn))
}

/// Moves everything `from` wants to send into `to`, and lets `to` process it.
fn pump<A, B>(
    from: &mut ConnectionCommon<A>,
    to: &mut ConnectionCommon<B>,
) -> Result<(), rustls::Error> {
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire).unwrap();
    }
    let mut wire = &wire[..];
    while !wire.is_empty() {
        to.read_tls(&mut wire).unwrap();
        to.process_new_packets()?;
    }
    Ok(())
}

/// Runs an in-memory handshake; returns the client once both sides are done.
fn handshake(
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    sni: &str,
) -> Result<ClientConnection, rustls::Error> {
    let mut client = ClientConnection::new(client, ServerName::try_from(sni.to_owned()).unwrap())?;
    let mut server = ServerConnection::new(server)?;
    // A TLS 1.3 handshake takes two flights from the client; allow a few more.
    for _ in 0..5 {
        pump(&mut client, &mut server)?;
        pump(&mut server, &mut client)?;
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(client);
        }
    }
    panic!("handshake did not finish");
}

fn dns_sans(der: &[u8]) -> Vec<String> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    san.value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => d.to_string(),
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect()
}

#[test]
fn trusted_client_gets_a_leaf_for_its_sni() {
    let ca = test_ca();
    let leaves = Arc::new(LeafCache::new(ca.clone()));
    let server = server_config(leaves.clone(), &[Alpn::H2, Alpn::Http11]).unwrap();
    let client = handshake(client_config(&ca, &[b"h2"]), server, "api.example.com").unwrap();
    assert_eq!(client.alpn_protocol(), Some(&b"h2"[..]));

    let chain = client.peer_certificates().unwrap();
    assert_eq!(chain.len(), 1);
    assert_eq!(dns_sans(&chain[0]), ["api.example.com"]);
    let (_, leaf) = x509_parser::certificate::X509Certificate::from_der(&chain[0]).unwrap();
    assert!(!leaf.is_ca());
    assert!(
        leaf.extended_key_usage()
            .unwrap()
            .unwrap()
            .value
            .server_auth
    );
    let validity = leaf.validity();
    let lifetime = validity.not_after.timestamp() - validity.not_before.timestamp();
    assert_eq!(lifetime, i64::try_from(LEAF_VALIDITY.as_secs()).unwrap());
    let now = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let backdate = now - validity.not_before.timestamp();
    assert!((3590..=3610).contains(&backdate), "{backdate}");
    // The resolver cached what it minted.
    assert_eq!(leaves.len(), 1);
    let cached = leaves.certified_key(&name("api.example.com")).unwrap();
    assert_eq!(cached.cert[0], chain[0]);
}

#[test]
fn http11_only_server_negotiates_http11() {
    let ca = test_ca();
    let server = server_config(Arc::new(LeafCache::new(ca.clone())), &[Alpn::Http11]).unwrap();
    let client = handshake(
        client_config(&ca, &[b"h2", b"http/1.1"]),
        server,
        "a.example.com",
    )
    .unwrap();
    assert_eq!(client.alpn_protocol(), Some(&b"http/1.1"[..]));
}

#[test]
fn client_trusting_another_ca_fails() {
    let ca = test_ca();
    let server = server_config(Arc::new(LeafCache::new(ca)), &[Alpn::Http11]).unwrap();
    // Another sandbox's CA has the same subject: webpki finds it and the signature fails.
    let same_name = test_ca();
    let err = handshake(
        client_config(&same_name, &[]),
        server.clone(),
        "api.example.com",
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature)
        ),
        "{err:?}"
    );
    let other_name = SandboxCa::generate("some other CA").unwrap();
    let err = handshake(client_config(&other_name, &[]), server, "api.example.com").unwrap_err();
    assert!(
        matches!(
            err,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
        ),
        "{err:?}"
    );
}

/// Serves one fixed leaf whatever the SNI.
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

#[test]
fn leaf_is_not_valid_for_another_name() {
    let ca = test_ca();
    let leaves = LeafCache::new(ca.clone());
    let leaf = leaves.certified_key(&name("api.example.com")).unwrap();
    let server = ServerConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Fixed(leaf.clone())));
    let server = Arc::new(server);
    let err = handshake(client_config(&ca, &[]), server.clone(), "evil.example.com").unwrap_err();
    assert!(
        matches!(
            err,
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
                | rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForNameContext { .. }
                )
        ),
        "{err:?}"
    );
    // The same server is fine for the name the leaf is for.
    assert!(handshake(client_config(&ca, &[]), server, "api.example.com").is_ok());

    // And the verifier agrees directly.
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new({
            let mut roots = RootCertStore::empty();
            roots.add(ca.cert_der().clone()).unwrap();
            roots
        }),
        crypto_provider(),
    )
    .build()
    .unwrap();
    let other = ServerName::try_from("www.example.com").unwrap();
    assert!(verifier
        .verify_server_cert(&leaf.cert[0], &[], &other, &[], UnixTime::now())
        .is_err());
}

#[test]
fn client_without_sni_fails() {
    let ca = test_ca();
    let server = server_config(Arc::new(LeafCache::new(ca.clone())), &[Alpn::Http11]).unwrap();
    let mut config = (*client_config(&ca, &[])).clone();
    config.enable_sni = false;
    // The resolver finds no certificate, so the server aborts the handshake.
    let err = handshake(Arc::new(config), server, "api.example.com").unwrap_err();
    assert!(matches!(err, rustls::Error::General(_)), "{err:?}");
}

#[test]
fn cache_hits_return_the_same_leaf() {
    let leaves = LeafCache::new(test_ca());
    let a = leaves.certified_key(&name("a.example.com")).unwrap();
    let again = leaves.certified_key(&name("a.example.com")).unwrap();
    assert!(Arc::ptr_eq(&a, &again));
    let b = leaves.certified_key(&name("b.example.com")).unwrap();
    assert!(!Arc::ptr_eq(&a, &b));
    assert_eq!(leaves.len(), 2);
}

#[test]
fn leaves_close_to_expiry_are_reminted() {
    let leaves = LeafCache::new(test_ca());
    let host = name("a.example.com");
    let now = SystemTime::now();
    let first = leaves.certified_key_at(&host, now).unwrap();
    let renew_at = now + LEAF_VALIDITY - CLOCK_SKEW_ALLOWANCE - LEAF_RENEW_BEFORE;
    let before = leaves
        .certified_key_at(&host, renew_at - Duration::from_secs(1))
        .unwrap();
    assert!(Arc::ptr_eq(&first, &before));
    let after = leaves.certified_key_at(&host, renew_at).unwrap();
    assert!(!Arc::ptr_eq(&first, &after));
    assert_eq!(leaves.len(), 1);
}

#[test]
fn cache_is_bounded() {
    let leaves = LeafCache::with_capacity(test_ca(), 2);
    let a = leaves.certified_key(&name("a.example.com")).unwrap();
    leaves.certified_key(&name("b.example.com")).unwrap();
    leaves.certified_key(&name("c.example.com")).unwrap();
    assert_eq!(leaves.len(), 2);
    // The least recently used (a) was evicted, so it is minted again.
    let a_again = leaves.certified_key(&name("a.example.com")).unwrap();
    assert!(!Arc::ptr_eq(&a, &a_again));
    // A zero capacity is taken as one.
    let tiny = LeafCache::with_capacity(test_ca(), 0);
    assert!(tiny.is_empty());
    tiny.certified_key(&name("a.example.com")).unwrap();
    tiny.certified_key(&name("b.example.com")).unwrap();
    assert_eq!(tiny.len(), 1);
}

#[test]
fn ca_reloads_from_pem() {
    let ca = test_ca();
    let (cert_pem, key_pem) = ca.to_pem_pair();
    assert_eq!(cert_pem, ca.cert_pem());
    assert!(key_pem.contains("PRIVATE KEY"));
    let reloaded = Arc::new(SandboxCa::from_pem_pair(&cert_pem, &key_pem).unwrap());
    assert_eq!(reloaded.cert_der(), ca.cert_der());
    assert_eq!(reloaded.cert_pem(), ca.cert_pem());
    // A client trusting the original certificate accepts leaves the reloaded CA mints.
    let server = server_config(Arc::new(LeafCache::new(reloaded)), &[Alpn::H2]).unwrap();
    let client = handshake(client_config(&ca, &[b"h2"]), server, "api.example.com").unwrap();
    assert_eq!(
        dns_sans(&client.peer_certificates().unwrap()[0]),
        ["api.example.com"]
    );
}

#[test]
fn bad_pem_pairs_are_refused() {
    let ca = test_ca();
    let (cert_pem, key_pem) = ca.to_pem_pair();
    let (other_cert, other_key) = test_ca().to_pem_pair();
    assert!(matches!(
        SandboxCa::from_pem_pair(&cert_pem, &other_key),
        Err(CaError::KeyMismatch)
    ));
    assert!(matches!(
        SandboxCa::from_pem_pair(&other_cert, &key_pem),
        Err(CaError::KeyMismatch)
    ));
    assert!(matches!(
        SandboxCa::from_pem_pair("garbage", &key_pem),
        Err(CaError::InvalidCaCert(_))
    ));
    assert!(matches!(
        SandboxCa::from_pem_pair(&cert_pem, "garbage"),
        Err(CaError::InvalidCaKey(_))
    ));
    let two = format!("{cert_pem}{other_cert}");
    assert!(matches!(
        SandboxCa::from_pem_pair(&two, &key_pem),
        Err(CaError::InvalidCaCert(_))
    ));
    // A leaf is not a CA, even with its own key.
    let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = CertificateParams::new(vec!["a.example.com".to_owned()])
        .unwrap()
        .self_signed(&leaf_key)
        .unwrap();
    let refused = SandboxCa::from_pem_pair(&leaf.pem(), &leaf_key.serialize_pem());
    assert!(matches!(refused, Err(CaError::InvalidCaCert(_))));
}

#[test]
fn ca_certificate_is_a_ten_year_ca() {
    let ca = test_ca();
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(ca.cert_der()).unwrap();
    assert!(cert.is_ca());
    assert_eq!(cert.subject().to_string(), "CN=SPACE sandbox test CA");
    let validity = cert.validity();
    let lifetime = validity.not_after.timestamp() - validity.not_before.timestamp();
    assert_eq!(lifetime, i64::try_from(CA_VALIDITY.as_secs()).unwrap());
}

#[test]
fn bad_common_names_are_refused() {
    for cn in ["", "  ", "a\nb", &"x".repeat(65)] {
        assert!(
            matches!(SandboxCa::generate(cn), Err(CaError::InvalidCommonName(_))),
            "{cn:?}"
        );
    }
}

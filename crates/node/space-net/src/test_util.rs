//! Helpers shared by the unit tests of several modules.

use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use crate::ca::crypto_provider;

/// A TLS client configuration trusting only `root`, offering `alpn`.
pub(crate) fn client_tls(root: &CertificateDer<'static>, alpn: &[&[u8]]) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let mut config = ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

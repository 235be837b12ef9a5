//! The KMIP key service: a customer's key is a symmetric AES key on a KMIP server (1.4 or
//! later), used there through Encrypt and Decrypt with AES-GCM, so the key never leaves the
//! server. SPACE authenticates with the TLS client certificate the customer key carries
//! (KMIP's mutual TLS; the server's access control decides what that identity may use).
//!
//! A wrapped data key is `nonce (12) ‖ GCM tag (16) ‖ ciphertext (32)`; the context is GCM's
//! additional data. One TLS connection per call (a call is a few per sandbox operation, and a
//! connection held open would have to notice a server restart); every call is bounded by the
//! service's timeout, connection included.

pub mod message;
pub mod ttlv;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zeroize::Zeroizing;

use crate::error::{KmsError, Unavailable};
use crate::{BoxFuture, DataKey, KeyAccess, KeyCredentials, KeyService};
use message::{GCM_NONCE_LEN, GCM_TAG_LEN};
use ttlv::Item;

/// Timeout of one call unless configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The KMIP key service.
pub struct KmipService {
    address: String,
    server_name: ServerName<'static>,
    roots: Arc<rustls::RootCertStore>,
    timeout: Duration,
}

impl KmipService {
    /// A server at `address` (`host:port`) whose certificate names `server_name` (default:
    /// the host) and chains to a CA in `ca_file`.
    pub fn new(
        address: &str,
        server_name: Option<&str>,
        ca_file: &Path,
        timeout: Option<Duration>,
    ) -> Result<KmipService, KmsError> {
        let config = |m: String| KmsError::Config(format!("KMIP {address}: {m}"));
        let host = address
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
            .ok_or_else(|| config("address must be host:port".into()))?;
        let name = server_name.unwrap_or(host).to_owned();
        let server_name =
            ServerName::try_from(name).map_err(|e| config(format!("server name: {e}")))?;
        let pem =
            std::fs::read(ca_file).map_err(|e| config(format!("{}: {e}", ca_file.display())))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| config(format!("{}: {e}", ca_file.display())))?;
            roots
                .add(cert)
                .map_err(|e| config(format!("{}: {e}", ca_file.display())))?;
        }
        if roots.is_empty() {
            return Err(config(format!("{}: no certificate", ca_file.display())));
        }
        Ok(KmipService {
            address: address.to_owned(),
            server_name,
            roots: Arc::new(roots),
            timeout: timeout.unwrap_or(DEFAULT_TIMEOUT),
        })
    }

    /// TLS for one customer key: our roots, its client certificate.
    fn tls(&self, access: &KeyAccess) -> Result<tokio_rustls::TlsConnector, KmsError> {
        let KeyCredentials::ClientCertificate {
            certificate_pem,
            private_key_pem,
        } = &access.credentials
        else {
            return Err(KmsError::InvalidAccess(
                "a KMIP key needs client_certificate credentials".into(),
            ));
        };
        let invalid = |m: String| KmsError::InvalidAccess(format!("client certificate: {m}"));
        let chain = CertificateDer::pem_slice_iter(certificate_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(e.to_string()))?;
        if chain.is_empty() {
            return Err(invalid("no certificate in the PEM".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(private_key_pem.as_bytes())
            .map_err(|_| invalid("no usable private key in the PEM".into()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| KmsError::Config(e.to_string()))?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(chain, key)
            .map_err(|e| invalid(e.to_string()))?;
        Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
    }

    /// Sends one request and reads its response, within the timeout.
    async fn call(&self, access: &KeyAccess, request: Item) -> Result<Item, KmsError> {
        let connector = self.tls(access)?;
        let exchange = async {
            let unreachable = |what: &str, e: std::io::Error| {
                KmsError::Unreachable(format!("KMIP {}: {what}: {e}", self.address))
            };
            let tcp = TcpStream::connect(&self.address)
                .await
                .map_err(|e| unreachable("connect", e))?;
            let _ = tcp.set_nodelay(true);
            let mut tls = connector
                .connect(self.server_name.clone(), tcp)
                .await
                .map_err(|e| tls_failure(&self.address, e))?;
            tls.write_all(&Zeroizing::new(request.encode()))
                .await
                .map_err(|e| unreachable("send", e))?;
            let mut header = [0u8; 8];
            tls.read_exact(&mut header)
                .await
                .map_err(|e| unreachable("read", e))?;
            let len = ttlv::item_len(&header).map_err(|e| KmsError::Protocol(e.to_string()))?;
            let mut bytes = Zeroizing::new(vec![0u8; len]);
            bytes[..8].copy_from_slice(&header);
            tls.read_exact(&mut bytes[8..])
                .await
                .map_err(|e| unreachable("read", e))?;
            let _ = tls.shutdown().await;
            Item::decode(&bytes).map_err(|e| KmsError::Protocol(e.to_string()))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                KmsError::Unreachable(format!(
                    "KMIP {}: no answer within {:?}",
                    self.address, self.timeout
                ))
            })?
    }
}

/// A failed handshake: the server refusing our certificate is the customer withdrawing
/// access; anything else (no route, reset) is the service being unreachable.
fn tls_failure(address: &str, e: std::io::Error) -> KmsError {
    let text = e.to_string();
    if text.contains("certificate")
        && (text.contains("received fatal alert") || text.contains("alert"))
    {
        KmsError::KeyUnavailable {
            reason: Unavailable::NotPermitted,
            detail: format!("KMIP {address} refused the client certificate: {text}"),
        }
    } else if text.contains("invalid peer certificate") {
        KmsError::Config(format!("KMIP {address}: the server's certificate: {text}"))
    } else {
        KmsError::Unreachable(format!("KMIP {address}: TLS: {text}"))
    }
}

impl KeyService for KmipService {
    fn kind(&self) -> &'static str {
        "kmip"
    }

    fn wrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        data_key: &'a DataKey,
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, KmsError>> {
        Box::pin(async move {
            let mut nonce = [0u8; GCM_NONCE_LEN];
            rand::rngs::OsRng.fill_bytes(&mut nonce);
            let request = message::encrypt(&access.key_id, data_key.expose(), &nonce, context);
            let answer = message::crypto_answer(&self.call(access, request).await?)?;
            let tag = answer
                .auth_tag
                .filter(|t| t.len() == GCM_TAG_LEN)
                .ok_or_else(|| KmsError::Protocol("Encrypt: no 16-byte GCM tag".into()))?;
            if answer.data.len() != data_key.expose().len() {
                return Err(KmsError::Protocol(
                    "Encrypt: ciphertext of the wrong length".into(),
                ));
            }
            let mut out = nonce.to_vec();
            out.extend_from_slice(&tag);
            out.extend_from_slice(&answer.data);
            Ok(out)
        })
    }

    fn unwrap<'a>(
        &'a self,
        access: &'a KeyAccess,
        wrapped: &'a [u8],
        context: &'a [u8],
    ) -> BoxFuture<'a, Result<DataKey, KmsError>> {
        Box::pin(async move {
            if wrapped.len() <= GCM_NONCE_LEN + GCM_TAG_LEN {
                return Err(KmsError::WrappedKeyRejected);
            }
            let (nonce, rest) = wrapped.split_at(GCM_NONCE_LEN);
            let (tag, ciphertext) = rest.split_at(GCM_TAG_LEN);
            let request = message::decrypt(&access.key_id, ciphertext, nonce, context, tag);
            let answer = message::crypto_answer(&self.call(access, request).await?)?;
            DataKey::from_bytes(&answer.data).ok_or_else(|| {
                KmsError::Protocol("Decrypt: the plaintext is not a 32-byte key".into())
            })
        })
    }
}

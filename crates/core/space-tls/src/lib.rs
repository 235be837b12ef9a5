//! TLS listeners with bounded handshakes: the control plane's optional HTTPS listener (the
//! same application as the plaintext one, with a certificate the operator provides in PEM
//! files), and the node agent's mutual-TLS listener ([`TlsListener::new`] with its own
//! rustls configuration). It exists for clients that
//! only speak HTTPS to a host name: the E2B SDKs reach a sandbox's envd and ports at
//! `https://{port}-{sandbox id}.{domain}` unless `E2B_SANDBOX_URL` is set, so serving them
//! without a proxy in front takes a wildcard certificate for `*.{domain}` here.
//!
//! Handshakes run in tasks of their own, each bounded in time, and at most
//! [`MAX_HANDSHAKES`] at once: a client that opens a connection and sends nothing holds
//! one slot for [`HANDSHAKE_TIMEOUT`], never the accept loop.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a client may take to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in flight at once; further connections wait in the kernel's backlog.
pub const MAX_HANDSHAKES: usize = 256;
/// Finished handshakes waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// Where the TLS listener listens and what it presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListen {
    /// Address (port 0 picks a free one).
    pub listen: SocketAddr,
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why the TLS listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file cannot be read or holds nothing usable.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// The address cannot be listened on.
    #[error("listening on {addr} (TLS): {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why not.
        source: io::Error,
    },
}

fn pem_error(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// The rustls server configuration for `tls`: its certificate chain and key, ALPN h2 and
/// HTTP/1.1 (the server speaks both).
pub fn server_config(tls: &TlsListen) -> Result<rustls::ServerConfig, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert)
        .map_err(|e| pem_error(&tls.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem_error(&tls.cert, e))?;
    if chain.is_empty() {
        return Err(pem_error(&tls.cert, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| pem_error(&tls.key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// A listener whose connections have finished their TLS handshake, for `axum::serve`.
pub struct TlsListener {
    addr: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accept_loop: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Reads `tls`'s certificate and key, listens on its address and serves handshakes
    /// from now on.
    pub async fn bind(tls: &TlsListen) -> Result<Self, TlsError> {
        let config = server_config(tls)?;
        let listen_error = |source| TlsError::Listen {
            addr: tls.listen,
            source,
        };
        let listener = TcpListener::bind(tls.listen).await.map_err(listen_error)?;
        Self::new(listener, config).map_err(listen_error)
    }

    /// Serves handshakes on `listener` with `config` from now on.
    pub fn new(listener: TcpListener, config: rustls::ServerConfig) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let accept_loop = tokio::spawn(accept_loop(listener, acceptor, tx));
        Ok(Self {
            addr,
            ready,
            accept_loop,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off rather than spin, as axum's own loop does.
                tracing::warn!(error = %e, "TLS listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Small request and answer frames go out at once: with Nagle's algorithm a reply
        // written in two pieces waits for the peer's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop only ends when the runtime does; wait for that.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// Who is at the other end of a TLS connection: its address and the leaf of the
/// certificate chain the handshake verified (`None` if it presented none, where the
/// server's verifier allows that). Handlers read it as `ConnectInfo<TlsPeer>` and decide
/// what the certificate lets the peer do.
#[derive(Debug, Clone)]
pub struct TlsPeer {
    /// Its address.
    pub addr: SocketAddr,
    /// Its verified leaf certificate (DER).
    pub leaf: Option<rustls::pki_types::CertificateDer<'static>>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for TlsPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        let (_, tls) = stream.io().get_ref();
        TlsPeer {
            addr: *stream.remote_addr(),
            leaf: tls
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.clone().into_owned()),
        }
    }
}

/// Serves `app` on `listener`, each request knowing its [`TlsPeer`], until `stop` turns
/// true (open connections are then let finish: the caller bounds how long it waits).
pub fn serve_with_peers(
    listener: TlsListener,
    app: axum::Router,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<io::Result<()>> {
    let app = app.into_make_service_with_connect_info::<TlsPeer>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stopped(stop))
            .await
    })
}

/// Resolves once `stop` turns true (or its sender is gone): the graceful-shutdown signal
/// of every server here.
pub async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn missing_and_empty_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = write(dir.path(), "empty.pem", "");
        let tls = TlsListen {
            listen: "127.0.0.1:0".parse().expect("addr"),
            cert: empty.clone(),
            key: dir.path().join("missing.pem"),
        };
        let err = server_config(&tls).expect_err("empty chain");
        assert!(err.to_string().contains("empty.pem"), "{err}");
        assert!(err.to_string().contains("no certificate"), "{err}");
    }

    /// A self-signed certificate for `*.space.test` and its key, as PEM files in `dir`.
    fn self_signed(dir: &Path) -> (PathBuf, PathBuf, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let params =
            rcgen::CertificateParams::new(vec!["*.space.test".into(), "space.test".into()])
                .expect("params");
        let cert = params.self_signed(&key).expect("cert");
        (
            write(dir, "cert.pem", &cert.pem()),
            write(dir, "key.pem", &key.serialize_pem()),
            cert.pem(),
        )
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, _, _) = self_signed(dir.path());
        let other = write(
            dir.path(),
            "other.pem",
            &rcgen::KeyPair::generate().expect("key").serialize_pem(),
        );
        let tls = TlsListen {
            listen: "127.0.0.1:0".parse().expect("addr"),
            cert,
            key: other,
        };
        assert!(matches!(server_config(&tls), Err(TlsError::Config(_))));
    }

    #[tokio::test]
    async fn serves_https_while_a_silent_client_holds_a_handshake() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key, cert_pem) = self_signed(dir.path());
        let tls = TlsListen {
            listen: "127.0.0.1:0".parse().expect("addr"),
            cert,
            key,
        };
        let listener = TlsListener::bind(&tls).await.expect("listener");
        let addr = axum::serve::Listener::local_addr(&listener).expect("addr");
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        // Connects and never says hello.
        let _silent = TcpStream::connect(addr).await.expect("connect");
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(cert_pem.as_bytes()).expect("ca"))
            .resolve("49983-sbx.space.test", addr)
            .build()
            .expect("client");
        let url = format!("https://49983-sbx.space.test:{}/", addr.port());
        let body = client
            .get(&url)
            .send()
            .await
            .expect("get")
            .text()
            .await
            .expect("body");
        assert_eq!(body, "ok");
        // Plaintext on the TLS port gets no HTTP answer.
        let plain = reqwest::get(format!("http://127.0.0.1:{}/", addr.port())).await;
        assert!(plain.is_err(), "{plain:?}");
        server.abort();
    }

    #[test]
    fn garbage_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let garbage = write(
            dir.path(),
            "bad.pem",
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        );
        let tls = TlsListen {
            listen: "127.0.0.1:0".parse().expect("addr"),
            cert: garbage.clone(),
            key: garbage,
        };
        assert!(server_config(&tls).is_err());
    }
}

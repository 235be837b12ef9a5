//! Connections out: the [`Uplink`] the node provides (sockets in the uplink namespace, never
//! the sandbox's), the upstream TLS configuration, and the [`Connector`] every upstream
//! connection of a guest connection is made with (pass-through splices and the HTTP client
//! alike): always to the one address the proxy admitted, through the uplink, within the
//! sandbox's upstream slots and the connect timeout, then TLS verified for the name the
//! guest asked for.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::ca;

/// A boxed connect future (the trait is used as `Arc<dyn Uplink>`, so it cannot have an
/// `async fn`).
pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + 'a>>;

/// How the proxy opens TCP connections upstream. The node's implementation creates the
/// socket in the uplink namespace (the proxy's listener lives in the sandbox's namespace,
/// where nothing routes out); tests connect over loopback. The proxy bounds the call with
/// its connect timeout.
///
/// Implement it as `fn connect(&self, addr) -> ConnectFuture<'_> { Box::pin(async move { … }) }`.
pub trait Uplink: Send + Sync + 'static {
    /// A TCP connection to `addr`.
    fn connect(&self, addr: SocketAddr) -> ConnectFuture<'_>;

    /// A UDP socket connected to `addr`, for a flow the UDP relay admitted
    /// ([`crate::udp`]). Uplinks that carry no UDP refuse.
    fn udp(&self, addr: SocketAddr) -> UdpFuture<'_> {
        let _ = addr;
        Box::pin(async {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this uplink carries no UDP",
            ))
        })
    }
}

/// A boxed future of a connected UDP socket.
pub type UdpFuture<'a> =
    Pin<Box<dyn Future<Output = io::Result<tokio::net::UdpSocket>> + Send + 'a>>;

/// The upstream TLS client configuration: Mozilla's root set (`webpki-roots`) plus
/// `extra_roots` (a node's own CA, or a test's), with this crate's crypto provider. The proxy
/// sets ALPN itself; everything else is used as given.
pub fn upstream_tls_config(
    extra_roots: &[CertificateDer<'static>],
) -> Result<Arc<ClientConfig>, rustls::Error> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for root in extra_roots {
        roots.add(root.clone())?;
    }
    let config = ClientConfig::builder_with_provider(ca::crypto_provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// `config` offering exactly these ALPN protocols.
pub(super) fn with_alpn(config: &ClientConfig, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut config = config.clone();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// TLS towards upstream: the configuration and the name the certificate must be valid for.
#[derive(Clone)]
pub(super) struct UpstreamTls {
    pub(super) config: Arc<ClientConfig>,
    pub(super) name: ServerName<'static>,
}

/// Makes the upstream connections of one guest connection: always to `addr`.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) uplink: Arc<dyn Uplink>,
    pub(super) slots: Arc<Semaphore>,
    pub(super) addr: SocketAddr,
    pub(super) tls: Option<UpstreamTls>,
    pub(super) timeout: Duration,
}

impl Connector {
    /// One connection: an upstream slot, TCP through the uplink, TLS if configured, all within
    /// the connect timeout.
    pub(super) async fn connect(&self) -> io::Result<UpstreamStream> {
        let attempt = async {
            let slot = Arc::clone(&self.slots)
                .acquire_owned()
                .await
                .map_err(|_| io::Error::other("upstream connection slots closed"))?;
            let tcp = self.uplink.connect(self.addr).await?;
            // Latency over throughput for request/response traffic; harmless for bulk.
            let _ = tcp.set_nodelay(true);
            let Some(tls) = &self.tls else {
                return Ok(UpstreamStream {
                    io: UpstreamIo::Plain(tcp),
                    h2: false,
                    _slot: slot,
                });
            };
            let stream = TlsConnector::from(Arc::clone(&tls.config))
                .connect(tls.name.clone(), tcp)
                .await?;
            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            Ok(UpstreamStream {
                io: UpstreamIo::Tls(Box::new(stream)),
                h2,
                _slot: slot,
            })
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "upstream connect timed out",
                ))
            })
    }
}

/// The HTTP client's connector: whatever URI it is asked for (always the connection's own
/// origin), it connects to the admitted address.
impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<UpstreamStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.connect().await.map(TokioIo::new) })
    }
}

enum UpstreamIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An upstream connection, holding one of the sandbox's upstream slots while it lives.
pub(super) struct UpstreamStream {
    io: UpstreamIo,
    h2: bool,
    _slot: OwnedSemaphorePermit,
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        let connected = Connected::new();
        if self.h2 {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.io {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            UpstreamIo::Plain(s) => s.is_write_vectored(),
            UpstreamIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

//! TCP connections to servers inside the guest, so the host can reach them
//! (`POST /v1/ports/{port}/connect`): the daemon connects to the guest's own network
//! address and splices the connection to the request's HTTP/2 stream.
//!
//! Never to loopback: a server the agent bound to `127.0.0.1` (or `[::1]`) believing it
//! private stays private; what the host can reach is what is bound to the wildcard address
//! or to the guest's network address, as it would be on a network. The connection still
//! never leaves the guest (the kernel routes a connection to a local address over `lo`).
//!
//! Architecture invariant: this is the one place the daemon opens a TCP socket, and it only
//! ever *connects*, to an address of the guest's own; it listens on no network socket.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;
use space_core::ErrorCode;
use space_guest_proto::limits::PORT_CONNECT_TIMEOUT_MS;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::ApiError;

/// Bytes read from the connection at once (one response chunk).
const READ_CHUNK: usize = 16 * 1024;

/// The error for a port nothing listens on; the words "port is not open" are what clients
/// (the E2B SDKs among them) look for.
fn closed(port: u16, addr: IpAddr, e: &io::Error) -> ApiError {
    ApiError::new(
        ErrorCode::PortClosed,
        format!(
            "port is not open: nothing in the sandbox accepts connections on port {port} at its \
             address {addr} ({e}); servers bound to loopback only are private"
        ),
    )
}

/// One address of an interface, as `getifaddrs` lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceAddress {
    /// The address.
    pub addr: IpAddr,
    /// Whether the interface is up and not loopback.
    pub up_not_loopback: bool,
}

/// The addresses to connect to, best first: the IPv4 addresses of interfaces that are up
/// and not loopback, then their global IPv6 ones (link-local ones need a scope, and a
/// dual-stack server on `[::]` takes IPv4 anyway). Never a loopback address, whatever
/// interface carries it.
pub fn own_addresses(all: impl IntoIterator<Item = InterfaceAddress>) -> Vec<IpAddr> {
    let usable: Vec<IpAddr> = all
        .into_iter()
        .filter(|a| a.up_not_loopback && !a.addr.is_loopback() && !a.addr.is_unspecified())
        .map(|a| a.addr)
        .collect();
    let v4 = usable.iter().copied().filter(IpAddr::is_ipv4);
    let v6 = usable.iter().copied().filter(|a| match a {
        IpAddr::V6(v6) => !v6.is_unicast_link_local() && !v6.is_multicast(),
        IpAddr::V4(_) => false,
    });
    v4.chain(v6).collect()
}

fn interface_addresses() -> io::Result<Vec<InterfaceAddress>> {
    let mut out = Vec::new();
    for ifa in getifaddrs().map_err(io::Error::from)? {
        let Some(storage) = ifa.address else { continue };
        let addr = if let Some(v4) = storage.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = storage.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let up_not_loopback = ifa.flags.contains(InterfaceFlags::IFF_UP)
            && !ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK);
        out.push(InterfaceAddress {
            addr,
            up_not_loopback,
        });
    }
    Ok(out)
}

/// Connects to `port` at the guest's own network address (the first that accepts, of
/// [`own_addresses`]).
pub async fn connect(port: u16) -> Result<TcpStream, ApiError> {
    let addresses = interface_addresses()
        .map(own_addresses)
        .map_err(|e| ApiError::internal(format!("list the guest's addresses: {e}")))?;
    let Some(&first) = addresses.first() else {
        return Err(ApiError::new(
            ErrorCode::PortClosed,
            format!(
                "port is not open: the sandbox has no network address to reach port {port} at \
                 (servers bound to loopback only are private)"
            ),
        ));
    };
    let attempt = async {
        let mut refused = None;
        for addr in &addresses {
            match TcpStream::connect(SocketAddr::new(*addr, port)).await {
                Ok(s) => return Ok(s),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    refused.get_or_insert(e);
                }
                Err(e) => return Err(closed(port, *addr, &e)),
            }
        }
        let e = refused.unwrap_or_else(|| io::Error::from(io::ErrorKind::ConnectionRefused));
        Err(closed(port, first, &e))
    };
    let timeout = Duration::from_millis(PORT_CONNECT_TIMEOUT_MS);
    let stream = tokio::time::timeout(timeout, attempt).await.map_err(|_| {
        ApiError::new(
            ErrorCode::Timeout,
            format!("port {port} did not accept the connection within {timeout:?}"),
        )
    })??;
    // Interactive traffic (terminals, WebSockets) should not wait for Nagle.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Splices `tcp` to one HTTP/2 stream: `body` (the request's) is written to the connection
/// frame by frame, its end half-closes the write side; the returned stream (the response's
/// body) is what the connection sends, until it closes. `permit` is held until both
/// directions are done. Flow control bounds both: the next request frame is not read until
/// the last is written, and the connection is read only as the response is sent.
pub fn splice(
    tcp: TcpStream,
    body: Body,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    let permit = Arc::new(permit);
    let (read, write) = tcp.into_split();
    tokio::spawn(feed(body, write, permit.clone()));
    tokio_util::io::ReaderStream::with_capacity(read, READ_CHUNK).map(move |chunk| {
        let _held = &permit;
        chunk
    })
}

/// Writes the request body to the connection; at its end, half-closes it. A body that fails
/// (the host reset the stream) drops the write side.
async fn feed(mut body: Body, mut write: OwnedWriteHalf, _permit: Arc<OwnedSemaphorePermit>) {
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return;
        };
        if let Ok(data) = frame.into_data() {
            if write.write_all(&data).await.is_err() {
                return;
            }
        }
    }
    let _ = write.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addr: &str, up_not_loopback: bool) -> InterfaceAddress {
        InterfaceAddress {
            addr: addr.parse().unwrap(),
            up_not_loopback,
        }
    }

    #[test]
    fn only_the_guests_network_addresses_are_connected_to() {
        let all = [
            at("127.0.0.1", false),
            at("::1", false),
            at("fe80::1", true),
            at("2001:db8::15", true),
            at("10.0.2.15", true),
            // A loopback address on another interface, and a card that is down.
            at("127.0.0.2", true),
            at("192.0.2.9", false),
        ];
        let want: Vec<IpAddr> = vec![
            "10.0.2.15".parse().unwrap(),
            "2001:db8::15".parse().unwrap(),
        ];
        assert_eq!(own_addresses(all), want);
        assert!(own_addresses([at("127.0.0.1", false)]).is_empty());
    }
}

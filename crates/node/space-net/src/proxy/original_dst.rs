//! The destination a guest connection was addressed to before nftables redirected it.
//!
//! The sandbox namespace's `REDIRECT` rule rewrites the destination of every guest TCP
//! connection to the proxy's listener; conntrack remembers the original tuple, and the
//! kernel hands it back through `getsockopt` on the accepted socket: `SOL_IP` /
//! `SO_ORIGINAL_DST` (a `sockaddr_in`) for IPv4, `SOL_IPV6` / `IP6T_SO_ORIGINAL_DST` (a
//! `sockaddr_in6`) for IPv6. Both options have the same number (80) and rely on conntrack,
//! as the redirect itself does. A socket that was not redirected gets `ENOENT`.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};

use tokio::net::TcpStream;

/// The original destination of a connection accepted on a listener that nftables
/// `REDIRECT`s guest traffic to (see the module docs). An IPv4 connection accepted on a
/// dual-stack IPv6 listener (local address `::ffff:a.b.c.d`) is asked with the IPv4 option.
///
/// Errors: `ENOENT` when the connection was not redirected (no NAT entry), any other
/// `getsockopt` error, or `InvalidData` when the kernel answers with an unexpected address
/// family or size.
pub fn original_dst(stream: &TcpStream) -> io::Result<SocketAddr> {
    let fd = stream.as_raw_fd();
    let ipv4 = match stream.local_addr()? {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(local) => local.ip().to_ipv4_mapped().is_some(),
    };
    if ipv4 {
        let addr: libc::sockaddr_in = getsockopt(fd, libc::SOL_IP, libc::SO_ORIGINAL_DST)?;
        if i32::from(addr.sin_family) != libc::AF_INET {
            return Err(unexpected("address family of SO_ORIGINAL_DST"));
        }
        Ok(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
            u16::from_be(addr.sin_port),
        )))
    } else {
        let addr: libc::sockaddr_in6 = getsockopt(fd, libc::SOL_IPV6, libc::IP6T_SO_ORIGINAL_DST)?;
        if i32::from(addr.sin6_family) != libc::AF_INET6 {
            return Err(unexpected("address family of IP6T_SO_ORIGINAL_DST"));
        }
        Ok(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(addr.sin6_addr.s6_addr),
            u16::from_be(addr.sin6_port),
            u32::from_be(addr.sin6_flowinfo),
            addr.sin6_scope_id,
        )))
    }
}

/// `getsockopt` for an option whose value is a plain C struct `T` that must fill the
/// whole buffer.
fn getsockopt<T: Copy>(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<T> {
    let mut value = MaybeUninit::<T>::zeroed();
    let Ok(mut len) = libc::socklen_t::try_from(size_of::<T>()) else {
        return Err(unexpected("option size"));
    };
    // SAFETY: `value` is a writable buffer of `len` bytes that outlives the call, and `len`
    // is a valid in/out length pointer; the kernel writes at most `len` bytes.
    let rc = unsafe { libc::getsockopt(fd, level, name, value.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if usize::try_from(len).ok() != Some(size_of::<T>()) {
        return Err(unexpected("option size"));
    }
    // SAFETY: the buffer started zeroed (a valid value of these plain C structs) and the
    // kernel filled all of it.
    Ok(unsafe { value.assume_init() })
}

fn unexpected(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("unexpected {what}"))
}

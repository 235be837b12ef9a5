//! The guest's network card, configured statically from what the node sends in
//! `POST /v1/configure`: address, MTU, link up, default route, and the one DNS server (the
//! node's gateway). Done with the kernel's ioctls so no template needs `ip` or a DHCP client.
//! Idempotent: a restored or forked guest that already has the configuration gets it again.

use std::io;
use std::mem;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use space_guest_proto::GuestNetwork;

/// Applies `net`; returns the name of the interface it configured.
pub fn apply(net: &GuestNetwork) -> io::Result<String> {
    let mac = net
        .mac_bytes()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad MAC"))?;
    let ifname = find_interface(Path::new("/sys/class/net"), mac)?;
    let sock = inet_socket()?;
    let fd = sock.as_raw_fd();

    let mut req = ifreq(&ifname)?;
    req.ifr_ifru.ifru_mtu = libc::c_int::from(net.mtu);
    ioctl(fd, libc::SIOCSIFMTU, &mut req, "set MTU")?;

    let mut req = ifreq(&ifname)?;
    req.ifr_ifru.ifru_addr = sockaddr(net.address);
    ioctl(fd, libc::SIOCSIFADDR, &mut req, "set address")?;

    let mut req = ifreq(&ifname)?;
    req.ifr_ifru.ifru_netmask = sockaddr(netmask(net.prefix));
    ioctl(fd, libc::SIOCSIFNETMASK, &mut req, "set netmask")?;

    let mut req = ifreq(&ifname)?;
    ioctl(fd, libc::SIOCGIFFLAGS, &mut req, "get flags")?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ioctl(fd, libc::SIOCSIFFLAGS, &mut req, "bring the link up")?;

    add_default_route(fd, net.gateway)?;
    write_resolv_conf(net.dns)?;
    Ok(ifname)
}

/// The interface whose MAC is `mac`, from sysfs.
fn find_interface(sys_class_net: &Path, mac: [u8; 6]) -> io::Result<String> {
    let want = space_core::mac::format(&mac);
    for entry in std::fs::read_dir(sys_class_net)? {
        let entry = entry?;
        let address = std::fs::read_to_string(entry.path().join("address")).unwrap_or_default();
        if address.trim().eq_ignore_ascii_case(&want) {
            return Ok(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("no network interface has MAC {want}"),
    ))
}

fn inet_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad interface name",
        ));
    }
    for (dst, &src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

fn sockaddr(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size; the kernel reads it as sockaddr_in
    // because of sin_family.
    unsafe { mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// The netmask of a prefix length (0..=32).
fn netmask(prefix: u8) -> Ipv4Addr {
    let bits = u32::from(prefix.min(32));
    Ipv4Addr::from(u32::MAX.checked_shl(32 - bits).unwrap_or(0))
}

fn ioctl(
    fd: libc::c_int,
    request: libc::Ioctl,
    req: &mut libc::ifreq,
    what: &str,
) -> io::Result<()> {
    // SAFETY: `req` is a valid ifreq for these SIOC*IF* requests.
    if unsafe { libc::ioctl(fd, request, req as *mut libc::ifreq) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

fn add_default_route(fd: libc::c_int, gateway: Ipv4Addr) -> io::Result<()> {
    // SAFETY: rtentry is plain data; all zeroes is valid (no device, default metric).
    let mut rt: libc::rtentry = unsafe { mem::zeroed() };
    rt.rt_dst = sockaddr(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr(gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: `rt` is a valid rtentry for SIOCADDRT.
    if unsafe { libc::ioctl(fd, libc::SIOCADDRT, &mut rt as *mut libc::rtentry) } < 0 {
        let e = io::Error::last_os_error();
        // Already there: a restored guest configured again.
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(io::Error::new(e.kind(), format!("add default route: {e}")));
        }
    }
    Ok(())
}

/// The gateway is the only resolver; whatever the template had is replaced.
fn write_resolv_conf(dns: Ipv4Addr) -> io::Result<()> {
    let path = Path::new("/etc/resolv.conf");
    // A dangling symlink (systemd-resolved's stub in some templates) would make the write
    // fail; replace it with a plain file.
    if path
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        std::fs::remove_file(path)?;
    }
    std::fs::write(path, format!("nameserver {dns}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netmasks() {
        assert_eq!(netmask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(netmask(30), Ipv4Addr::new(255, 255, 255, 252));
        assert_eq!(netmask(0), Ipv4Addr::UNSPECIFIED);
        assert_eq!(netmask(32), Ipv4Addr::BROADCAST);
    }

    #[test]
    fn finds_the_interface_by_mac() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, mac) in [("lo", "00:00:00:00:00:00"), ("eth0", "02:53:50:00:02:0f")] {
            std::fs::create_dir(dir.path().join(name)).expect("mkdir");
            std::fs::write(dir.path().join(name).join("address"), format!("{mac}\n"))
                .expect("write");
        }
        let found = find_interface(dir.path(), [2, 0x53, 0x50, 0, 2, 0x0f]).expect("found");
        assert_eq!(found, "eth0");
        assert!(find_interface(dir.path(), [2, 0, 0, 0, 0, 1]).is_err());
    }
}

//! Which channel the agent serves on and how to find and open it.
//!
//! Under QEMU the channel is a virtio-serial port named `space.agent`; without udev we map
//! `/sys/class/virtio-ports/vportNpM/name` to the devtmpfs node `/dev/vportNpM`. Under
//! Firecracker it is a vsock listener. In development it is a Unix socket the host connects to.

use std::fmt;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use space_guest_proto::{VIRTIO_SERIAL_PORT_NAME, VSOCK_PORT};

/// Where the agent takes its sessions from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelSpec {
    /// The `space.agent` virtio-serial port, else vsock port 1024.
    Auto,
    /// A virtio-serial port by name.
    VirtioSerial(String),
    /// Listen on this vsock port.
    Vsock(u32),
    /// Listen on this Unix socket path (development and tests).
    Unix(PathBuf),
}

impl fmt::Display for ChannelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelSpec::Auto => f.write_str("auto"),
            ChannelSpec::VirtioSerial(n) => write!(f, "virtio-serial:{n}"),
            ChannelSpec::Vsock(p) => write!(f, "vsock:{p}"),
            ChannelSpec::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A `--channel` value that cannot be parsed.
#[derive(Debug, thiserror::Error)]
#[error("bad channel '{0}': expected auto, virtio-serial:NAME, vsock:PORT or unix:PATH")]
pub struct ChannelParseError(String);

impl FromStr for ChannelSpec {
    type Err = ChannelParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ChannelParseError(s.to_owned());
        if s == "auto" {
            return Ok(ChannelSpec::Auto);
        }
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        match kind {
            "virtio-serial" if !rest.is_empty() && !rest.contains('/') => {
                Ok(ChannelSpec::VirtioSerial(rest.to_owned()))
            }
            "vsock" => rest.parse().map(ChannelSpec::Vsock).map_err(|_| bad()),
            "unix" if !rest.is_empty() => Ok(ChannelSpec::Unix(PathBuf::from(rest))),
            _ => Err(bad()),
        }
    }
}

/// A channel that is ready to serve.
#[derive(Debug)]
pub enum Channel {
    /// An open virtio-serial port (one long-lived byte stream).
    VirtioSerial {
        /// The device path, for logs.
        path: PathBuf,
        /// The open port.
        fd: OwnedFd,
    },
    /// A listening vsock socket.
    Vsock(OwnedFd),
    /// A listening Unix socket.
    Unix(tokio::net::UnixListener, PathBuf),
}

/// Why no channel could be opened.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// Auto-detection found neither channel.
    #[error(
        "no virtio-serial port named '{VIRTIO_SERIAL_PORT_NAME}' and vsock is unavailable ({0})"
    )]
    NotFound(io::Error),
    /// The named virtio-serial port does not exist.
    #[error("no virtio-serial port named '{0}' under /sys/class/virtio-ports")]
    NoPort(String),
    /// Opening or binding failed.
    #[error("cannot open {what}: {source}")]
    Open {
        /// What was being opened.
        what: String,
        /// The error.
        source: io::Error,
    },
}

const VIRTIO_PORTS: &str = "/sys/class/virtio-ports";

/// The `/dev` node of the virtio-serial port called `name`, if the kernel has it.
pub fn find_virtio_port(sys_dir: &Path, name: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(sys_dir).ok()?;
    let mut found: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let dir = e.file_name().to_str()?.to_owned();
            let port_name = std::fs::read_to_string(e.path().join("name")).ok()?;
            (port_name.trim_end() == name).then_some(dir)
        })
        .collect();
    found.sort();
    found.first().map(|d| Path::new("/dev").join(d))
}

fn open_port(path: &Path) -> Result<OwnedFd, ChannelError> {
    let err = |source| ChannelError::Open {
        what: path.display().to_string(),
        source,
    };
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| err(io::ErrorKind::InvalidInput.into()))?;
    // The device node appears in devtmpfs as the driver registers the port; give it a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: c is a valid NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if fd >= 0 {
            // SAFETY: fd was just returned by open and is owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) || Instant::now() > deadline {
            return Err(err(e));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Binds and listens on a vsock port (any CID).
pub fn listen_vsock(port: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd = unsafe {
        libc::socket(
            libc::AF_VSOCK,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_vm is plain data; zeroed is a valid starting point.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_port = port;
    addr.svm_cid = libc::VMADDR_CID_ANY;
    use std::os::fd::AsRawFd;
    // SAFETY: addr is a valid sockaddr_vm of the size given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_vm).cast(),
            std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen on our socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 4) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Opens the channel described by `spec`. Must run inside the tokio runtime (Unix listener).
pub fn open(spec: &ChannelSpec) -> Result<Channel, ChannelError> {
    match spec {
        ChannelSpec::VirtioSerial(name) => {
            let path = find_virtio_port(Path::new(VIRTIO_PORTS), name)
                .ok_or_else(|| ChannelError::NoPort(name.clone()))?;
            let fd = open_port(&path)?;
            Ok(Channel::VirtioSerial { path, fd })
        }
        ChannelSpec::Vsock(port) => {
            let fd = listen_vsock(*port).map_err(|source| ChannelError::Open {
                what: format!("vsock port {port}"),
                source,
            })?;
            Ok(Channel::Vsock(fd))
        }
        ChannelSpec::Unix(path) => {
            // Replace a stale socket from an earlier run, but never any other kind of file.
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(path);
            }
            let listener =
                tokio::net::UnixListener::bind(path).map_err(|source| ChannelError::Open {
                    what: path.display().to_string(),
                    source,
                })?;
            Ok(Channel::Unix(listener, path.clone()))
        }
        ChannelSpec::Auto => {
            // The virtio_console driver was loaded by the initramfs; when its class exists but
            // our port is not registered yet, wait a little before falling back to vsock.
            let sys = Path::new(VIRTIO_PORTS);
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                if let Some(path) = find_virtio_port(sys, VIRTIO_SERIAL_PORT_NAME) {
                    let fd = open_port(&path)?;
                    return Ok(Channel::VirtioSerial { path, fd });
                }
                if !sys.exists() || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            listen_vsock(VSOCK_PORT)
                .map(Channel::Vsock)
                .map_err(ChannelError::NotFound)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!("auto".parse::<ChannelSpec>().unwrap(), ChannelSpec::Auto);
        assert_eq!(
            "vsock:1024".parse::<ChannelSpec>().unwrap(),
            ChannelSpec::Vsock(1024)
        );
        assert_eq!(
            "unix:/tmp/s".parse::<ChannelSpec>().unwrap(),
            ChannelSpec::Unix("/tmp/s".into())
        );
        assert_eq!(
            "virtio-serial:space.agent".parse::<ChannelSpec>().unwrap(),
            ChannelSpec::VirtioSerial("space.agent".into())
        );
        for bad in ["", "vsock:x", "unix:", "virtio-serial:../x", "tcp:1"] {
            assert!(bad.parse::<ChannelSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn finds_port_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for (d, n) in [("vport0p0", "other\n"), ("vport1p1", "space.agent\n")] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
            std::fs::write(dir.path().join(d).join("name"), n).unwrap();
        }
        assert_eq!(
            find_virtio_port(dir.path(), "space.agent"),
            Some(PathBuf::from("/dev/vport1p1"))
        );
        assert_eq!(find_virtio_port(dir.path(), "nope"), None);
    }
}

//! The uplink on the real kernel: connections made from a namespace of their own (a
//! stand-in "internet" with its own address), with marked sockets, and the uplink guard
//! below them. Its DNS lookups are tested end to end, from real sandboxes, in
//! test-support's `network.rs`. Needs root, iproute2 and nft.

use std::net::{Ipv4Addr, SocketAddr};

use std::sync::Arc;

use space_net::datapath::netns;
use space_net::datapath::uplink_guard::{self, MarkedSockets, UplinkSocketKind};
use space_net::proxy::Uplink;
use space_net::uplink::NetnsUplink;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Deletes the namespace when the test ends, however it ends.
struct Namespace(String);

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = netns::delete(&self.0);
    }
}

const WEB: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 1);
/// The firewall mark of these tests' uplink sockets.
const MARK: u32 = 0x5ace_7e57;

/// A server on port 7 of every address of namespace `name` that accepts and drops.
fn accept_on_port_7(name: &str) {
    let listener = netns::run_in(name, || {
        let l = std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 7))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .expect("bind");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    tokio::spawn(async move { while listener.accept().await.is_ok() {} });
}

/// Marked sockets made in namespace `name`.
fn sockets(name: &str) -> Arc<MarkedSockets> {
    Arc::new(MarkedSockets::new(Some(name), MARK).expect("socket maker"))
}

/// A namespace of its own (named `prefix-<pid>`) whose loopback is up and holds [`WEB`].
fn stand_in_internet(prefix: &str) -> Namespace {
    let name = format!("{prefix}-{}", std::process::id());
    netns::create(&name).expect("create namespace");
    let ns = Namespace(name.clone());
    for args in [
        vec!["-n", &name, "link", "set", "lo", "up"],
        vec!["-n", &name, "addr", "add", "11.0.0.1/32", "dev", "lo"],
    ] {
        let ok = std::process::Command::new("ip")
            .args(&args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args:?}");
    }
    ns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_from_the_uplink_namespace() {
    let ns = stand_in_internet("spt-uplink");
    let name = ns.0.clone();
    let listener = netns::run_in(&name, || {
        let l = std::net::TcpListener::bind((WEB, 7))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .expect("bind");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    // Tells each client the address it came from.
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(peer.ip().to_string().as_bytes()).await;
            });
        }
    });

    let uplink = NetnsUplink::start(Some(&name), &[], Default::default(), sockets(&name))
        .expect("start uplink");
    let mut s = uplink
        .connect(SocketAddr::from((WEB, 7)))
        .await
        .expect("connect through the uplink");
    let mut seen = String::new();
    s.read_to_string(&mut seen).await.expect("read");
    // The connection came from inside the uplink namespace (its only address is 11.0.0.1),
    // not from the host's.
    assert_eq!(seen, "11.0.0.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_what_the_egress_ceiling_forbids() {
    use space_core::egress::EgressCeiling;
    let ns = stand_in_internet("spt-ceiling");
    let name = ns.0.clone();
    accept_on_port_7(&name);

    // 11.0.0.1 stands for the node's own (public) address here.
    let node = vec![std::net::IpAddr::V4(WEB)];
    let ceiling = Arc::new(EgressCeiling::new(vec![], node.clone()).expect("ceiling"));
    let uplink =
        NetnsUplink::start(Some(&name), &[], ceiling, sockets(&name)).expect("start uplink");
    for addr in [
        SocketAddr::from((WEB, 7)),
        SocketAddr::from((Ipv4Addr::LOCALHOST, 7)),
        "[::ffff:11.0.0.1]:7".parse().unwrap(),
    ] {
        let err = uplink.connect(addr).await.expect_err("refused");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::PermissionDenied,
            "{addr}: {err}"
        );
        let err = uplink.udp(addr).await.expect_err("refused");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::PermissionDenied,
            "{addr}: {err}"
        );
    }
    // What the operator grants, it reaches.
    let granted = EgressCeiling::new(vec!["127.0.0.0/8".parse().unwrap()], node).expect("ceiling");
    let uplink = NetnsUplink::start(Some(&name), &[], Arc::new(granted), sockets(&name))
        .expect("start uplink");
    uplink
        .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 7)))
        .await
        .expect("a granted network is reached");
}

/// Below every decision: with the guard installed, a marked socket connected straight to a
/// forbidden address (as a bug in the gateway's checks would) is refused by the kernel, a
/// granted one and a public one are reached, and unmarked sockets are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_refuses_what_the_ceiling_forbids_below_the_uplinks_checks() {
    let ns = stand_in_internet("spt-guard");
    let name = ns.0.clone();
    accept_on_port_7(&name);
    // 11.0.0.1 is public-class: the guard forbids it only as a node address.
    let granted: Vec<ipnet::IpNet> = vec!["127.0.0.2/32".parse().unwrap()];
    let forbidden =
        uplink_guard::forbidden_networks(&[std::net::IpAddr::V4(Ipv4Addr::new(11, 9, 9, 9))]);
    let script = uplink_guard::script("space_uplink_test", MARK, &forbidden, &granted);
    uplink_guard::apply(Some(&name), &script).expect("install the guard");
    // Installing again replaces it (one transaction).
    uplink_guard::apply(Some(&name), &script).expect("replace the guard");

    let marked = sockets(&name);
    let connect = |addr: SocketAddr| {
        let fd = marked.socket(UplinkSocketKind::Tcp4).expect("socket");
        async move {
            tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd))
                .connect(addr)
                .await
        }
    };
    let err = connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 7)))
        .await
        .expect_err("loopback is forbidden");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    connect(SocketAddr::from((Ipv4Addr::new(127, 0, 0, 2), 7)))
        .await
        .expect("a granted network is reached");
    connect(SocketAddr::from((WEB, 7)))
        .await
        .expect("a public address is reached");
    // A UDP datagram to a forbidden address is refused on send.
    let udp = std::net::UdpSocket::from(marked.socket(UplinkSocketKind::Udp4).expect("udp"));
    udp.connect((Ipv4Addr::LOCALHOST, 9)).expect("connect udp");
    assert!(udp.send(b"x").is_err(), "a datagram to loopback leaves");
    // The namespace's own (unmarked) sockets are not the guard's business.
    netns::run_in(&name, || {
        std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, 7)).map(drop)
    })
    .expect("unmarked sockets connect");
    uplink_guard::remove(Some(&name), "space_uplink_test").expect("remove");
    connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 7)))
        .await
        .expect("without the guard the kernel does not refuse");
}

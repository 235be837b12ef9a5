//! The uplink on the real kernel: connections and DNS lookups made from a namespace of
//! their own (a stand-in "internet" with its own addresses, a TCP echo server and a DNS
//! server). Needs root and iproute2.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use space_core::egress::Hostname;
use space_net::datapath::netns;
use space_net::dns::Upstream;
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

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const WEB: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 1);
const DNS: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 53);

/// Answers every A query with [`WEB`].
async fn dns_server(udp: tokio::net::UdpSocket) {
    let mut buf = vec![0u8; 1500];
    while let Ok((n, from)) = udp.recv_from(&mut buf).await {
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut answer = Message::new();
        answer
            .set_id(query.id())
            .set_message_type(MessageType::Response)
            .set_op_code(query.op_code())
            .set_recursion_desired(query.recursion_desired())
            .set_recursion_available(true);
        for q in query.queries() {
            answer.add_query(q.clone());
            if q.query_type() == RecordType::A {
                answer.add_answer(Record::from_rdata(q.name().clone(), 60, RData::A(A(WEB))));
            }
        }
        if let Ok(bytes) = answer.to_vec() {
            let _ = udp.send_to(&bytes, from).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_and_resolves_from_the_uplink_namespace() {
    let name = format!("spt-inet-{}", std::process::id());
    netns::create(&name).expect("create namespace");
    let _ns = Namespace(name.clone());
    ip(&["-n", &name, "link", "set", "lo", "up"]);
    for a in [WEB, DNS] {
        ip(&["-n", &name, "addr", "add", &format!("{a}/32"), "dev", "lo"]);
    }

    let listener = netns::run_in(&name, || {
        let l = std::net::TcpListener::bind((WEB, 7))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .expect("bind echo");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    // Tells each client the address it came from.
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(peer.ip().to_string().as_bytes()).await;
            });
        }
    });
    let udp = netns::run_in(&name, || {
        let u = std::net::UdpSocket::bind((DNS, 53))?;
        u.set_nonblocking(true)?;
        Ok(u)
    })
    .expect("bind dns");
    tokio::spawn(dns_server(
        tokio::net::UdpSocket::from_std(udp).expect("tokio udp"),
    ));

    let uplink =
        NetnsUplink::start(Some(&name), &[SocketAddr::from((DNS, 53))]).expect("start uplink");
    let mut s = uplink
        .connect(SocketAddr::from((WEB, 7)))
        .await
        .expect("connect through the uplink");
    let mut seen = String::new();
    s.read_to_string(&mut seen).await.expect("read");
    // The connection came from inside the uplink namespace (its only addresses are 11.0.0.x),
    // not from the host's.
    assert!(seen.starts_with("11.0.0."), "peer address {seen}");

    let host = Hostname::parse("example.test").expect("hostname");
    let addrs = uplink.lookup(&host, RecordType::A).await.expect("lookup");
    let ips: Vec<IpAddr> = addrs.iter().map(|a| a.addr).collect();
    assert_eq!(ips, vec![IpAddr::V4(WEB)]);
}

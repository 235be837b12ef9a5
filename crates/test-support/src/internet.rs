//! A stand-in "internet" for network tests: a network namespace of its own with a DNS
//! server that answers every A query with one address, and an HTTP server there. Nodes
//! under test use it as their uplink namespace, so nothing leaves the machine.

/// A stand-in "internet" in a namespace of its own: a DNS server answering every A query
/// with [`WEB`], and an HTTP server there. Nothing leaves the machine.
pub struct Internet {
    /// The namespace's name (the node's `uplink_netns`).
    pub name: String,
}

/// The web server's address (every name resolves to it).
pub const WEB: std::net::Ipv4Addr = std::net::Ipv4Addr::new(11, 0, 0, 1);
/// The DNS server's address.
pub const DNS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(11, 0, 0, 53);
/// What the web server answers.
pub const PAGE: &str = "hello from the internet";

impl Internet {
    /// Starts it (needs a tokio runtime: the servers are tasks on it).
    pub fn start() -> Internet {
        use space_net::datapath::netns;
        let name = format!("spt-inet-{}", space_core::SandboxId::generate().as_str());
        netns::create(&name).expect("create the internet namespace");
        let inet = Internet { name: name.clone() };
        for args in [
            vec!["-n", &name, "link", "set", "lo", "up"],
            vec!["-n", &name, "addr", "add", "11.0.0.1/32", "dev", "lo"],
            vec!["-n", &name, "addr", "add", "11.0.0.53/32", "dev", "lo"],
        ] {
            let ok = std::process::Command::new("ip")
                .args(&args)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip {args:?}");
        }
        let (web, dns) = netns::run_in(&name, || {
            let web = std::net::TcpListener::bind((WEB, 80))?;
            web.set_nonblocking(true)?;
            let dns = std::net::UdpSocket::bind((DNS, 53))?;
            dns.set_nonblocking(true)?;
            Ok((web, dns))
        })
        .expect("bind in the internet namespace");
        let web = tokio::net::TcpListener::from_std(web).expect("tokio listener");
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = web.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{PAGE}",
                        PAGE.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        let dns = tokio::net::UdpSocket::from_std(dns).expect("tokio udp");
        tokio::spawn(async move {
            use hickory_proto::op::{Message, MessageType};
            use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
            let mut buf = vec![0u8; 1500];
            while let Ok((n, from)) = dns.recv_from(&mut buf).await {
                let Ok(q) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let mut a = Message::new();
                a.set_id(q.id())
                    .set_message_type(MessageType::Response)
                    .set_op_code(q.op_code())
                    .set_recursion_desired(q.recursion_desired())
                    .set_recursion_available(true);
                for query in q.queries() {
                    a.add_query(query.clone());
                    if query.query_type() == RecordType::A {
                        a.add_answer(Record::from_rdata(
                            query.name().clone(),
                            60,
                            RData::A(A(WEB)),
                        ));
                    }
                }
                if let Ok(bytes) = a.to_vec() {
                    let _ = dns.send_to(&bytes, from).await;
                }
            }
        });
        inet
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = space_net::datapath::netns::delete(&self.name);
    }
}

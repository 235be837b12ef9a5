//! The uplink on the real kernel: connections made from a namespace of their own (a
//! stand-in "internet" with its own address). Its DNS lookups are tested end to end, from
//! real sandboxes, in test-support's `network.rs`. Needs root and iproute2.

use std::net::{Ipv4Addr, SocketAddr};

use space_net::datapath::netns;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_from_the_uplink_namespace() {
    let name = format!("spt-uplink-{}", std::process::id());
    netns::create(&name).expect("create namespace");
    let _ns = Namespace(name.clone());
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

    let uplink = NetnsUplink::start(Some(&name), &[]).expect("start uplink");
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

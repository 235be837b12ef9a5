//! Connections to a server the agent runs in the sandbox, on a real VM, through the node
//! (`Node::guest_waking(..).connect_port(..)`): busybox `httpd` answers an HTTP request sent
//! over the connection (the half-close ends the request), while one bound to the guest's
//! loopback is private, and a port nothing listens on is `port_closed`.

use std::time::Duration;

use space_core::process::ProcessSpec;
use space_core::ErrorCode;
use space_node::GuestError;
use test_support::{shell, test_sandbox, wait_until, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_server_in_the_sandbox() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = test_sandbox(c).await;
    shell(
        c,
        &id,
        "mkdir -p www && echo 'hello from the sandbox' > www/index.html",
        false,
    )
    .await;
    c.start_process(&id, &ProcessSpec::shell("exec httpd -f -p 8000 -h www"))
        .await
        .expect("start httpd");
    let node = &ts.server().local_node();

    let mut conn = wait_until(Duration::from_secs(30), "httpd to listen", || async {
        let guest = node.guest_waking(&id).await.expect("guest");
        match guest.connect_port(8000).await {
            Ok(conn) => Some(conn),
            Err(GuestError::Remote { body, .. }) if body.code == ErrorCode::PortClosed => None,
            Err(e) => panic!("connect: {e}"),
        }
    })
    .await;
    conn.write_all(b"GET /index.html HTTP/1.0\r\nHost: sandbox\r\n\r\n")
        .await
        .expect("send");
    conn.shutdown().await.expect("half-close");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with("hello from the sandbox\n"), "{answer}");

    // A server the agent bound to the guest's loopback is private: never connected to.
    c.start_process(
        &id,
        &ProcessSpec::shell("exec httpd -f -p 127.0.0.1:8002 -h www"),
    )
    .await
    .expect("start httpd on loopback");
    shell(
        c,
        &id,
        "for i in $(seq 50); do wget -q -O - http://127.0.0.1:8002/index.html && exit 0; sleep 0.2; done; exit 1",
        true,
    )
    .await;
    let guest = node.guest_waking(&id).await.expect("guest");
    let err = guest
        .connect_port(8002)
        .await
        .expect_err("loopback is private");
    assert!(
        matches!(&err, GuestError::Remote { status: 502, body }
            if body.code == ErrorCode::PortClosed && body.message.contains("loopback only are private")),
        "{err:?}"
    );

    let guest = node.guest_waking(&id).await.expect("guest");
    let err = guest.connect_port(8001).await.expect_err("nothing on 8001");
    assert!(
        matches!(&err, GuestError::Remote { status: 502, body }
            if body.code == ErrorCode::PortClosed && body.message.contains("port is not open")),
        "{err:?}"
    );
    ts.stop().await;
}

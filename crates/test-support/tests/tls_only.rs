//! `space server --no-plaintext-listener`: a server other hosts reach serves TLS only, so
//! API keys and tokens never cross the network in clear (issue 12, item 8), and the data
//! directory it made is private.

use std::os::unix::fs::PermissionsExt;

use test_support::e2b::test_certificates;
use test_support::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_server_has_no_plaintext_listener() {
    let certs_dir = tempfile::tempdir().expect("temp dir");
    let certs = test_certificates(certs_dir.path());
    let plaintext_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("address").port()
    };
    let ts = TestServer::start_with(|cfg| {
        cfg.listen = std::net::SocketAddr::from(([127, 0, 0, 1], plaintext_port));
        cfg.plaintext = false;
        cfg.tls = Some(space_control::tls::TlsListen {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            cert: certs.chain.clone(),
            key: certs.key.clone(),
        });
    })
    .await;
    let server = ts.server();
    let tls = server.tls_addr().expect("the TLS listener");
    assert_eq!(server.addr(), tls, "clients are told the TLS address");
    assert_eq!(ts.url(), format!("https://{tls}"));
    // Nothing listens on the plaintext address.
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", plaintext_port)).await;
    assert!(refused.is_err(), "a plaintext listener is up");
    // TLS serves the API.
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&certs.ca).expect("CA"))
        .expect("CA certificate");
    let https = reqwest::Client::builder()
        .add_root_certificate(ca)
        .resolve("space.test", tls)
        .build()
        .expect("client");
    let url = format!("https://space.test:{}/v1/templates", tls.port());
    let r = https
        .get(&url)
        .bearer_auth(&ts.api_key)
        .send()
        .await
        .expect("GET over TLS");
    assert_eq!(r.status(), 200);
    // The data directory and its database are the server's only.
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(
        mode(&ts.data_dir) & 0o007,
        0,
        "others may not enter the data directory"
    );
    assert_eq!(mode(&ts.data_dir.join("control.db")), 0o600);
    assert_eq!(mode(&ts.data_dir.join("api-key")), 0o600);
    ts.stop().await;
}

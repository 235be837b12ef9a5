use test_support::TestServer;
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn smoke_server() {
    let ts = TestServer::start().await;
    std::fs::write("/tmp/smoke.env", format!("export SPACE_URL={}\nexport SPACE_API_KEY={}\n", ts.url(), ts.api_key)).unwrap();
    for _ in 0..600 {
        if std::path::Path::new("/tmp/smoke.stop").exists() { break; }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    ts.stop().await;
}

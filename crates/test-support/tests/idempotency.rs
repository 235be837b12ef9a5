//! `Idempotency-Key` end to end, with real sandboxes: a retried create makes one sandbox,
//! a retried delete answers like the first one, concurrent retries run once, keys are per
//! tenant, and stored responses survive a server restart. On SQLite, and on PostgreSQL when
//! `SPACE_TEST_POSTGRES_URL` is set (as `./scripts/test` does).

use reqwest::{Method, StatusCode};
use space_core::sandbox::SandboxInfo;
use space_core::{ErrorBody, ErrorCode};
use test_support::{TestServer, TEST_TEMPLATE};

const REPLAYED: &str = "idempotent-replayed";

struct Reply {
    status: StatusCode,
    replayed: bool,
    body: bytes::Bytes,
}

impl Reply {
    fn sandbox(&self) -> SandboxInfo {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not a SandboxInfo ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn error(&self) -> ErrorBody {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not an ErrorBody ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// One raw API call (the typed client sends no idempotency keys).
async fn call(
    http: &reqwest::Client,
    url: &str,
    api_key: &str,
    method: Method,
    path: &str,
    key: Option<&str>,
    body: Option<serde_json::Value>,
) -> Reply {
    let mut req = http
        .request(method, format!("{url}{path}"))
        .bearer_auth(api_key);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let replayed = resp
        .headers()
        .get(REPLAYED)
        .is_some_and(|v| v.as_bytes() == b"true");
    Reply {
        status,
        replayed,
        body: resp.bytes().await.expect("body"),
    }
}

fn create_body(label: &str) -> serde_json::Value {
    serde_json::json!({"template": TEST_TEMPLATE, "labels": {"try": label}})
}

async fn sandbox_count(ts: &TestServer) -> usize {
    ts.client
        .list_sandboxes(&[])
        .await
        .expect("list")
        .sandboxes
        .len()
}

/// Create twice, reuse the key wrongly, restart, delete twice.
async fn retried_create_and_delete(ts: TestServer) {
    let http = reqwest::Client::new();
    let (url, api_key) = (ts.url(), ts.api_key.clone());
    let post = |key: &'static str, label: &'static str| {
        let (http, url, api_key) = (http.clone(), url.clone(), api_key.clone());
        async move {
            call(
                &http,
                &url,
                &api_key,
                Method::POST,
                "/v1/sandboxes",
                Some(key),
                Some(create_body(label)),
            )
            .await
        }
    };

    let first = post("create-1", "a").await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert!(!first.replayed);
    let sandbox = first.sandbox();
    let second = post("create-1", "a").await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(second.replayed);
    assert_eq!(second.body, first.body, "replay is byte-identical");
    assert_eq!(sandbox_count(&ts).await, 1);

    // Same key, different request.
    let reused = post("create-1", "b").await;
    assert_eq!(reused.status.as_u16(), 422);
    assert_eq!(reused.error().code, ErrorCode::IdempotencyKeyReused);
    assert_eq!(sandbox_count(&ts).await, 1);

    // The stored response outlives a restart of the server.
    let (data_dir, config) = ts.stop_keep_vms().await;
    let ts = TestServer::start_on(data_dir, config).await;
    let url = ts.url();
    let after_restart = call(
        &http,
        &url,
        &api_key,
        Method::POST,
        "/v1/sandboxes",
        Some("create-1"),
        Some(create_body("a")),
    )
    .await;
    assert!(after_restart.replayed);
    assert_eq!(after_restart.body, first.body);
    assert_eq!(sandbox_count(&ts).await, 1);

    // A retried delete answers like the first one, not 404.
    let path = format!("/v1/sandboxes/{}", sandbox.id);
    let del = |key: Option<&'static str>| {
        let (http, url, api_key, path) = (http.clone(), url.clone(), api_key.clone(), path.clone());
        async move { call(&http, &url, &api_key, Method::DELETE, &path, key, None).await }
    };
    let d1 = del(Some("delete-1")).await;
    assert_eq!(d1.status, StatusCode::NO_CONTENT);
    assert!(!d1.replayed);
    let d2 = del(Some("delete-1")).await;
    assert_eq!(d2.status, StatusCode::NO_CONTENT);
    assert!(d2.replayed);
    assert_eq!(d2.body, d1.body);
    // Without the key, a second delete finds nothing.
    assert_eq!(del(None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(sandbox_count(&ts).await, 0);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retried_create_and_delete_run_once() {
    retried_create_and_delete(TestServer::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_with_one_key_make_one_sandbox() {
    let ts = TestServer::start().await;
    let http = reqwest::Client::new();
    let (url, api_key) = (ts.url(), ts.api_key.clone());
    let creates = (0..4).map(|_| {
        call(
            &http,
            &url,
            &api_key,
            Method::POST,
            "/v1/sandboxes",
            Some("together"),
            Some(create_body("c")),
        )
    });
    let replies = futures::future::join_all(creates).await;
    let created: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .collect();
    let conflicts = replies
        .iter()
        .filter(|r| r.status == StatusCode::CONFLICT)
        .inspect(|r| assert_eq!(r.error().code, ErrorCode::Conflict))
        .count();
    assert_eq!(
        created.len() + conflicts,
        replies.len(),
        "only 201 or 409: {:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(!created.is_empty());
    assert!(created.iter().all(|r| r.body == created[0].body));
    assert_eq!(created.iter().filter(|r| !r.replayed).count(), 1);
    assert_eq!(
        sandbox_count(&ts).await,
        1,
        "one sandbox, however many tries"
    );

    // Once done, the retry gets the stored response.
    let retry = call(
        &http,
        &url,
        &api_key,
        Method::POST,
        "/v1/sandboxes",
        Some("together"),
        Some(create_body("c")),
    )
    .await;
    assert!(retry.replayed);
    assert_eq!(retry.body, created[0].body);
    assert_eq!(sandbox_count(&ts).await, 1);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_are_scoped_to_the_tenant() {
    let ts = TestServer::start().await;
    let db = &ts.server().state().db;
    let other = db.create_tenant("other").await.expect("tenant");
    let other_key = db.create_api_key(&other.id).await.expect("key").plaintext.0;
    let http = reqwest::Client::new();
    let url = ts.url();
    let mine = call(
        &http,
        &url,
        &ts.api_key,
        Method::POST,
        "/v1/sandboxes",
        Some("same-key"),
        Some(create_body("t")),
    )
    .await;
    let theirs = call(
        &http,
        &url,
        &other_key,
        Method::POST,
        "/v1/sandboxes",
        Some("same-key"),
        Some(create_body("t")),
    )
    .await;
    assert_eq!(
        (mine.status, theirs.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(
        !mine.replayed && !theirs.replayed,
        "no replay across tenants"
    );
    assert_ne!(mine.sandbox().id, theirs.sandbox().id);
    // The other tenant's stored response does not leak through the key either.
    let mine_again = call(
        &http,
        &url,
        &ts.api_key,
        Method::POST,
        "/v1/sandboxes",
        Some("same-key"),
        Some(create_body("t")),
    )
    .await;
    assert!(mine_again.replayed);
    assert_eq!(mine_again.body, mine.body);
    assert_eq!(sandbox_count(&ts).await, 1);
    let other_client = ts.client_with_key(Some(&other_key));
    let listed = other_client.list_sandboxes(&[]).await.expect("list");
    assert_eq!(listed.sandboxes.len(), 1);
    other_client
        .delete_sandbox(&theirs.sandbox().id)
        .await
        .expect("delete theirs");
    ts.stop().await;
}

/// A fresh PostgreSQL database (via `psql`) for one test, dropped afterwards.
struct PgDatabase {
    admin_url: String,
    name: String,
}

impl PgDatabase {
    fn create(admin_url: &str) -> PgDatabase {
        let name = format!(
            "space_idem_{}",
            space_core::SandboxId::generate()
                .as_str()
                .trim_start_matches("sbx-")
        );
        psql(admin_url, &format!("CREATE DATABASE {name}"));
        PgDatabase {
            admin_url: admin_url.to_owned(),
            name,
        }
    }

    /// The admin URL with the database name replaced (query string kept).
    fn url(&self) -> String {
        let (base, query) = self
            .admin_url
            .split_once('?')
            .map_or((self.admin_url.as_str(), None), |(b, q)| (b, Some(q)));
        let scheme_end = base.find("://").expect("URL scheme") + 3;
        let host_end = base[scheme_end..]
            .find('/')
            .map_or(base.len(), |i| scheme_end + i);
        let mut out = format!("{}/{}", &base[..host_end], self.name);
        if let Some(q) = query {
            out.push('?');
            out.push_str(q);
        }
        out
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        psql(
            &self.admin_url,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

fn psql(url: &str, sql: &str) {
    let out = std::process::Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retried_create_and_delete_run_once_on_postgres() {
    let Some(admin_url) = std::env::var("SPACE_TEST_POSTGRES_URL")
        .ok()
        .filter(|s| !s.is_empty())
    else {
        eprintln!("SPACE_TEST_POSTGRES_URL is not set: skipping the PostgreSQL run");
        return;
    };
    let pg = PgDatabase::create(&admin_url);
    let url = pg.url();
    let ts = TestServer::start_with(|c| c.database_url = Some(url)).await;
    retried_create_and_delete(ts).await;
    drop(pg);
}

//! The action log through the real API and the real CLI (issue 12, item 6): control-plane
//! actions are recorded with the acting key's id, target, outcome and time, per tenant; the
//! operator's key revocations too; `space audit verify` passes on the untouched chain and
//! fails (exit 1, naming the record) once a row is edited or removed in the database.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::json;
use space_control::api::audit::AuditLog;
use test_support::node_manager::space_binary;
use test_support::TestServer;

/// `space audit verify` against `ts` with `key`: exit code and output.
fn verify(ts: &TestServer, key: &str, extra: &[&str]) -> (i32, String) {
    let out = Command::new(space_binary())
        .args(["--url", &ts.url(), "--api-key", key, "audit", "verify"])
        .args(extra)
        .output()
        .expect("run space audit verify");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// `GET /v1/audit{query}` with `key`.
async fn audit_log(http: &reqwest::Client, ts: &TestServer, key: &str, query: &str) -> AuditLog {
    http.get(format!("{}/v1/audit{query}", ts.url()))
        .bearer_auth(key)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json")
}

async fn sql(ts: &TestServer, statement: &str) {
    use sqlx::Connection;
    let url = space_control::db::default_sqlite_url(&ts.data_dir);
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("open the database");
    sqlx::query(statement)
        .execute(&mut conn)
        .await
        .expect("tamper");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn actions_are_recorded_and_tampering_is_caught() {
    let ts = TestServer::start().await;
    let http = reqwest::Client::new();
    let db = &ts.server().state().db;
    let (tenant, key_id) = db
        .authenticate_key(&ts.api_key)
        .await
        .expect("db")
        .expect("key");
    let call = |method: reqwest::Method, path: &str, body: Option<serde_json::Value>| {
        let rb = http
            .request(method, format!("{}{path}", ts.url()))
            .bearer_auth(&ts.api_key);
        let rb = match body {
            Some(b) => rb.json(&b),
            None => rb,
        };
        async move { rb.send().await.expect("send").status() }
    };
    let credential = json!({
        "name": "github",
        "rule": {"hosts": ["api.github.com"], "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"}},
        "value": "sk-audit-test-value-1234",
    });
    assert_eq!(
        call(reqwest::Method::POST, "/v1/credentials", Some(credential)).await,
        StatusCode::CREATED
    );
    assert_eq!(
        call(
            reqwest::Method::DELETE,
            "/v1/sandboxes/sbx-k3v9q0x2m1c8r7t4z5a6",
            None
        )
        .await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(
            reqwest::Method::PUT,
            "/v1/egress-policy",
            Some(json!({"mode": "none", "rules": []}))
        )
        .await,
        StatusCode::OK
    );
    assert_eq!(
        call(reqwest::Method::GET, "/v1/credentials", None).await,
        StatusCode::OK
    );
    let second = db.create_api_key(&tenant.id).await.expect("key");
    db.revoke_api_key(&second.info.id).await.expect("revoke");
    // Another tenant acts too; its records are its own.
    let other = db.create_tenant("audit-other").await.expect("tenant");
    let other_key = db.create_api_key(&other.id).await.expect("key").plaintext.0;
    let r = http
        .put(format!("{}/v1/egress-policy", ts.url()))
        .bearer_auth(&other_key)
        .json(&json!({"mode": "none", "rules": []}))
        .send()
        .await
        .expect("send");
    assert!(r.status().is_success());

    let log = audit_log(&http, &ts, &ts.api_key, "").await;
    let seen: Vec<(&str, &str, &str, Option<&str>)> = log
        .records
        .iter()
        .map(|r| {
            (
                r.action.as_str(),
                r.target.as_str(),
                r.outcome.as_str(),
                r.api_key_id.as_deref(),
            )
        })
        .collect();
    let key = Some(key_id.as_str());
    let expected_tail = vec![
        ("POST /v1/credentials", "/v1/credentials", "ok", key),
        (
            "DELETE /v1/sandboxes/{id}",
            "/v1/sandboxes/sbx-k3v9q0x2m1c8r7t4z5a6",
            "not_found",
            key,
        ),
        ("PUT /v1/egress-policy", "/v1/egress-policy", "ok", key),
        ("api_key.create", second.info.id.as_str(), "ok", None),
        ("api_key.revoke", second.info.id.as_str(), "ok", None),
    ];
    assert!(seen.ends_with(&expected_tail), "{seen:#?}");
    assert!(log
        .records
        .iter()
        .all(|r| r.action != "GET /v1/credentials"));
    assert!(log.records.iter().all(|r| r.ts_ms > 0));
    assert_eq!(log.tenant, tenant.id.to_string());
    let filtered = audit_log(&http, &ts, &ts.api_key, "?outcome=not_found").await;
    assert_eq!(filtered.records.len(), 1);
    let theirs = audit_log(&http, &ts, &other_key, "").await;
    assert!(theirs
        .records
        .iter()
        .all(|r| !r.target.contains("credentials")));
    assert!(theirs
        .records
        .iter()
        .any(|r| r.action == "PUT /v1/egress-policy"));
    let r = http
        .get(format!("{}/v1/audit?limit=0", ts.url()))
        .bearer_auth(&ts.api_key)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // The untouched chain verifies; its head, kept, is checked later.
    let (code, out) = verify(&ts, &ts.api_key, &[]);
    assert_eq!(code, 0, "{out}");
    let head = out
        .lines()
        .find_map(|l| l.strip_prefix("head: "))
        .expect("a head")
        .to_owned();
    let (code, out) = verify(&ts, &ts.api_key, &["--head", &head]);
    assert_eq!(code, 0, "{out}");

    // An intruder with the database turns the failure into a success…
    let seq = log
        .records
        .iter()
        .find(|r| r.outcome == "not_found")
        .expect("the failure")
        .seq;
    sql(&ts, &format!("UPDATE audit_log SET outcome = 'ok', status = 204 WHERE tenant_id = '{}' AND seq = {seq}", tenant.id)).await;
    let (code, out) = verify(&ts, &ts.api_key, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("record {seq} was altered")), "{out}");
    // …or removes it: a gap.
    sql(
        &ts,
        &format!(
            "DELETE FROM audit_log WHERE tenant_id = '{}' AND seq = {seq}",
            tenant.id
        ),
    )
    .await;
    let (code, out) = verify(&ts, &ts.api_key, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("missing"), "{out}");
    // Cutting the chain back after the head was kept is caught with --head.
    let head_seq: i64 = head.split(':').next().unwrap().parse().unwrap();
    sql(
        &ts,
        &format!(
            "DELETE FROM audit_log WHERE tenant_id = '{}' AND seq >= {seq}",
            tenant.id
        ),
    )
    .await;
    let (code, out) = verify(&ts, &ts.api_key, &[]);
    assert_eq!(code, 0, "what is left is a chain: {out}");
    let (code, out) = verify(&ts, &ts.api_key, &["--head", &head]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("record {head_seq} is missing")),
        "{out}"
    );
    ts.stop().await;
}

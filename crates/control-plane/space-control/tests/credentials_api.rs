//! Credentials, egress policies and the audit log through the HTTP API, without VMs: values
//! are write-only and encrypted at rest, tenants see only their own, bad input is a clear
//! `400`, and a tenant's default egress policy round-trips.

mod common;

use common::{error_of, TestServer};
use reqwest::Method;
use serde_json::json;
use space_control::api::credentials::{AuditList, CredentialInfo, CredentialList};
use space_core::egress::{EgressMode, EgressPolicy};
use space_core::ErrorCode;

const VALUE: &str = "sk-test-9f8e7d6c5b4a39281706";

/// `method path` with `body` as JSON, as the bootstrap tenant.
async fn call(
    ts: &TestServer,
    method: Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> reqwest::Response {
    let rb = ts
        .http
        .request(method, format!("{}{path}", ts.url))
        .bearer_auth(&ts.key);
    match body {
        Some(b) => rb.json(b),
        None => rb,
    }
    .send()
    .await
    .unwrap()
}

fn credential(name: &str) -> serde_json::Value {
    json!({
        "name": name,
        "rule": {
            "hosts": ["api.example.com"],
            "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"}
        },
        "value": VALUE,
    })
}

/// Files under `dir` holding `needle` (grep: binary files included).
fn files_containing(dir: &std::path::Path, needle: &str) -> String {
    let out = std::process::Command::new("grep")
        .args(["-rlaF", needle])
        .arg(dir)
        .output()
        .expect("grep");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn credential_values_are_write_only_and_encrypted_at_rest() {
    let ts = TestServer::start().await;
    let resp = ts
        .http
        .post(format!("{}/v1/credentials", ts.url))
        .bearer_auth(&ts.key)
        .json(&credential("github"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let text = resp.text().await.unwrap();
    assert!(!text.contains(VALUE), "the value is never echoed: {text}");
    let created: CredentialInfo = serde_json::from_str(&text).unwrap();
    assert!(created.id.starts_with("crd-"));

    for path in [
        "/v1/credentials".to_owned(),
        format!("/v1/credentials/{}", created.id),
    ] {
        let body = ts.get(&path).send().await.unwrap().text().await.unwrap();
        assert!(
            body.contains(&created.id) && !body.contains(VALUE),
            "{body}"
        );
    }
    // Encrypted at rest: no file of the data directory holds the value.
    assert_eq!(files_containing(&ts.dir.0, VALUE), "");

    // Replace keeps the id and creation time; delete removes it.
    let mut next = credential("github");
    next["value"] = json!("sk-rotated-value-0000000000");
    let replaced: CredentialInfo = call(
        &ts,
        Method::PUT,
        &format!("/v1/credentials/{}", created.id),
        Some(&next),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        (replaced.id.as_str(), replaced.created_at_ms),
        (created.id.as_str(), created.created_at_ms)
    );
    let del = call(
        &ts,
        Method::DELETE,
        &format!("/v1/credentials/{}", created.id),
        None::<&serde_json::Value>,
    )
    .await;
    assert_eq!(del.status(), 204);
    let (status, body) = error_of(
        ts.get(&format!("/v1/credentials/{}", created.id))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, body.code), (404, ErrorCode::NotFound));
    ts.stop().await;
}

#[tokio::test]
async fn tenants_see_only_their_own_credentials_and_audit() {
    let ts = TestServer::start().await;
    let other = ts.db().create_tenant("other").await.unwrap();
    let other_key = ts.db().create_api_key(&other.id).await.unwrap().plaintext.0;
    let mine: CredentialInfo = ts
        .http
        .post(format!("{}/v1/credentials", ts.url))
        .bearer_auth(&ts.key)
        .json(&credential("github"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let as_other = |method: reqwest::Method, path: String| {
        ts.http
            .request(method, format!("{}{path}", ts.url))
            .bearer_auth(&other_key)
    };
    let list: CredentialList = as_other(reqwest::Method::GET, "/v1/credentials".into())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(list.credentials.is_empty());
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let (status, _) = error_of(
            as_other(method.clone(), format!("/v1/credentials/{}", mine.id))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 404, "{method}");
    }
    let (status, _) = error_of(
        as_other(reqwest::Method::PUT, format!("/v1/credentials/{}", mine.id))
            .json(&credential("github"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    // The same name in another tenant is another credential; in the same scope it is taken.
    let theirs = as_other(reqwest::Method::POST, "/v1/credentials".into())
        .json(&credential("github"))
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 201);
    let (status, body) = error_of(
        ts.http
            .post(format!("{}/v1/credentials", ts.url))
            .bearer_auth(&ts.key)
            .json(&credential("github"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, body.code), (409, ErrorCode::AlreadyExists));
    // A sandbox scope must name one of the caller's sandboxes.
    let mut scoped = credential("one");
    scoped["scope"] = json!({"kind": "sandbox", "sandbox": space_core::SandboxId::generate()});
    let (status, _) =
        error_of(call(&ts, Method::POST, "/v1/credentials", Some(&scoped)).await).await;
    assert_eq!(status, 404);
    let audit: AuditList = ts
        .get("/v1/audit/credentials?limit=5")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(audit.events.is_empty());
    ts.stop().await;
}

#[tokio::test]
async fn bad_credentials_and_policies_are_invalid_requests() {
    let ts = TestServer::start().await;
    let post = |body: serde_json::Value| {
        ts.http
            .post(format!("{}/v1/credentials", ts.url))
            .bearer_auth(&ts.key)
            .json(&body)
    };
    let mut cases = Vec::new();
    let mut c = credential("x");
    c["value"] = json!("line\r\nX-Injected: 1");
    cases.push(("header-unsafe value", c));
    let mut c = credential("x");
    c["rule"]["hosts"] = json!(["bad host"]);
    cases.push(("bad host pattern", c));
    let mut c = credential("x");
    c["rule"]["injection"]["template"] = json!("no placeholder");
    cases.push(("template without {}", c));
    let mut c = credential("x");
    c["rule"]["injection"]["name"] = json!("Host");
    cases.push(("reserved header", c));
    cases.push(("bad name", credential("1 two")));
    let mut c = credential("x");
    c["scope"] = json!({"kind": "project", "project": "Bad/Project"});
    cases.push(("bad project", c));
    let mut c = credential("x");
    c["shiny"] = json!(true);
    cases.push(("unknown field", c));
    let mut c = credential("x");
    c.as_object_mut().unwrap().remove("value");
    cases.push(("no value", c));
    for (what, body) in cases {
        let (status, err) = error_of(post(body).send().await.unwrap()).await;
        assert_eq!(
            (status, err.code),
            (400, ErrorCode::InvalidRequest),
            "{what}: {}",
            err.message
        );
        assert!(
            !err.message.contains("X-Injected"),
            "{what}: the value is not echoed"
        );
    }
    let (status, _) = error_of(ts.get("/v1/credentials/not-an-id").send().await.unwrap()).await;
    assert_eq!(status, 400);
    let (status, _) = error_of(
        ts.get("/v1/audit/credentials?limit=x")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);

    for (what, policy) in [
        ("unknown mode", json!({"mode": "maybe"})),
        (
            "empty ports",
            json!({"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "a.com"}, "ports": []}]}),
        ),
        (
            "bad domain",
            json!({"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "a b.com"}}]}),
        ),
        (
            "host bits",
            json!({"mode": "allowlist", "rules": [{"action": "allow", "destination": {"cidr": "10.0.0.1/8"}}]}),
        ),
    ] {
        let (status, err) =
            error_of(call(&ts, Method::PUT, "/v1/egress-policy", Some(&policy)).await).await;
        assert_eq!(
            (status, err.code),
            (400, ErrorCode::InvalidRequest),
            "{what}"
        );
    }
    let (status, _) = error_of(
        ts.get(&format!(
            "/v1/sandboxes/{}/egress-policy",
            space_core::SandboxId::generate()
        ))
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    ts.stop().await;
}

#[tokio::test]
async fn the_tenant_default_egress_policy_round_trips() {
    let ts = TestServer::start().await;
    let (status, _) = error_of(ts.get("/v1/egress-policy").send().await.unwrap()).await;
    assert_eq!(status, 404, "no default yet");
    let policy = json!({"mode": "allowlist", "rules": [
        {"action": "allow", "destination": {"domain": "*.github.com"}, "ports": [{"start": 443, "end": 443}]}
    ]});
    let put = call(&ts, Method::PUT, "/v1/egress-policy", Some(&policy)).await;
    assert_eq!(put.status(), 200);
    let got: EgressPolicy = ts
        .get("/v1/egress-policy")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got.mode, EgressMode::Allowlist);
    assert_eq!(
        serde_json::to_value(&got).unwrap()["rules"][0]["destination"]["domain"],
        "*.github.com"
    );
    let del = call(
        &ts,
        Method::DELETE,
        "/v1/egress-policy",
        None::<&serde_json::Value>,
    )
    .await;
    assert_eq!(del.status(), 204);
    let (status, _) = error_of(ts.get("/v1/egress-policy").send().await.unwrap()).await;
    assert_eq!(status, 404);
    ts.stop().await;
}

//! The E2B surface's sandbox tokens can be revoked and expire (issue 12, item 4), tried
//! through the real API on a real sandbox: an envd access token and a traffic token stop
//! working at once when the sandbox's tokens are revoked (`POST /v1/sandboxes/{id}/revoke-tokens`)
//! or when an API key of its tenant is revoked, and when their validity ends; connecting (or
//! getting) the sandbox hands them out again. A create sent with an `Idempotency-Key` is
//! stored without its tokens, and its replay hands out the current ones (item 8).

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use space_e2b::{E2bApi, E2bConfig};
use test_support::e2b::TEST_DOMAIN;
use test_support::{TestServer, TEST_TEMPLATE};

/// Short, so the test can watch tokens expire.
const TOKEN_TTL_SECS: u64 = 3;

struct Env {
    ts: TestServer,
    http: reqwest::Client,
}

/// What create, connect and get hand out.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tokens {
    envd: String,
    traffic: String,
}

impl Env {
    async fn start() -> Env {
        let ts = TestServer::start_with(|cfg| {
            cfg.surface = Some(Arc::new(E2bApi::new(E2bConfig {
                domain: TEST_DOMAIN.to_owned(),
                token_ttl_secs: TOKEN_TTL_SECS,
            })));
        })
        .await;
        Env {
            ts,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.ts.url())
    }

    /// An E2B control call with `key`.
    async fn e2b(&self, method: reqwest::Method, path: &str, key: &str, body: Value) -> Value {
        let r = self
            .http
            .request(method, self.url(path))
            .header("X-API-Key", key)
            .json(&body)
            .send()
            .await
            .expect("send");
        let status = r.status();
        let body: Value = r.json().await.expect("json");
        assert!(status.is_success(), "{path}: {status} {body}");
        body
    }

    /// `process.Process/List` with `token`: the status.
    async fn envd(&self, id: &str, token: &str) -> StatusCode {
        self.http
            .post(self.url("/process.Process/List"))
            .header("E2b-Sandbox-Id", id)
            .header("X-Access-Token", token)
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .body("{}")
            .send()
            .await
            .expect("send")
            .status()
    }

    /// A host route to port 8000 with `traffic` as its token: the status (502: it got
    /// past the check to the guest, where nothing listens).
    async fn port(&self, id: &str, traffic: &str) -> StatusCode {
        let port = self.ts.server().addr().port();
        self.http
            .get(self.url("/"))
            .header("Host", format!("8000-{id}.{TEST_DOMAIN}:{port}"))
            .header("e2b-traffic-access-token", traffic)
            .send()
            .await
            .expect("send")
            .status()
    }

    /// `GET /sandboxes/{id}`'s token (it renews the validity).
    async fn get(&self, id: &str, key: &str) -> String {
        let info = self
            .e2b(
                reqwest::Method::GET,
                &format!("/sandboxes/{id}"),
                key,
                Value::Null,
            )
            .await;
        info["envdAccessToken"].as_str().expect("token").to_owned()
    }

    async fn connect(&self, id: &str, key: &str) -> Tokens {
        let body = serde_json::json!({ "timeout": 300 });
        let out = self
            .e2b(
                reqwest::Method::POST,
                &format!("/sandboxes/{id}/connect"),
                key,
                body,
            )
            .await;
        tokens(&out)
    }
}

fn tokens(v: &Value) -> Tokens {
    Tokens {
        envd: v["envdAccessToken"]
            .as_str()
            .expect("envd token")
            .to_owned(),
        traffic: v["trafficAccessToken"]
            .as_str()
            .expect("traffic token")
            .to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoked_and_expired_tokens_are_refused_at_once() {
    let env = Env::start().await;
    let db = &env.ts.server().state().db;
    let tenant = db
        .authenticate(&env.ts.api_key)
        .await
        .expect("db")
        .expect("tenant");
    let second = db.create_api_key(&tenant.id).await.expect("second key");
    let second_key = second.plaintext.0.clone();
    let created = env
        .e2b(
            reqwest::Method::POST,
            "/sandboxes",
            &second_key,
            serde_json::json!({ "templateID": TEST_TEMPLATE, "timeout": 300 }),
        )
        .await;
    let id = created["sandboxID"].as_str().expect("id").to_owned();
    let first = tokens(&created);
    assert_eq!(env.envd(&id, &first.envd).await, StatusCode::OK);
    assert_eq!(env.port(&id, &first.traffic).await, StatusCode::BAD_GATEWAY);

    // Validity ends TOKEN_TTL_SECS after the tokens were last handed out.
    tokio::time::sleep(Duration::from_secs(TOKEN_TTL_SECS + 1)).await;
    assert_eq!(env.envd(&id, &first.envd).await, StatusCode::UNAUTHORIZED);
    assert_eq!(env.port(&id, &first.traffic).await, StatusCode::FORBIDDEN);
    // Handing them out again renews them; they stay the same until a revocation.
    assert_eq!(env.get(&id, &env.ts.api_key).await, first.envd);
    assert_eq!(env.envd(&id, &first.envd).await, StatusCode::OK);

    // Revoking the key the sandbox was made with revokes every token of its tenant's
    // sandboxes; the other key connects and gets new ones.
    db.revoke_api_key(&second.info.id)
        .await
        .expect("revoke key");
    assert_eq!(env.envd(&id, &first.envd).await, StatusCode::UNAUTHORIZED);
    assert_eq!(env.port(&id, &first.traffic).await, StatusCode::FORBIDDEN);
    let second_tokens = env.connect(&id, &env.ts.api_key).await;
    assert_ne!(second_tokens, first);
    assert_eq!(env.envd(&id, &second_tokens.envd).await, StatusCode::OK);
    assert_eq!(
        env.port(&id, &second_tokens.traffic).await,
        StatusCode::BAD_GATEWAY
    );

    // The sandbox's own revocation.
    let r = env
        .http
        .post(env.url(&format!("/v1/sandboxes/{id}/revoke-tokens")))
        .bearer_auth(&env.ts.api_key)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        env.envd(&id, &second_tokens.envd).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        env.port(&id, &second_tokens.traffic).await,
        StatusCode::FORBIDDEN
    );
    let third = env.connect(&id, &env.ts.api_key).await;
    assert!(third != second_tokens && third != first);
    assert_eq!(env.envd(&id, &third.envd).await, StatusCode::OK);
    // Another tenant cannot revoke it (it does not see it).
    let other = env.ts.new_tenant_client("other-tenant").await;
    let err = other
        .revoke_tokens(&id.parse::<space_core::SandboxId>().expect("id"))
        .await
        .expect_err("not theirs");
    assert_eq!(err.status(), Some(404), "{err:?}");
    assert_eq!(env.envd(&id, &third.envd).await, StatusCode::OK);

    let _ = env
        .ts
        .client
        .delete_sandbox(&id.parse::<space_core::SandboxId>().expect("id"))
        .await;
    env.ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotent_responses_are_stored_without_tokens() {
    let env = Env::start().await;
    let db = &env.ts.server().state().db;
    let tenant = db
        .authenticate(&env.ts.api_key)
        .await
        .expect("db")
        .expect("tenant");
    let create = || async {
        let r = env
            .http
            .post(env.url("/sandboxes"))
            .header("X-API-Key", &env.ts.api_key)
            .header("Idempotency-Key", "create-once")
            .json(&serde_json::json!({ "templateID": TEST_TEMPLATE, "timeout": 300 }))
            .send()
            .await
            .expect("send");
        assert!(r.status().is_success(), "{}", r.status());
        let replayed = r.headers().get("idempotent-replayed").is_some();
        (r.json::<Value>().await.expect("json"), replayed)
    };
    let (first, replayed) = create().await;
    assert!(!replayed);
    let id = first["sandboxID"].as_str().expect("id").to_owned();
    let first_tokens = tokens(&first);

    let row = db
        .idempotency_key(&tenant.id, "create-once")
        .await
        .expect("db")
        .expect("stored");
    let stored = String::from_utf8(row.response.expect("done").body).expect("utf-8");
    assert!(stored.contains(&id), "{stored}");
    for token in [&first_tokens.envd, &first_tokens.traffic] {
        assert!(
            !stored.contains(token.as_str()),
            "a token was stored: {stored}"
        );
    }

    // The replay is the same sandbox, with the tokens it has now.
    let (again, replayed) = create().await;
    assert!(replayed);
    assert_eq!(again["sandboxID"], first["sandboxID"]);
    assert_eq!(tokens(&again), first_tokens);
    let r = env
        .http
        .post(env.url(&format!("/v1/sandboxes/{id}/revoke-tokens")))
        .bearer_auth(&env.ts.api_key)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (after, replayed) = create().await;
    assert!(replayed);
    let after_tokens = tokens(&after);
    assert_ne!(after_tokens.envd, first_tokens.envd);
    assert_ne!(after_tokens.traffic, first_tokens.traffic);
    assert_eq!(
        env.envd(&id, &first_tokens.envd).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(env.envd(&id, &after_tokens.envd).await, StatusCode::OK);

    let _ = env
        .ts
        .client
        .delete_sandbox(&id.parse::<space_core::SandboxId>().expect("id"))
        .await;
    env.ts.stop().await;
}

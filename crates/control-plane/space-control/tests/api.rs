//! The HTTP API without VMs: authentication, tenant isolation, validation, error format,
//! body limits and the OpenAPI document. Runs a real server on 127.0.0.1:<free port>.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{error_of, TestServer};
use reqwest::Method;
use space_control::db::{DesiredState, SandboxRow, SandboxSpec};
use space_core::{ErrorCode, Resources, SandboxId};

/// The API contract: every route, as `METHOD path`.
const ROUTES: &[&str] = &[
    "GET /healthz",
    "GET /openapi.json",
    "GET /v1/templates",
    "POST /v1/templates",
    "GET /v1/templates/{name}",
    "DELETE /v1/templates/{name}",
    "GET /v1/templates/builds/{id}",
    "PUT /v1/templates/files/{sha256}",
    "GET /v1/templates/files/{sha256}",
    "GET /v1/template-cache",
    "POST /v1/template-cache/prune",
    "POST /v1/sandboxes",
    "GET /v1/sandboxes",
    "GET /v1/sandboxes/{id}",
    "DELETE /v1/sandboxes/{id}",
    "PUT /v1/sandboxes/{id}/timeout",
    "GET /v1/sandboxes/{id}/console",
    "GET /v1/sandboxes/{id}/metrics",
    "POST /v1/sandboxes/{id}/pause",
    "POST /v1/sandboxes/{id}/resume",
    "POST /v1/sandboxes/{id}/suspend",
    "POST /v1/sandboxes/{id}/stop",
    "POST /v1/sandboxes/{id}/start",
    "POST /v1/sandboxes/{id}/revoke-tokens",
    "POST /v1/sandboxes/{id}/rollback",
    "POST /v1/sandboxes/{id}/fork",
    "GET /v1/sandboxes/{id}/events",
    "GET /v1/sandboxes/{id}/snapshots",
    "POST /v1/sandboxes/{id}/snapshots",
    "DELETE /v1/sandboxes/{id}/snapshots/{snapshot_id}",
    "GET /v1/sandboxes/{id}/snapshots/diff",
    "GET /v1/snapshots",
    "GET /v1/snapshots/{snapshot_id}",
    "DELETE /v1/snapshots/{snapshot_id}",
    "GET /v1/nodes",
    "POST /v1/nodes/join-tokens",
    "POST /v1/nodes/{name}/cordon",
    "POST /v1/nodes/{name}/drain",
    "POST /v1/nodes/{name}/uncordon",
    "DELETE /v1/nodes/{name}",
    "GET /v1/pool",
    "POST /v1/sandboxes/{id}/processes",
    "GET /v1/sandboxes/{id}/processes",
    "GET /v1/sandboxes/{id}/processes/{pid}",
    "GET /v1/sandboxes/{id}/processes/{pid}/output",
    "POST /v1/sandboxes/{id}/processes/{pid}/stdin",
    "POST /v1/sandboxes/{id}/processes/{pid}/signal",
    "POST /v1/sandboxes/{id}/processes/{pid}/resize",
    "POST /v1/sandboxes/{id}/exec",
    "GET /v1/sandboxes/{id}/files",
    "PUT /v1/sandboxes/{id}/files",
    "DELETE /v1/sandboxes/{id}/files",
    "GET /v1/sandboxes/{id}/files/stat",
    "GET /v1/sandboxes/{id}/files/list",
    "POST /v1/sandboxes/{id}/files/mkdir",
    "POST /v1/sandboxes/{id}/files/rename",
    "GET /v1/sandboxes/{id}/files/watch",
    "GET /v1/sandboxes/{id}/egress-policy",
    "PUT /v1/sandboxes/{id}/egress-policy",
    "GET /v1/egress-policy",
    "PUT /v1/egress-policy",
    "DELETE /v1/egress-policy",
    "POST /v1/credentials",
    "GET /v1/credentials",
    "GET /v1/credentials/{id}",
    "PUT /v1/credentials/{id}",
    "DELETE /v1/credentials/{id}",
    "GET /v1/customer-key",
    "PUT /v1/customer-key",
    "DELETE /v1/customer-key",
    "GET /v1/customer-key/services",
    "POST /v1/customer-key/check",
    "POST /v1/customer-key/rotate",
    "GET /v1/audit/credentials",
    "GET /v1/audit",
    "GET /v1/quota",
    "GET /v1/tenants/{tenant}/quota",
    "PUT /v1/tenants/{tenant}/quota",
    "DELETE /v1/tenants/{tenant}/quota",
];

fn documented_routes(doc: &serde_json::Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if [
                "get", "put", "post", "delete", "patch", "head", "options", "trace",
            ]
            .contains(&method.as_str())
            {
                out.insert(format!("{} {}", method.to_uppercase(), path));
            }
        }
    }
    out
}

/// A row for a sandbox that the node does not have (enough for auth and scoping tests).
async fn insert_row(ts: &TestServer, tenant: &space_core::TenantId) -> SandboxId {
    let id = SandboxId::generate();
    let row = SandboxRow {
        id: id.clone(),
        tenant_id: tenant.clone(),
        node: "local".into(),
        template: "base".into(),
        template_digest: "d".into(),
        spec: SandboxSpec {
            resources: Resources::default(),
            env_keys: vec![],
            forked_from: None,
            from_snapshot: None,
            public_ports: Default::default(),
            on_node_loss: Default::default(),
            checkpoint_interval_secs: None,
            snapshot_storage: Default::default(),
        },
        labels: BTreeMap::from([("team".to_owned(), "a".to_owned())]),
        desired_state: DesiredState::Running,
        created_at_ms: space_control::db::now_ms(),
        expires_at_ms: space_control::db::now_ms() + 3_600_000,
        timeout_secs: 3600,
        on_timeout: Default::default(),
        auto_resume: false,
        timed_out_at_ms: None,
        deleted_at_ms: None,
        create_latency_ms: Some(1),
        creating_replica: None,
        suspended_snapshot: None,
        stored_checkpoint: None,
        stored_checkpoint_at_ms: None,
        tokens: Default::default(),
    };
    ts.db().insert_sandbox(&row).await.unwrap();
    id
}

#[tokio::test]
async fn openapi_document_matches_the_router() {
    let ts = TestServer::start().await;
    let resp = ts
        .http
        .get(format!("{}/openapi.json", ts.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let doc: serde_json::Value = resp.json().await.unwrap();
    let documented = documented_routes(&doc);
    let expected: BTreeSet<String> = ROUTES.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        documented, expected,
        "OpenAPI paths differ from the API contract"
    );
    assert!(doc["components"]["securitySchemes"]["api_key"].is_object());
    for schema in [
        "SandboxInfo",
        "CreateSandboxRequest",
        "ProcessSpec",
        "OutputEvent",
        "FileStat",
        "ErrorBody",
        "TemplateInfo",
        "SnapshotInfo",
        "SnapshotTaken",
        "ForkRequest",
        "LifecycleEntry",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "schema {schema} missing"
        );
    }

    // Every documented route is served by a handler (not the fallback), and every other
    // method on a documented path is refused by the router: the router has no route the
    // document lacks on these paths.
    let id = SandboxId::generate();
    let all_methods = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
    ];
    let paths: BTreeSet<&str> = ROUTES
        .iter()
        .map(|r| r.split_once(' ').unwrap().1)
        .collect();
    for path in paths {
        let concrete = path
            .replace("{id}", id.as_str())
            .replace("{pid}", "1")
            .replace("{snapshot_id}", space_core::SnapshotId::generate().as_str());
        for method in &all_methods {
            let route = format!("{method} {path}");
            let resp = ts.req(method.clone(), &concrete).send().await.unwrap();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            if expected.contains(&route) {
                assert_ne!(status, 405, "{route} is documented but not routed");
                assert!(
                    !text.contains("no route for"),
                    "{route} is documented but not routed: {text}"
                );
            } else {
                assert_eq!(
                    status, 405,
                    "{route} is routed but not documented: {status} {text}"
                );
                let body: space_core::ErrorBody = serde_json::from_str(&text).unwrap();
                assert_eq!(body.code, ErrorCode::InvalidRequest);
            }
        }
    }
    // Paths outside the document are not routed.
    for path in ["/", "/v1", "/v1/sandboxes/x/unknown", "/v2/sandboxes"] {
        let (status, body) = error_of(ts.get(path).send().await.unwrap()).await;
        assert_eq!((status, body.code), (404, ErrorCode::NotFound), "{path}");
        assert!(body.message.contains("no route"), "{path}");
    }
    ts.stop().await;
}

#[tokio::test]
async fn health_needs_no_key() {
    let ts = TestServer::start().await;
    let resp = ts
        .http
        .get(format!("{}/healthz", ts.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "ok");
    ts.stop().await;
}

#[tokio::test]
async fn requests_without_a_valid_key_are_refused() {
    let ts = TestServer::start().await;
    let url = format!("{}/v1/sandboxes", ts.url);
    let (status, body) = error_of(ts.http.get(&url).send().await.unwrap()).await;
    assert_eq!((status, body.code), (401, ErrorCode::Unauthenticated));
    for auth in [
        "Bearer nope",
        "Basic abc",
        &format!("Bearer {}", space_control::keys::generate().plaintext),
        "Bearer ",
    ] {
        let (status, body) = error_of(
            ts.http
                .get(&url)
                .header("authorization", auth)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, body.code),
            (401, ErrorCode::Unauthenticated),
            "{auth:?}"
        );
        assert!(
            !body.message.contains("space_"),
            "the key must not be echoed"
        );
    }
    // Authentication comes before validation: a malformed id without a key is still 401.
    let (status, _) = error_of(
        ts.http
            .get(format!("{url}/not-an-id"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401);
    // A revoked key stops working.
    let tenant = ts.db().tenant_by_name("default").await.unwrap().unwrap();
    let extra = ts.db().create_api_key(&tenant.id).await.unwrap();
    let ok = ts
        .http
        .get(&url)
        .bearer_auth(&extra.plaintext.0)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    ts.db().revoke_api_key(&extra.info.id).await.unwrap();
    let (status, _) = error_of(
        ts.http
            .get(&url)
            .bearer_auth(&extra.plaintext.0)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401);
    ts.stop().await;
}

#[tokio::test]
async fn tenants_only_see_their_own_sandboxes() {
    // No reconciler: the staged row has no VM behind it and would be marked deleted.
    let ts = TestServer::start_with(|c| c.run_reconciler = false).await;
    let default = ts.db().tenant_by_name("default").await.unwrap().unwrap();
    let other = ts.db().create_tenant("other").await.unwrap();
    let other_key = ts.db().create_api_key(&other.id).await.unwrap().plaintext.0;
    let mine = insert_row(&ts, &default.id).await;

    // The owner sees it.
    let resp = ts
        .get(&format!("/v1/sandboxes/{mine}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let info: space_core::sandbox::SandboxInfo = resp.json().await.unwrap();
    assert_eq!(info.id, mine);

    // Another tenant gets exactly what a missing sandbox gets.
    let missing = SandboxId::generate();
    for (method, suffix) in [
        (Method::GET, ""),
        (Method::DELETE, ""),
        (Method::GET, "/processes"),
        (Method::GET, "/console"),
        (Method::GET, "/files/stat?path=/etc/hosts"),
    ] {
        let theirs = ts
            .http
            .request(
                method.clone(),
                format!("{}/v1/sandboxes/{mine}{suffix}", ts.url),
            )
            .bearer_auth(&other_key);
        let (status, body) = error_of(theirs.send().await.unwrap()).await;
        let nothing = ts
            .http
            .request(
                method.clone(),
                format!("{}/v1/sandboxes/{missing}{suffix}", ts.url),
            )
            .bearer_auth(&other_key);
        let (status2, body2) = error_of(nothing.send().await.unwrap()).await;
        assert_eq!(
            (status, body.code),
            (404, ErrorCode::NotFound),
            "{method} {suffix}"
        );
        assert_eq!((status2, body2.code), (404, ErrorCode::NotFound));
        assert_eq!(
            body.message.replace(mine.as_str(), "ID"),
            body2.message.replace(missing.as_str(), "ID")
        );
    }
    let list: space_core::sandbox::SandboxList = ts
        .http
        .get(format!("{}/v1/sandboxes", ts.url))
        .bearer_auth(&other_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(list.sandboxes.is_empty());
    // The other tenant's delete did not touch it.
    let row = ts.db().sandbox(&default.id, &mine).await.unwrap().unwrap();
    assert_eq!(row.desired_state, DesiredState::Running);
    ts.stop().await;
}

#[tokio::test]
async fn list_filters_by_label_and_state() {
    let ts = TestServer::start_with(|c| c.run_reconciler = false).await;
    let default = ts.db().tenant_by_name("default").await.unwrap().unwrap();
    let id = insert_row(&ts, &default.id).await;
    let list = |q: &'static str| {
        let req = ts.get(&format!("/v1/sandboxes{q}"));
        async move { req.send().await.unwrap() }
    };
    let ids = |resp: reqwest::Response| async move {
        let l: space_core::sandbox::SandboxList = resp.json().await.unwrap();
        l.sandboxes.into_iter().map(|s| s.id).collect::<Vec<_>>()
    };
    assert_eq!(ids(list("?label=team=a").await).await, vec![id.clone()]);
    assert_eq!(ids(list("?label=team=b").await).await, vec![]);
    assert_eq!(ids(list("?label=team=a&label=x=y").await).await, vec![]);
    assert_eq!(ids(list("?state=deleted").await).await, vec![]);
    let (status, body) = error_of(list("?state=bogus").await).await;
    assert_eq!((status, body.code), (400, ErrorCode::InvalidRequest));
    let (status, _) = error_of(list("?label=novalue").await).await;
    assert_eq!(status, 400);
    let (status, _) = error_of(list("?unknown=1").await).await;
    assert_eq!(status, 400);
    ts.stop().await;
}

#[tokio::test]
async fn bad_requests_are_invalid_request_errors() {
    let ts = TestServer::start().await;
    let id = SandboxId::generate();
    let post_json = |path: String, body: &'static str| {
        ts.req(Method::POST, &path)
            .header("content-type", "application/json")
            .body(body)
    };

    // Malformed ids.
    for path in [
        "/v1/sandboxes/not-an-id",
        "/v1/sandboxes/sbx-UPPERCASE0123456789",
        "/v1/sandboxes/sbx-..%2F..%2Fetc%2Fpasswd00",
    ] {
        let (status, body) = error_of(ts.get(path).send().await.unwrap()).await;
        assert_eq!(
            (status, body.code),
            (400, ErrorCode::InvalidRequest),
            "{path}: {}",
            body.message
        );
    }
    let (status, _) = error_of(
        ts.get(&format!("/v1/sandboxes/{id}/processes/abc"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    // Live output is from now on: it does not go with `after`. A watch checks its user.
    for path in [
        format!("/v1/sandboxes/{id}/processes/1/output?live=true&after=3"),
        format!("/v1/sandboxes/{id}/files/watch?path=/tmp&user=Bad!"),
    ] {
        let (status, body) = error_of(ts.get(&path).send().await.unwrap()).await;
        assert_eq!(
            (status, body.code),
            (400, ErrorCode::InvalidRequest),
            "{path}"
        );
    }

    let cases: &[(&str, &str, &str)] = &[
        ("/v1/sandboxes", "{not json", "invalid JSON"),
        (
            "/v1/sandboxes",
            r#"{"template":"base","bogus":1}"#,
            "unknown field",
        ),
        (
            "/v1/sandboxes",
            r#"{"template":"base","labels":{"bad key":"v"}}"#,
            "label key",
        ),
        (
            "/v1/sandboxes",
            r#"{"template":"base","env":{"1BAD":"v"}}"#,
            "environment variable",
        ),
        (
            "/v1/sandboxes",
            r#"{"template":"base","timeout_secs":0}"#,
            "timeout_secs",
        ),
        (
            "/v1/sandboxes",
            r#"{"template":"base","timeout_secs":99999999999}"#,
            "timeout_secs",
        ),
        (
            "/v1/sandboxes",
            r#"{"template":"base","resources":{"gpus":1}}"#,
            "unknown field",
        ),
        ("/v1/sandboxes", r#"{"labels":{}}"#, "`template`"),
        (
            "/v1/sandboxes",
            r#"{"snapshot":"snp-nope"}"#,
            "malformed id",
        ),
        (
            "/v1/sandboxes",
            r#"{"snapshot":"snp-aaaaaaaaaaaaaaaaaaaa","template":"base"}"#,
            "takes its template and resources from the snapshot",
        ),
        (
            "/v1/sandboxes",
            r#"{"template":"base","on_timeout":"hibernate"}"#,
            "unknown variant",
        ),
    ];
    for (path, body, needle) in cases {
        let (status, err) = error_of(post_json(path.to_string(), body).send().await.unwrap()).await;
        assert_eq!(
            (status, err.code),
            (400, ErrorCode::InvalidRequest),
            "{body}"
        );
        assert!(err.message.contains(needle), "{body}: {}", err.message);
    }
    // Unknown template.
    let (status, err) = error_of(
        post_json("/v1/sandboxes".into(), r#"{"template":"nope"}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, err.code, err.message.as_str()),
        (404, ErrorCode::NotFound, "template 'nope' not found")
    );
    // Wrong content type.
    let resp = ts
        .req(Method::POST, "/v1/sandboxes")
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await.0, 400);

    // Process specs are validated before the sandbox is looked up.
    let p = format!("/v1/sandboxes/{id}/processes");
    for (body, code) in [
        (r#"{}"#, ErrorCode::InvalidRequest),
        (r#"{"argv":["ls"],"shell":"ls"}"#, ErrorCode::InvalidRequest),
        (
            r#"{"argv":["ls"],"cwd":"../../etc"}"#,
            ErrorCode::InvalidPath,
        ),
        (
            r#"{"argv":["ls"],"user":"Root!"}"#,
            ErrorCode::InvalidRequest,
        ),
        (
            r#"{"argv":["ls"],"pty":{"rows":0,"cols":80}}"#,
            ErrorCode::InvalidRequest,
        ),
    ] {
        let (status, err) = error_of(post_json(p.clone(), body).send().await.unwrap()).await;
        assert_eq!(
            (status, err.code),
            (code.http_status(), code),
            "{body}: {}",
            err.message
        );
        let (_, err2) = error_of(
            post_json(format!("/v1/sandboxes/{id}/exec"), body)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(err2.code, code);
    }
    let (status, _) = error_of(
        post_json(
            format!("/v1/sandboxes/{id}/processes/1/signal"),
            r#"{"signal":99}"#,
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = error_of(
        post_json(
            format!("/v1/sandboxes/{id}/processes/1/resize"),
            r#"{"rows":0,"cols":1}"#,
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    let put = ts
        .req(Method::PUT, &format!("/v1/sandboxes/{id}/timeout"))
        .json(&serde_json::json!({"timeout_secs": 0}));
    assert_eq!(error_of(put.send().await.unwrap()).await.0, 400);
    // Queries.
    for q in [
        "/console?bytes=0",
        "/console?bytes=2000000",
        "/console?what=1",
        "/files/list?path=/&depth=abc",
        "/files/list?path=/&depth=99",
        "/files",
        "/files/stat?path=/x&user=A%20B",
    ] {
        let (status, err) = error_of(
            ts.get(&format!("/v1/sandboxes/{id}{q}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, err.code),
            (400, ErrorCode::InvalidRequest),
            "{q}: {}",
            err.message
        );
    }
    ts.stop().await;
}

#[tokio::test]
async fn lifecycle_and_snapshot_requests_are_validated_and_tenant_scoped() {
    // No reconciler: the staged row has no VM behind it and would be marked deleted.
    let ts = TestServer::start_with(|c| c.run_reconciler = false).await;
    let default = ts.db().tenant_by_name("default").await.unwrap().unwrap();
    let mine = insert_row(&ts, &default.id).await;
    let snap = space_core::SnapshotId::generate();
    let post = |path: String, body: &'static str| {
        ts.req(Method::POST, &path)
            .header("content-type", "application/json")
            .body(body)
    };

    // Malformed snapshot ids and bad bodies or queries: 400 before anything is looked up.
    let bad: Vec<reqwest::RequestBuilder> = vec![
        ts.req(
            Method::DELETE,
            &format!("/v1/sandboxes/{mine}/snapshots/not-a-snapshot"),
        ),
        ts.req(
            Method::DELETE,
            &format!("/v1/sandboxes/{mine}/snapshots/{mine}"),
        ),
        ts.get(&format!(
            "/v1/sandboxes/{mine}/snapshots/diff?from=nope&to={snap}"
        )),
        ts.get(&format!(
            "/v1/sandboxes/{mine}/snapshots/diff?from={snap}&to={snap}&limit=0"
        )),
        ts.get(&format!("/v1/sandboxes/{mine}/snapshots/diff?from={snap}")),
        ts.get(&format!("/v1/sandboxes/{mine}/events?follow=maybe")),
        post(
            format!("/v1/sandboxes/{mine}/rollback"),
            r#"{"snapshot":"snap-BAD"}"#,
        ),
        post(format!("/v1/sandboxes/{mine}/rollback"), r#"{}"#),
        post(format!("/v1/sandboxes/{mine}/fork"), r#"{"count":0}"#),
        post(format!("/v1/sandboxes/{mine}/fork"), r#"{"count":17}"#),
        post(format!("/v1/sandboxes/{mine}/fork"), r#"{"snapshot":"x"}"#),
        post(
            format!("/v1/sandboxes/{mine}/fork"),
            r#"{"labels":{"bad key":"v"}}"#,
        ),
        post(
            format!("/v1/sandboxes/{mine}/fork"),
            r#"{"timeout_secs":0}"#,
        ),
        post(
            format!("/v1/sandboxes/{mine}/snapshots"),
            r#"{"kind":"memory"}"#,
        ),
        post(format!("/v1/sandboxes/{mine}/snapshots"), r#"{"label":""}"#),
    ];
    for req in bad {
        let (status, err) = error_of(req.send().await.unwrap()).await;
        assert_eq!(
            (status, err.code),
            (400, ErrorCode::InvalidRequest),
            "{}",
            err.message
        );
    }

    // Another tenant (and a missing sandbox) get 404 on every new endpoint.
    let other = ts.db().create_tenant("other").await.unwrap();
    let other_key = ts.db().create_api_key(&other.id).await.unwrap().plaintext.0;
    let missing = SandboxId::generate();
    let endpoints: Vec<(Method, String, Option<&str>)> = vec![
        (Method::POST, "/pause".into(), None),
        (Method::POST, "/resume".into(), None),
        (Method::POST, "/stop".into(), None),
        (Method::POST, "/start".into(), None),
        (
            Method::POST,
            "/rollback".into(),
            Some(r#"{"snapshot":"SNAP"}"#),
        ),
        (Method::POST, "/fork".into(), Some(r#"{"count":2}"#)),
        (Method::GET, "/events".into(), None),
        (Method::GET, "/events?follow=true".into(), None),
        (Method::GET, "/snapshots".into(), None),
        (
            Method::POST,
            "/snapshots".into(),
            Some(r#"{"kind":"disk"}"#),
        ),
        (Method::DELETE, format!("/snapshots/{snap}"), None),
        (
            Method::GET,
            format!("/snapshots/diff?from={snap}&to={snap}"),
            None,
        ),
    ];
    for (method, suffix, body) in &endpoints {
        for (key, sandbox) in [(&other_key, &mine), (&ts.key, &missing)] {
            let mut req = ts
                .http
                .request(
                    method.clone(),
                    format!("{}/v1/sandboxes/{sandbox}{suffix}", ts.url),
                )
                .bearer_auth(key);
            if let Some(b) = body {
                req = req
                    .header("content-type", "application/json")
                    .body(b.replace("SNAP", snap.as_str()));
            }
            let (status, err) = error_of(req.send().await.unwrap()).await;
            assert_eq!(
                (status, err.code),
                (404, ErrorCode::NotFound),
                "{method} {suffix}: {}",
                err.message
            );
            assert_eq!(err.message, format!("sandbox {sandbox} not found"));
        }
    }
    // The pool needs a key, nothing more.
    let resp = ts.get("/v1/pool").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let pools: space_core::sandbox::PoolStatusList = resp.json().await.unwrap();
    assert!(pools.pools.iter().all(|p| p.ready <= p.target));
    let resp = ts
        .http
        .get(format!("{}/v1/pool", ts.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    ts.stop().await;
}

#[tokio::test]
async fn path_traversal_is_refused() {
    let ts = TestServer::start().await;
    let id = SandboxId::generate();
    let enc = "..%2F..%2Fetc%2Fshadow";
    let reqs = vec![
        ts.get(&format!("/v1/sandboxes/{id}/files?path={enc}")),
        ts.req(Method::PUT, &format!("/v1/sandboxes/{id}/files?path={enc}"))
            .body("x"),
        ts.req(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/files?path=/home/user/..%2F.."),
        ),
        ts.get(&format!("/v1/sandboxes/{id}/files/stat?path={enc}")),
        ts.get(&format!("/v1/sandboxes/{id}/files/list?path=a%00b")),
        ts.req(Method::POST, &format!("/v1/sandboxes/{id}/files/mkdir"))
            .json(&serde_json::json!({"path": "/tmp/../etc"})),
        ts.req(Method::POST, &format!("/v1/sandboxes/{id}/files/rename"))
            .json(&serde_json::json!({"from": "/tmp/a", "to": "../b"})),
        ts.get(&format!(
            "/v1/sandboxes/{id}/files/watch?path={enc}&recursive=true"
        )),
    ];
    for req in reqs {
        let (status, err) = error_of(req.send().await.unwrap()).await;
        assert_eq!(
            (status, err.code),
            (400, ErrorCode::InvalidPath),
            "{}",
            err.message
        );
    }
    ts.stop().await;
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let ts = TestServer::start_with(|c| c.max_upload_bytes = 1000).await;
    let id = SandboxId::generate();
    let big = format!(
        r#"{{"template":"base","labels":{{"k":"{}"}}}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    // With Content-Length.
    let resp = ts
        .req(Method::POST, "/v1/sandboxes")
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!((status, err.code), (413, ErrorCode::PayloadTooLarge));
    assert!(
        err.message.contains("larger than the limit of 1048576"),
        "{}",
        err.message
    );
    // Chunked (no Content-Length): counted while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .into_bytes()
        .chunks(64 * 1024)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let resp = ts
        .req(Method::POST, "/v1/sandboxes")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!((status, err.code), (413, ErrorCode::PayloadTooLarge));
    // Uploads larger than the server's limit, by Content-Length.
    let resp = ts
        .req(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/x"),
        )
        .body(vec![0u8; 1001])
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!((status, err.code), (413, ErrorCode::PayloadTooLarge));
    ts.stop().await;
}

#[tokio::test]
async fn unknown_routes_and_methods_use_the_error_format() {
    let ts = TestServer::start().await;
    let (status, err) = error_of(ts.get("/nope").send().await.unwrap()).await;
    assert_eq!((status, err.code), (404, ErrorCode::NotFound));
    let (status, err) =
        error_of(ts.req(Method::PATCH, "/v1/sandboxes").send().await.unwrap()).await;
    assert_eq!((status, err.code), (405, ErrorCode::InvalidRequest));
    ts.stop().await;
}

#[tokio::test]
async fn templates_list_and_delete_of_unknown_sandbox() {
    let ts = TestServer::start().await;
    let resp = ts.get("/v1/templates").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let _: Vec<space_core::template::TemplateInfo> = resp.json().await.unwrap();
    let (status, _) = error_of(
        ts.req(
            Method::DELETE,
            &format!("/v1/sandboxes/{}", SandboxId::generate()),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    ts.stop().await;
}

#[tokio::test]
async fn reconciler_marks_sandboxes_missing_on_the_node_deleted() {
    let ts = TestServer::start_with(|c| c.run_reconciler = false).await;
    let default = ts.db().tenant_by_name("default").await.unwrap().unwrap();
    // A row the node has never heard of (as after a crash between the two steps of a create).
    let id = insert_row(&ts, &default.id).await;
    let reconciler = space_control::reconciler::Reconciler::new(
        ts.server.as_ref().unwrap().state().clone(),
        std::time::Duration::from_secs(86_400),
    );
    reconciler.run_once().await.unwrap();
    let row = ts.db().sandbox(&default.id, &id).await.unwrap().unwrap();
    assert_eq!(row.desired_state, DesiredState::Deleted);
    // Idempotent: a second pass does nothing.
    assert_eq!(reconciler.run_once().await.unwrap(), vec![]);
    // Deleting it again is a 404; getting it shows `deleted`.
    let (status, _) = error_of(
        ts.req(Method::DELETE, &format!("/v1/sandboxes/{id}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    let info: space_core::sandbox::SandboxInfo = ts
        .get(&format!("/v1/sandboxes/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info.state, space_core::SandboxState::Deleted);
    ts.stop().await;
}

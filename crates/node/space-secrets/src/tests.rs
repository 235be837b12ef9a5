//! End-to-end tests of the manager as the gateway uses it: scope precedence, matching,
//! expiry, rate limits, TLS, TRACE, stripping, injection, placeholders, the audit trail, the
//! value cache, and that no output of any kind ever contains a value.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use http::request::Parts;
use http::{Method, Request};
use space_core::id::{SandboxId, TenantId};
use tempfile::TempDir;

use crate::audit::{AuditDecision, AuditFilter, AuditKind, AuditLog};
use crate::backend::SecretBackend;
use crate::command::{CommandBackend, CommandConfig};
use crate::manager::{CredentialManager, ManagerConfig, ManagerError};
use crate::memory::MemoryBackend;
use crate::model::{Credential, ProjectId, Scope};
use crate::placeholder::{PlaceholderKey, PLACEHOLDER_PREFIX};
use crate::resolve::{CredentialRef, Denial, DenyReason, RequestContext, Resolution};
use crate::rule::{CredentialRule, Injection, RateLimit};
use crate::secret::SecretValue;
use crate::store::EncryptedFileStore;
use crate::testutil::{bearer_rule, credential, host};

const NOW: i64 = 1_000_000;

struct Fx {
    manager: CredentialManager,
    backend: Arc<MemoryBackend>,
    audit: Arc<AuditLog>,
    tenant: TenantId,
    project: ProjectId,
    sandbox: SandboxId,
    _dir: TempDir,
}

async fn fx() -> Fx {
    fx_with(ManagerConfig::default()).await
}

async fn fx_with(config: ManagerConfig) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(MemoryBackend::new());
    let audit = Arc::new(AuditLog::open(dir.path().join("audit")).unwrap());
    let manager = CredentialManager::load(
        backend.clone() as Arc<dyn SecretBackend>,
        PlaceholderKey::from_bytes([9u8; 32]),
        config,
    )
    .await
    .unwrap()
    .with_audit(audit.clone());
    Fx {
        manager,
        backend,
        audit,
        tenant: TenantId::generate(),
        project: "apollo".parse().unwrap(),
        sandbox: SandboxId::generate(),
        _dir: dir,
    }
}

/// Who sends a request.
struct Who<'a> {
    tenant: &'a TenantId,
    project: Option<&'a ProjectId>,
    sandbox: &'a SandboxId,
}

impl Fx {
    fn tenant_scope(&self) -> Scope {
        Scope::Tenant {
            tenant: self.tenant.clone(),
        }
    }

    fn project_scope(&self) -> Scope {
        Scope::Project {
            tenant: self.tenant.clone(),
            project: self.project.clone(),
        }
    }

    fn sandbox_scope(&self) -> Scope {
        Scope::Sandbox {
            tenant: self.tenant.clone(),
            sandbox: self.sandbox.clone(),
        }
    }

    fn me(&self) -> Who<'_> {
        Who {
            tenant: &self.tenant,
            project: Some(&self.project),
            sandbox: &self.sandbox,
        }
    }

    async fn add(&self, name: &str, scope: Scope, rule: CredentialRule, value: &str) -> Credential {
        let c = credential(name, scope, rule);
        self.manager
            .put(c.clone(), SecretValue::new(value.into()).unwrap())
            .await
            .unwrap();
        c
    }

    /// `api` for `*.example.com` tenant-wide (`broad`), overridden in the sandbox by `api`
    /// for `a.example.com` only (`narrow`).
    async fn add_broad_and_narrow(&self) {
        let broad = bearer_rule(&["*.example.com"]);
        self.add("api", self.tenant_scope(), broad, "broad").await;
        let narrow = bearer_rule(&["a.example.com"]);
        self.add("api", self.sandbox_scope(), narrow, "narrow")
            .await;
    }

    /// Runs `req` to `host_name` through `authorize_request`; returns the outcome and the
    /// rewritten request head.
    async fn send_from(
        &self,
        from: &Who<'_>,
        host_name: &str,
        req: Request<()>,
        tls: bool,
        now_ms: i64,
    ) -> (Result<Vec<CredentialRef>, Denial>, Parts) {
        let (mut parts, ()) = req.into_parts();
        let method = parts.method.clone();
        let path = parts.uri.path().to_owned();
        let h = host(host_name);
        let ctx = RequestContext {
            tenant: from.tenant,
            project: from.project,
            sandbox: from.sandbox,
            inherited_from: &[],
            host: &h,
            method: &method,
            path: &path,
            tls,
            now_ms,
        };
        let outcome = self.manager.authorize_request(&ctx, &mut parts).await;
        (outcome.map(|a| a.credentials), parts)
    }

    async fn send(
        &self,
        host_name: &str,
        req: Request<()>,
    ) -> (Result<Vec<CredentialRef>, Denial>, Parts) {
        self.send_from(&self.me(), host_name, req, true, NOW).await
    }

    fn events(&self) -> Vec<crate::audit::AuditEvent> {
        self.audit
            .query(&AuditFilter {
                limit: 1000,
                ..Default::default()
            })
            .unwrap()
    }
}

fn req(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap()
}

fn get(uri: &str) -> Request<()> {
    req("GET", uri, &[])
}

fn header<'p>(parts: &'p Parts, name: &str) -> Vec<&'p str> {
    parts
        .headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

/// A bearer rule for `api.example.com`, limited to `requests` a minute.
fn per_minute(requests: u32) -> CredentialRule {
    let mut rule = bearer_rule(&["api.example.com"]);
    rule.rate_limit = Some(RateLimit {
        requests,
        per_secs: 60,
    });
    rule
}

fn denied(outcome: Result<Vec<CredentialRef>, Denial>) -> Denial {
    match outcome {
        Err(d) => d,
        Ok(injected) => panic!("expected a denial, got {injected:?}"),
    }
}

#[tokio::test]
async fn the_most_specific_scope_wins() {
    let fx = fx().await;
    let rule = || bearer_rule(&["api.github.com"]);
    fx.add("github", fx.tenant_scope(), rule(), "tenant-value")
        .await;
    fx.add("github", fx.project_scope(), rule(), "project-value")
        .await;
    fx.add("github", fx.sandbox_scope(), rule(), "sandbox-value")
        .await;
    let auth = |parts: &Parts| header(parts, "authorization").join(",");

    let (r, p) = fx.send("api.github.com", get("/user")).await;
    assert_eq!(r.unwrap().len(), 1);
    assert_eq!(auth(&p), "Bearer sandbox-value");

    let neighbour = SandboxId::generate();
    let in_project = Who {
        tenant: &fx.tenant,
        project: Some(&fx.project),
        sandbox: &neighbour,
    };
    let (_, p) = fx
        .send_from(&in_project, "api.github.com", get("/user"), true, NOW)
        .await;
    assert_eq!(auth(&p), "Bearer project-value");

    let no_project = Who {
        tenant: &fx.tenant,
        project: None,
        sandbox: &neighbour,
    };
    let (_, p) = fx
        .send_from(&no_project, "api.github.com", get("/user"), true, NOW)
        .await;
    assert_eq!(auth(&p), "Bearer tenant-value");

    let stranger_tenant = TenantId::generate();
    let stranger = Who {
        tenant: &stranger_tenant,
        project: Some(&fx.project),
        sandbox: &fx.sandbox,
    };
    let (r, p) = fx
        .send_from(
            &stranger,
            "api.github.com",
            req("GET", "/user", &[("authorization", "Bearer mine")]),
            true,
            NOW,
        )
        .await;
    assert!(r.unwrap().is_empty());
    assert_eq!(
        auth(&p),
        "Bearer mine",
        "requests without credentials are untouched"
    );
}

#[tokio::test]
async fn an_override_replaces_the_broader_credential_entirely() {
    let fx = fx().await;
    fx.add_broad_and_narrow().await;
    let (r, p) = fx.send("a.example.com", get("/")).await;
    assert_eq!(r.unwrap().len(), 1);
    assert_eq!(header(&p, "authorization"), vec!["Bearer narrow"]);
    // The tenant-wide credential does not come back for other hosts in this sandbox.
    let (r, p) = fx.send("b.example.com", get("/")).await;
    assert!(r.unwrap().is_empty());
    assert!(header(&p, "authorization").is_empty());
}

#[tokio::test]
async fn host_method_and_path_patterns() {
    let fx = fx().await;
    let mut rule = bearer_rule(&["api.example.com", "*.uploads.example.com"]);
    rule.methods = Some(vec!["GET".into(), "POST".into()]);
    rule.paths = Some(vec!["/v1/**".into(), "/health".into()]);
    fx.add("api", fx.tenant_scope(), rule, "v").await;

    for (h, method, path, injected) in [
        ("api.example.com", "GET", "/v1/models", true),
        ("api.example.com", "POST", "/v1/chat/completions", true),
        ("api.example.com", "GET", "/health", true),
        ("x.uploads.example.com", "GET", "/v1/x", true),
        ("a.b.uploads.example.com", "POST", "/v1", true),
        ("api.example.com", "DELETE", "/v1/models", false),
        ("api.example.com", "GET", "/v2/models", false),
        ("api.example.com", "GET", "/healthz", false),
        ("uploads.example.com", "GET", "/v1/x", false),
        ("example.com", "GET", "/v1/x", false),
        ("api.example.com.evil.net", "GET", "/v1/x", false),
        ("evilapi.example.com", "GET", "/v1/x", false),
    ] {
        let (r, p) = fx.send(h, req(method, path, &[])).await;
        let got = r.unwrap_or_else(|d| panic!("{h} {method} {path}: {d}"));
        assert_eq!(!got.is_empty(), injected, "{h} {method} {path}");
        assert_eq!(
            header(&p, "authorization").len(),
            usize::from(injected),
            "{h} {method} {path}"
        );
    }

    for path in ["/v1/../admin", "/v1/%2e%2e/admin", "/v1//x", "/v1%2fadmin"] {
        let d = denied(fx.send("api.example.com", get(path)).await.0);
        assert_eq!(d.reason.code(), "non_canonical_path", "{path}");
    }
}

#[tokio::test]
async fn expired_credentials_deny() {
    let fx = fx().await;
    let mut c = credential("api", fx.tenant_scope(), bearer_rule(&["api.example.com"]));
    c.expires_at_ms = Some(5_000);
    fx.manager
        .put(c.clone(), SecretValue::new("v".into()).unwrap())
        .await
        .unwrap();

    let (r, _) = fx
        .send_from(&fx.me(), "api.example.com", get("/"), true, 4_999)
        .await;
    assert_eq!(r.unwrap().len(), 1);
    let (r, p) = fx
        .send_from(&fx.me(), "api.example.com", get("/"), true, 5_000)
        .await;
    let d = denied(r);
    assert_eq!(d.reason, DenyReason::Expired { at_ms: 5_000 });
    assert_eq!(d.credential.unwrap().id, c.id);
    assert!(header(&p, "authorization").is_empty());
    // Expiry only matters where the credential applies.
    let (r, _) = fx
        .send_from(&fx.me(), "other.example.com", get("/"), true, 5_000)
        .await;
    assert!(r.unwrap().is_empty());
}

#[tokio::test]
async fn applies_to_host_follows_scope_precedence_and_counts_expired_credentials() {
    let fx = fx().await;
    fx.add_broad_and_narrow().await;
    let mut old = credential("old", fx.project_scope(), bearer_rule(&["old.example.net"]));
    old.expires_at_ms = Some(5_000);
    fx.manager
        .put(old, SecretValue::new("v".into()).unwrap())
        .await
        .unwrap();
    let applies = |who: &Who<'_>, h: &str| {
        fx.manager
            .applies_to_host(who.tenant, who.project, who.sandbox, &host(h))
    };

    let me = fx.me();
    assert!(applies(&me, "a.example.com"));
    // The sandbox's override replaces the tenant-wide credential, hosts and all.
    assert!(!applies(&me, "b.example.com"));
    // Expired, yet it counts: requests to its host must be refused, not go by without it.
    assert!(applies(&me, "old.example.net"));
    let d = denied(fx.send("old.example.net", get("/")).await.0);
    assert_eq!(d.reason, DenyReason::Expired { at_ms: 5_000 });
    assert!(!applies(&me, "example.net"));
    assert!(!applies(&me, "example.com"));

    // A neighbour outside the project sees the tenant-wide credential only.
    let neighbour = SandboxId::generate();
    let no_project = Who {
        tenant: &fx.tenant,
        project: None,
        sandbox: &neighbour,
    };
    assert!(applies(&no_project, "b.example.com"));
    assert!(applies(&no_project, "a.example.com"));
    assert!(!applies(&no_project, "old.example.net"));

    // Nothing crosses tenants.
    let stranger_tenant = TenantId::generate();
    let stranger = Who {
        tenant: &stranger_tenant,
        project: Some(&fx.project),
        sandbox: &fx.sandbox,
    };
    assert!(!applies(&stranger, "a.example.com"));
    assert!(!applies(&stranger, "old.example.net"));
}

#[tokio::test]
async fn applies_to_host_fetches_audits_and_charges_nothing() {
    let fx = fx().await;
    fx.add("api", fx.tenant_scope(), per_minute(1), "v").await;
    let events = fx.events().len();
    for _ in 0..5 {
        assert!(fx.manager.applies_to_host(
            &fx.tenant,
            Some(&fx.project),
            &fx.sandbox,
            &host("api.example.com")
        ));
    }
    assert_eq!(fx.backend.get_count(), 0);
    assert_eq!(fx.events().len(), events);
    // The only token is still there.
    assert_eq!(
        fx.send("api.example.com", get("/")).await.0.unwrap().len(),
        1
    );
    assert_eq!(
        denied(fx.send("api.example.com", get("/")).await.0)
            .reason
            .code(),
        "rate_limited"
    );
}

#[tokio::test]
async fn rate_limits_deny_then_refill() {
    let fx = fx().await;
    fx.add("api", fx.tenant_scope(), per_minute(2), "v").await;
    let me = fx.me();
    let at = |t: i64| fx.send_from(&me, "api.example.com", get("/"), true, t);
    assert!(at(0).await.0.is_ok());
    assert!(at(1).await.0.is_ok());
    let d = denied(at(2).await.0);
    assert_eq!(
        d.reason,
        DenyReason::RateLimited {
            requests: 2,
            per_secs: 60
        }
    );
    // One token per 30 s.
    assert!(at(29_999).await.0.is_err());
    assert!(at(30_002).await.0.is_ok());
    assert!(at(30_003).await.0.is_err());
    // The budget is per credential: another sandbox shares it.
    let other = SandboxId::generate();
    let from = Who {
        tenant: &fx.tenant,
        project: None,
        sandbox: &other,
    };
    assert!(fx
        .send_from(&from, "api.example.com", get("/"), true, 30_004)
        .await
        .0
        .is_err());
    // Requests the credential does not apply to are not charged or limited.
    assert!(at(30_005).await.0.is_err());
    let (r, _) = fx
        .send_from(&fx.me(), "elsewhere.example.com", get("/"), true, 30_005)
        .await;
    assert!(r.is_ok());
}

#[tokio::test]
async fn cleartext_is_refused_unless_the_rule_allows_it() {
    let fx = fx().await;
    fx.add(
        "strict",
        fx.tenant_scope(),
        bearer_rule(&["api.example.com"]),
        "v",
    )
    .await;
    let mut lax = bearer_rule(&["legacy.example.com"]);
    lax.require_tls = false;
    fx.add("lax", fx.tenant_scope(), lax, "w").await;

    let (r, p) = fx
        .send_from(&fx.me(), "api.example.com", get("/"), false, NOW)
        .await;
    assert_eq!(denied(r).reason, DenyReason::CleartextNotAllowed);
    assert!(header(&p, "authorization").is_empty());
    let (r, p) = fx
        .send_from(&fx.me(), "legacy.example.com", get("/"), false, NOW)
        .await;
    assert_eq!(r.unwrap().len(), 1);
    assert_eq!(header(&p, "authorization"), vec!["Bearer w"]);
}

#[tokio::test]
async fn trace_and_track_are_refused_where_credentials_apply() {
    let fx = fx().await;
    let mut rule = bearer_rule(&["api.example.com"]);
    rule.methods = Some(vec!["GET".into()]);
    fx.add("api", fx.tenant_scope(), rule, "v").await;
    for m in ["TRACE", "TRACK"] {
        let d = denied(fx.send("api.example.com", req(m, "/", &[])).await.0);
        assert_eq!(d.reason.code(), "reflecting_method", "{m}");
        // Elsewhere TRACE is none of our business.
        assert!(fx
            .send("other.example.com", req(m, "/", &[]))
            .await
            .0
            .is_ok());
    }
}

#[tokio::test]
async fn the_guests_own_credentials_are_stripped() {
    let fx = fx().await;
    let rule = CredentialRule {
        injection: Injection::Header {
            name: "X-Api-Key".into(),
            template: "{}".into(),
        },
        ..bearer_rule(&["api.example.com"])
    };
    fx.add("api", fx.tenant_scope(), rule, "real-key").await;
    let guest = [
        ("authorization", "Bearer guest-token"),
        ("proxy-authorization", "Basic Z3Vlc3Q="),
        ("x-api-key", "guest-key-1"),
        ("X-API-KEY", "guest-key-2"),
        ("cookie", "session=abc"),
        ("accept", "application/json"),
    ];
    let (r, p) = fx.send("api.example.com", req("POST", "/v1", &guest)).await;
    assert_eq!(r.unwrap().len(), 1);
    assert!(header(&p, "authorization").is_empty());
    assert!(header(&p, "proxy-authorization").is_empty());
    assert_eq!(header(&p, "x-api-key"), vec!["real-key"]);
    assert!(p.headers.get("x-api-key").unwrap().is_sensitive());
    assert_eq!(header(&p, "cookie"), vec!["session=abc"]);
    assert_eq!(header(&p, "accept"), vec!["application/json"]);

    // No credential for the host: nothing is touched.
    let (r, p) = fx
        .send("other.example.com", req("POST", "/v1", &guest))
        .await;
    assert!(r.unwrap().is_empty());
    assert_eq!(header(&p, "authorization"), vec!["Bearer guest-token"]);
    assert_eq!(header(&p, "x-api-key").len(), 2);
}

#[tokio::test]
async fn basic_auth_and_query_parameter_injection() {
    let fx = fx().await;
    let basic = CredentialRule {
        injection: Injection::BasicAuth {
            username: "bot".into(),
        },
        ..bearer_rule(&["git.example.com"])
    };
    fx.add("git", fx.tenant_scope(), basic, "p@ss:word").await;
    let (r, p) = fx
        .send(
            "git.example.com",
            req("GET", "/", &[("authorization", "Basic eA==")]),
        )
        .await;
    assert_eq!(r.unwrap().len(), 1);
    let expected = format!("Basic {}", BASE64.encode("bot:p@ss:word"));
    assert_eq!(header(&p, "authorization"), vec![expected.as_str()]);

    let query = CredentialRule {
        injection: Injection::QueryParam {
            name: "api_key".into(),
        },
        ..bearer_rule(&["maps.example.com"])
    };
    fx.add("maps", fx.tenant_scope(), query, "a b&c=d/é").await;
    let (r, p) = fx
        .send(
            "maps.example.com",
            get("/geo?api_key=guest&q=paris&api%5Fkey=sneaky&api_key&x=1+2"),
        )
        .await;
    assert_eq!(r.unwrap().len(), 1);
    assert_eq!(
        p.uri.path_and_query().unwrap().as_str(),
        "/geo?q=paris&x=1+2&api_key=a%20b%26c%3Dd%2F%C3%A9"
    );
    let (_, p) = fx.send("maps.example.com", get("/geo")).await;
    assert_eq!(p.uri.to_string(), "/geo?api_key=a%20b%26c%3Dd%2F%C3%A9");
}

#[tokio::test]
async fn two_credentials_writing_one_header_conflict() {
    let fx = fx().await;
    fx.add(
        "one",
        fx.tenant_scope(),
        bearer_rule(&["api.example.com"]),
        "1",
    )
    .await;
    let basic = CredentialRule {
        injection: Injection::BasicAuth {
            username: "u".into(),
        },
        ..bearer_rule(&["api.example.com", "other.example.com"])
    };
    fx.add("two", fx.tenant_scope(), basic, "2").await;
    let extra = CredentialRule {
        injection: Injection::Header {
            name: "x-extra".into(),
            template: "k={}".into(),
        },
        ..bearer_rule(&["other.example.com"])
    };
    fx.add("three", fx.tenant_scope(), extra, "3").await;

    let d = denied(fx.send("api.example.com", get("/")).await.0);
    assert_eq!(
        d.reason,
        DenyReason::Conflict {
            other: "one".parse().unwrap(),
            target: "header authorization".into()
        }
    );
    // Different targets coexist.
    let (r, p) = fx.send("other.example.com", get("/")).await;
    let names: Vec<String> = r.unwrap().into_iter().map(|c| c.name.to_string()).collect();
    assert_eq!(names, vec!["three", "two"]);
    assert_eq!(header(&p, "x-extra"), vec!["k=3"]);
    assert_eq!(header(&p, "authorization").len(), 1);
}

#[tokio::test]
async fn placeholders_are_only_accepted_where_their_credential_goes() {
    let fx = fx().await;
    let mut rule = bearer_rule(&["api.openai.com"]);
    rule.placeholder = true;
    rule.methods = Some(vec!["POST".into()]);
    let c = fx
        .add("OPENAI_API_KEY", fx.tenant_scope(), rule, "sk-real")
        .await;
    fx.add(
        "plain",
        fx.tenant_scope(),
        bearer_rule(&["plain.example.com"]),
        "x",
    )
    .await;

    let env = fx
        .manager
        .placeholders(&fx.tenant, Some(&fx.project), &fx.sandbox);
    assert_eq!(env.len(), 1, "only placeholder credentials");
    let (name, ph) = &env[0];
    assert_eq!(name.as_str(), "OPENAI_API_KEY");
    assert!(ph.as_str().starts_with(PLACEHOLDER_PREFIX));
    assert_eq!(
        fx.manager.placeholders(&fx.tenant, None, &fx.sandbox),
        env,
        "deterministic per sandbox"
    );
    let other_sandbox = SandboxId::generate();
    let theirs = fx.manager.placeholders(&fx.tenant, None, &other_sandbox);
    assert_ne!(theirs[0].1, *ph);
    let ph = ph.as_str();

    // Where its rule injects it (Authorization): the header is replaced by the injection,
    // whatever the guest wrote around the placeholder.
    let bearer = format!("Bearer {ph}ZZ");
    let (r, p) = fx
        .send(
            "api.openai.com",
            req("POST", "/v1/chat?z=1", &[("authorization", &bearer)]),
        )
        .await;
    assert_eq!(r.unwrap()[0].id, c.id);
    assert_eq!(header(&p, "authorization"), vec!["Bearer sk-real"]);
    assert_eq!(p.uri.query(), Some("z=1"));
    // Anywhere else, denied: never substituted (an endpoint that echoes request data would
    // hand the secret to the guest), never forwarded as the stand-in.
    let custom = format!("key={ph};v=1");
    for (uri, extra, found_in) in [
        (
            "/v1/chat".to_owned(),
            Some(("x-custom", custom.as_str())),
            "header x-custom",
        ),
        (format!("/v1/chat?k={ph}&z=1"), None, "query parameter k"),
        (format!("/v1/chat?{ph}=1"), None, ""),
    ] {
        let mut headers = vec![("authorization", bearer.as_str())];
        headers.extend(extra);
        let (r, _) = fx.send("api.openai.com", req("POST", &uri, &headers)).await;
        let d = denied(r);
        assert!(
            matches!(&d.reason, DenyReason::PlaceholderOutOfPlace { found_in: f } if f.starts_with(found_in)),
            "{uri}: {:?}",
            d.reason
        );
        assert_eq!(d.reason.code(), "placeholder_out_of_place");
    }
    let bearer = format!("Bearer {ph}");

    // The placeholder to a host the credential is not for: denied, not forwarded.
    let (r, _) = fx
        .send("evil.example.net", req("POST", "/", &[("x-key", ph)]))
        .await;
    let d = denied(r);
    assert_eq!(d.reason, DenyReason::PlaceholderNotAllowed);
    assert_eq!(d.credential.unwrap().name.as_str(), "OPENAI_API_KEY");
    // Even to a host with credentials of its own.
    let (r, _) = fx
        .send("plain.example.com", get(&format!("/?q={ph}")))
        .await;
    assert_eq!(denied(r).reason, DenyReason::PlaceholderNotAllowed);
    // The right host but a method the credential is not allowed for.
    let (r, _) = fx
        .send(
            "api.openai.com",
            req("GET", "/", &[("authorization", &bearer)]),
        )
        .await;
    assert_eq!(denied(r).reason, DenyReason::PlaceholderNotAllowed);
    // Another sandbox's placeholder means nothing here.
    let foreign = format!("Bearer {}", theirs[0].1);
    let (r, _) = fx
        .send(
            "api.openai.com",
            req("POST", "/", &[("authorization", &foreign)]),
        )
        .await;
    assert_eq!(denied(r).reason, DenyReason::UnknownPlaceholder);
    // Mangled placeholders and placeholders in the path.
    let mangled = format!("Bearer {}", &ph[..ph.len() - 3]);
    let (r, _) = fx
        .send(
            "api.openai.com",
            req("POST", "/", &[("authorization", &mangled)]),
        )
        .await;
    assert_eq!(denied(r).reason, DenyReason::MalformedPlaceholder);
    let (r, _) = fx
        .send("api.openai.com", req("POST", &format!("/v1/{ph}/x"), &[]))
        .await;
    assert_eq!(denied(r).reason, DenyReason::PlaceholderInPath);

    // Every denial is in the audit log.
    let denials: Vec<_> = fx
        .events()
        .into_iter()
        .filter(|e| e.decision == AuditDecision::Deny)
        .collect();
    assert_eq!(denials.len(), 9);
    assert!(denials.iter().any(|e| e.host == "evil.example.net"
        && e.credential_name.as_ref().map(|n| n.as_str()) == Some("OPENAI_API_KEY")));
}

#[tokio::test]
async fn the_audit_log_records_resolution_injection_and_denial() {
    let fx = fx().await;
    let c = fx
        .add(
            "api",
            fx.tenant_scope(),
            bearer_rule(&["api.example.com"]),
            "audit-me-secret",
        )
        .await;
    let long_path = format!("/{}", "a".repeat(5000));
    assert!(fx.send("api.example.com", get(&long_path)).await.0.is_ok());
    assert!(fx
        .send_from(&fx.me(), "api.example.com", get("/x"), false, NOW + 1)
        .await
        .0
        .is_err());
    assert!(fx.send("unrelated.example.com", get("/")).await.0.is_ok());

    let events = fx.events();
    let kinds: Vec<(AuditKind, AuditDecision)> =
        events.iter().map(|e| (e.event, e.decision)).collect();
    assert_eq!(
        kinds,
        vec![
            (AuditKind::Deny, AuditDecision::Deny),
            (AuditKind::Inject, AuditDecision::Allow),
            (AuditKind::Resolve, AuditDecision::Allow),
        ],
        "newest first; requests without credentials are not audited"
    );
    let deny = &events[0];
    assert_eq!(deny.credential_id.as_ref(), Some(&c.id));
    assert_eq!(deny.sandbox, fx.sandbox);
    assert_eq!(deny.tenant, fx.tenant);
    assert_eq!(deny.host, "api.example.com");
    assert_eq!(deny.method, "GET");
    assert_eq!(deny.path, "/x");
    assert!(deny.reason.as_deref().unwrap().contains("TLS"));
    assert!(events[1].path.len() <= crate::audit::MAX_AUDIT_PATH_LEN);

    let by_credential = fx
        .audit
        .query(&AuditFilter {
            credential: Some(c.id.clone()),
            since_ms: Some(NOW + 1),
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(by_credential.len(), 1);
    let raw = read_tree(fx.audit.dir());
    assert!(!raw.contains("audit-me-secret"));
}

#[tokio::test]
async fn an_unwritable_audit_log_denies() {
    let dir = tempfile::tempdir().unwrap();
    let audit = Arc::new(AuditLog::open(dir.path().join("audit")).unwrap());
    let mut fx = fx().await;
    fx.manager = CredentialManager::load(
        fx.backend.clone() as Arc<dyn SecretBackend>,
        PlaceholderKey::generate(),
        ManagerConfig::default(),
    )
    .await
    .unwrap()
    .with_audit(audit);
    // The tenant's directory cannot be made: a file is in its place.
    std::fs::write(dir.path().join("audit").join(fx.tenant.as_str()), b"").unwrap();
    fx.add(
        "api",
        fx.tenant_scope(),
        bearer_rule(&["api.example.com"]),
        "v",
    )
    .await;
    let (r, p) = fx.send("api.example.com", get("/")).await;
    assert_eq!(denied(r).reason.code(), "audit_unavailable");
    assert!(header(&p, "authorization").is_empty());
}

#[tokio::test]
async fn values_are_cached_for_the_ttl_and_refreshed_on_put() {
    let fx = fx_with(ManagerConfig {
        cache_ttl: Duration::from_secs(10),
    })
    .await;
    let c = fx
        .add(
            "api",
            fx.tenant_scope(),
            bearer_rule(&["api.example.com"]),
            "one",
        )
        .await;
    let me = fx.me();
    let at = |t: i64| fx.send_from(&me, "api.example.com", get("/"), true, t);
    let auth = |p: Parts| header(&p, "authorization").join("");
    assert_eq!(auth(at(0).await.1), "Bearer one");
    assert_eq!(auth(at(9_999).await.1), "Bearer one");
    assert_eq!(fx.backend.get_count(), 1);
    assert_eq!(auth(at(10_000).await.1), "Bearer one");
    assert_eq!(fx.backend.get_count(), 2);
    fx.manager
        .put(c.clone(), SecretValue::new("two".into()).unwrap())
        .await
        .unwrap();
    assert_eq!(auth(at(10_001).await.1), "Bearer two");
    assert_eq!(fx.backend.get_count(), 3);

    // A value the backend lost: denied, with the backend's reason.
    let lost = fx
        .add(
            "lost",
            fx.tenant_scope(),
            bearer_rule(&["lost.example.com"]),
            "x",
        )
        .await;
    fx.backend.delete(&lost.id).await.unwrap();
    let d = denied(fx.send("lost.example.com", get("/")).await.0);
    assert_eq!(d.reason.code(), "value_unavailable");
}

#[tokio::test]
async fn management_rules() {
    let fx = fx().await;
    let c = fx
        .add(
            "api",
            fx.tenant_scope(),
            bearer_rule(&["api.example.com"]),
            "v",
        )
        .await;
    // Same name, same scope: refused. Same name, other scope: fine.
    let dup = credential("api", fx.tenant_scope(), bearer_rule(&["api.example.com"]));
    let err = fx
        .manager
        .put(dup, SecretValue::new("w".into()).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, ManagerError::Duplicate { .. }), "{err}");
    fx.add(
        "api",
        fx.sandbox_scope(),
        bearer_rule(&["api.example.com"]),
        "w",
    )
    .await;
    assert_eq!(fx.manager.list().len(), 2);
    // Header values must be header-safe.
    let bad = credential("bad", fx.tenant_scope(), bearer_rule(&["api.example.com"]));
    let err = fx
        .manager
        .put(bad, SecretValue::new("a\r\nX-Injected: 1".into()).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, ManagerError::Value(_)), "{err}");
    // Invalid rules are refused.
    let invalid = credential("inv", fx.tenant_scope(), bearer_rule(&["*.com"]));
    assert!(matches!(
        fx.manager
            .put(invalid, SecretValue::new("x".into()).unwrap())
            .await,
        Err(ManagerError::Invalid(_))
    ));
    // Delete.
    fx.manager.delete(&c.id).await.unwrap();
    assert!(fx.manager.get(&c.id).is_none());
    assert!(matches!(
        fx.manager.delete(&c.id).await,
        Err(ManagerError::NotFound(_))
    ));
    // A reload sees what was stored.
    let reloaded = CredentialManager::load(
        fx.backend.clone() as Arc<dyn SecretBackend>,
        PlaceholderKey::generate(),
        ManagerConfig::default(),
    )
    .await
    .unwrap();
    assert_eq!(reloaded.list(), fx.manager.list());
}

#[tokio::test]
async fn a_context_that_does_not_match_the_request_is_refused() {
    let fx = fx().await;
    let (mut parts, ()) = get("/real").into_parts();
    let h = host("api.example.com");
    let ctx = RequestContext {
        tenant: &fx.tenant,
        project: None,
        sandbox: &fx.sandbox,
        inherited_from: &[],
        host: &h,
        method: &Method::GET,
        path: "/other",
        tls: true,
        now_ms: NOW,
    };
    let d = denied(
        fx.manager
            .authorize_request(&ctx, &mut parts)
            .await
            .map(|a| a.credentials),
    );
    assert_eq!(d.reason.code(), "bad_request");
}

#[tokio::test]
async fn resolve_alone_reports_grants() {
    let fx = fx().await;
    fx.add(
        "api",
        fx.tenant_scope(),
        bearer_rule(&["api.example.com"]),
        "v",
    )
    .await;
    let h = host("api.example.com");
    let ctx = RequestContext {
        tenant: &fx.tenant,
        project: None,
        sandbox: &fx.sandbox,
        inherited_from: &[],
        host: &h,
        method: &Method::GET,
        path: "/",
        tls: true,
        now_ms: NOW,
    };
    match fx.manager.resolve(&ctx) {
        Resolution::Allow(grants) => assert_eq!(grants[0].credential().name.as_str(), "api"),
        Resolution::Deny(d) => panic!("{d}"),
    }
}

/// Collects formatted log output.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn no_output_ever_contains_a_value() {
    const SECRET: &str = "sk-NEVER-PRINT-ME-0123456789";
    let logs = Capture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let fx = fx().await;
    let mut rule = bearer_rule(&["api.example.com"]);
    rule.placeholder = true;
    rule.rate_limit = Some(RateLimit {
        requests: 1,
        per_secs: 60,
    });
    let c = fx.add("api", fx.tenant_scope(), rule, SECRET).await;
    let ph = fx.manager.placeholders(&fx.tenant, None, &fx.sandbox)[0]
        .1
        .clone();

    let mut outputs: Vec<String> = Vec::new();
    // Success, with the placeholder where its credential goes.
    let (r, parts) = fx
        .send(
            "api.example.com",
            req("GET", "/", &[("authorization", &format!("Bearer {ph}"))]),
        )
        .await;
    assert_eq!(r.as_ref().unwrap().len(), 1);
    assert_eq!(
        header(&parts, "authorization"),
        vec![format!("Bearer {SECRET}")]
    );
    outputs.push(format!("{r:?} {parts:?} {:?}", parts.headers));
    // Denials of several kinds.
    for (h, tls) in [
        ("api.example.com", true),
        ("api.example.com", false),
        ("evil.example.net", true),
    ] {
        let (r, parts) = fx
            .send_from(
                &fx.me(),
                h,
                req("GET", "/", &[("x-key", ph.as_str())]),
                tls,
                NOW,
            )
            .await;
        let d = denied(r);
        outputs.push(format!("{d} {d:?} {parts:?}"));
    }
    // Metadata, values, keys and backends in every format.
    outputs.push(format!("{c:?} {}", serde_json::to_string(&c).unwrap()));
    outputs.push(format!("{:?} {:?}", fx.manager, fx.manager.list()));
    let value = SecretValue::new(SECRET.into()).unwrap();
    outputs.push(format!("{value} {value:?} {value:#?}"));
    outputs.push(format!("{:?}", PlaceholderKey::generate()));

    // The encrypted store (blocking calls run on this thread, so their logs are captured).
    let dir = tempfile::tempdir().unwrap();
    let store = EncryptedFileStore::open(dir.path().join("s"), &dir.path().join("k")).unwrap();
    store.put_blocking(&c, &value).unwrap();
    let (meta, back) = store.get_blocking(&c.id).unwrap();
    assert_eq!(back.expose(), SECRET);
    outputs.push(format!("{store:?} {meta:?} {back:?}"));
    let file = std::fs::read_to_string(store.credential_path(&c.id)).unwrap();
    outputs.push(file);

    // A helper that prints the value and fails: the error must not repeat it.
    let script = dir.path().join("helper");
    std::fs::write(
        &script,
        format!("cat >/dev/null; echo value={SECRET}; echo oops >&2; exit 1\n"),
    )
    .unwrap();
    let mut config = CommandConfig::new("/bin/sh");
    config.args = vec![script.to_string_lossy().into_owned()];
    let helper = CommandBackend::new(config, dir.path().join("meta.json")).unwrap();
    let err = helper.get(&c).await.unwrap_err();
    outputs.push(format!("{err} {err:?} {helper:?}"));

    outputs.push(read_tree(fx.audit.dir()));
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("credential request denied"),
        "logs were captured: {logged}"
    );
    outputs.push(logged);

    for out in &outputs {
        assert!(!out.contains(SECRET), "value leaked in: {out}");
    }
}

/// Every file under `dir`, concatenated.
fn read_tree(dir: &std::path::Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.push_str(&read_tree(&path));
        } else {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

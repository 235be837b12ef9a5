//! Templates as objects through `/v1/templates`, on a real registry (TLS with a private CA,
//! basic auth): a build followed line by line, its tags, the memory image and warm pool
//! prepared right after it, get and list with size and origin, deletion refused while a
//! sandbox uses the template and done once it does not (or when forced), failed builds with
//! clear codes and nothing registered, and every tenant's own templates, which only it sees.

use std::time::Duration;

use serde_json::json;
use space_core::sandbox::CreateSandboxRequest;
use space_core::template::{
    TemplateBuildErrorCode, TemplateBuildEvent, TemplateBuildState, TemplateInfo,
};
use test_support::images::{busybox_layer, Image, Layer};
use test_support::registry::{TestRegistry, PASSWORD, USER};
use test_support::{shell, wait_until, TestServer};

/// Follows a build to its end: (every event, the template or the error).
async fn follow(
    c: &space_cli::client::SpaceClient,
    req: &serde_json::Value,
) -> (
    Vec<TemplateBuildEvent>,
    Result<TemplateInfo, space_core::template::TemplateBuildError>,
) {
    let events = test_support::follow_build(c, req).await;
    let end = match events.last() {
        Some(TemplateBuildEvent::Ready { template }) => Ok((**template).clone()),
        Some(TemplateBuildEvent::Failed { error }) => Err(error.clone()),
        other => panic!("the build stream ended with {other:?}"),
    };
    assert!(
        matches!(events.first(), Some(TemplateBuildEvent::Started { .. })),
        "{events:?}"
    );
    (events, end)
}

fn code(err: space_cli::client::ClientError) -> String {
    match err.code() {
        Some(code) => format!("{code:?}"),
        None => panic!("not an API error: {err}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_built_through_the_api_is_warm_tagged_and_deletable() {
    let registry = TestRegistry::start().await;
    let image = Image {
        layers: vec![busybox_layer(&["sh", "cat", "env", "pwd"])
            .file("srv/app.txt", b"built through the API\n", 0o644, 0)
            .finish()],
        config: json!({"Env": ["APP_MODE=api"], "WorkingDir": "/srv"}),
    };
    registry.push("team/app", "1.0", &image).await;
    let hostile = Image {
        layers: vec![Layer::new()
            .raw(tar::EntryType::Regular, "../escape.txt", "", 1, b"x")
            .finish()],
        config: json!({}),
    };
    registry.push("team/hostile", "1", &hostile).await;
    let ca = std::fs::read_to_string(&registry.ca).expect("registry CA");
    let server = TestServer::start_with(|c| {
        c.node.registry_ca_pem = Some(ca);
        c.node.pool_size = 1;
    })
    .await;
    let c = &server.client;
    let auth = json!({"username": USER, "password": PASSWORD});
    let reference = format!("{}/team/app:1.0", registry.host);

    // Built and followed: the pull, the jailed unpack, the warm-up, then the template.
    let (events, end) = follow(
        c,
        &json!({"name": "app", "from_image": reference, "tags": ["1.0", "stable"], "registry_auth": auth}),
    )
    .await;
    let log = test_support::build_log(&events);
    let template = end.unwrap_or_else(|e| panic!("build failed: {e:?}\n{log}"));
    assert_eq!(template.name, "app");
    for step in [
        "pulling layer 1/1",
        "applying layer 1/1",
        "preparing the memory image",
    ] {
        assert!(log.contains(step), "{step:?} missing from the log:\n{log}");
    }
    assert!(!log.contains(PASSWORD), "the password reached the log");
    assert_eq!(template.env["APP_MODE"], "api");
    assert_eq!(
        template.image.as_ref().map(|i| i.reference.clone()),
        Some(format!("docker://{reference}"))
    );

    // Its build can be looked up afterwards, with its log from any offset.
    let Some(TemplateBuildEvent::Started { build_id, .. }) = events.first() else {
        unreachable!()
    };
    let status = c.template_build(build_id, 2).await.expect("build status");
    assert_eq!(status.state, TemplateBuildState::Ready);
    assert!(status.logs.iter().all(|l| l.index >= 2) && !status.logs.is_empty());

    // Names: the tags and `:latest` mean the same template; the list has size and origin.
    for name in ["app:1.0", "app:stable", "app:latest"] {
        let t = c.template(name).await.expect(name);
        assert_eq!(t.digest, template.digest, "{name}");
    }
    let listed = c.templates().await.expect("list");
    let app = listed.iter().find(|t| t.name == "app").expect("app listed");
    assert!(app.image_size_mib > 0 && app.image.is_some());
    assert!(listed.iter().any(|t| t.name == "app:1.0"));

    // Warm right after the build: a pool member of its default shape is made without any
    // create having asked for it.
    wait_until(
        Duration::from_secs(120),
        "the new template's pool member",
        || async {
            c.pool().await.ok().and_then(|p| {
                p.pools
                    .into_iter()
                    .find(|s| s.template == "app" && s.ready >= 1)
            })
        },
    )
    .await;
    let sbx = c
        .create_sandbox(&CreateSandboxRequest {
            template: "app:1.0".into(),
            ..Default::default()
        })
        .await
        .expect("create from the built template");
    eprintln!(
        "first create after the build: {:?} ms",
        sbx.create_latency_ms
    );
    let out = shell(c, &sbx.id, "pwd; cat app.txt; echo $APP_MODE", false).await;
    assert_eq!(out, "/srv\nbuilt through the API\napi\n");

    let node = server.server().state().nodes.any().expect("the node");
    let images_before = node.status().await.expect("status").memory_images;
    // In use: deleting the name its sandbox was made from is refused, unless forced.
    let refused = c.delete_template("app:1.0", false).await.unwrap_err();
    assert_eq!(code(refused), "Conflict");
    c.delete_sandbox(&sbx.id).await.expect("delete sandbox");
    // Unused: one name goes, the template stays while another name points at it.
    c.delete_template("app:1.0", false)
        .await
        .expect("delete a tag");
    assert_eq!(code(c.template("app:1.0").await.unwrap_err()), "NotFound");
    assert_eq!(
        c.template("app").await.expect("still named").digest,
        template.digest
    );
    c.delete_template("app:stable", false)
        .await
        .expect("delete a tag");
    c.delete_template("app", false)
        .await
        .expect("delete the last name");
    assert_eq!(code(c.template("app").await.unwrap_err()), "NotFound");
    assert_eq!(
        code(c.delete_template("app", false).await.unwrap_err()),
        "NotFound"
    );
    // Its memory image went with it.
    let images_after = node.status().await.expect("status").memory_images;
    assert!(
        images_before.difference(&images_after).next().is_some(),
        "the template's memory image is removed: {images_before:?} -> {images_after:?}"
    );
    wait_until(
        Duration::from_secs(30),
        "the deleted template's pool to go",
        || async {
            c.pool()
                .await
                .ok()
                .filter(|p| !p.pools.iter().any(|s| s.template == "app"))
        },
    )
    .await;

    // Failed builds: each with its code, and nothing registered under the name.
    let wrong = json!({"username": USER, "password": "not-it"});
    let cases = [
        (
            json!({"name": "nope", "from_image": reference, "registry_auth": wrong}),
            TemplateBuildErrorCode::RegistryUnauthorized,
        ),
        (
            json!({"name": "nope", "from_image": format!("{}/team/app:9.9", registry.host), "registry_auth": auth}),
            TemplateBuildErrorCode::ImageNotFound,
        ),
        (
            json!({"name": "nope", "from_image": format!("{}/team/hostile:1", registry.host), "registry_auth": auth}),
            TemplateBuildErrorCode::BadImage,
        ),
    ];
    for (req, want) in cases {
        let (events, end) = follow(c, &req).await;
        let err = end.expect_err("the build must fail");
        assert_eq!(
            err.code,
            want,
            "{err:?}\n{}",
            test_support::build_log(&events)
        );
        assert_eq!(code(c.template("nope").await.unwrap_err()), "NotFound");
    }
    // Refused before any build: a bad name, a local path, unknown fields.
    for req in [
        json!({"name": "Bad Name", "from_image": reference}),
        json!({"name": "x", "from_image": "oci:/etc"}),
        json!({"name": "x", "from_image": "/var/lib/space"}),
        json!({"name": "x", "from_image": reference, "mystery": 1}),
    ] {
        let err = c.build_template(&req).await.unwrap_err();
        assert_eq!(code(err), "InvalidRequest", "{req}");
    }

    // Registry logins from the credential manager: the caller's credential whose rule
    // lists the registry is used with no login in the request; one named for a build from
    // another registry is refused before any pull; its value shows nowhere.
    let credential = |name: &str, registries: &[&str], value: &str| {
        serde_json::from_value::<space_control::api::credentials::CredentialRequest>(json!({
            "name": name,
            "rule": {"registries": registries, "injection": {"kind": "basic_auth", "username": USER}},
            "value": value,
        }))
        .expect("credential request")
    };
    c.create_credential(&credential("registry", &[&registry.host], PASSWORD))
        .await
        .expect("a registry-only credential");
    c.create_credential(&credential("ghcr", &["ghcr.io"], "not-it"))
        .await
        .expect("another registry's credential");
    let (events, end) = follow(c, &json!({"name": "stored-login", "from_image": reference})).await;
    let log = test_support::build_log(&events);
    end.unwrap_or_else(|e| panic!("a build with the stored login failed: {e:?}\n{log}"));
    assert!(!log.contains(PASSWORD), "the password reached the log");
    c.delete_template("stored-login", true)
        .await
        .expect("delete stored-login");
    for (req, want) in [
        (json!({"registry_credential": "ghcr"}), "InvalidRequest"),
        (json!({"registry_credential": "missing"}), "NotFound"),
        (
            json!({"registry_credential": "registry", "registry_auth": auth}),
            "InvalidRequest",
        ),
    ] {
        let mut req = req;
        req["name"] = "nope".into();
        req["from_image"] = reference.clone().into();
        let err = c.build_template(&req).await.unwrap_err();
        assert_eq!(code(err), want, "{req}");
    }
    // Two credentials for one registry: the build must say which; a wrong one is the
    // registry's refusal, with nothing registered.
    c.create_credential(&credential("registry-old", &[&registry.host], "not-it"))
        .await
        .expect("a second credential for the registry");
    let err = c
        .build_template(&json!({"name": "nope", "from_image": reference}))
        .await
        .unwrap_err();
    assert_eq!(code(err), "InvalidRequest");
    let (events, end) = follow(
        c,
        &json!({"name": "nope", "from_image": reference, "registry_credential": "registry-old"}),
    )
    .await;
    let err = end.expect_err("a wrong stored password");
    assert_eq!(
        err.code,
        TemplateBuildErrorCode::RegistryUnauthorized,
        "{}",
        test_support::build_log(&events)
    );
    assert_eq!(code(c.template("nope").await.unwrap_err()), "NotFound");

    // The CLI's way to the same: `space template build --api` sends the auth file's
    // credentials for that pull and prints the log; `get` and `rm` go through the API.
    let url = server.url();
    let cli = |args: &[&str]| {
        let args = [&["--url", &url, "--api-key", &server.api_key][..], args].concat();
        test_support::images::run_space(&args)
    };
    let auth_file = registry.auth_file.to_str().expect("path").to_owned();
    let (ok, out) = tokio::task::block_in_place(|| {
        cli(&[
            "template",
            "build",
            "cli-app",
            "--from",
            &reference,
            "--api",
            "--tag",
            "v1",
            "--registry-auth",
            &auth_file,
        ])
    });
    assert!(
        ok && out.contains("applying layer") && out.contains("built template cli-app"),
        "{out}"
    );
    assert!(!out.contains(PASSWORD), "{out}");
    let (ok, out) = tokio::task::block_in_place(|| cli(&["template", "get", "cli-app:v1"]));
    assert!(ok && out.contains("cli-app:v1"), "{out}");
    for name in ["cli-app:v1", "cli-app"] {
        let (ok, out) = tokio::task::block_in_place(|| cli(&["template", "rm", name]));
        assert!(ok, "{out}");
    }
    let (ok, out) = tokio::task::block_in_place(|| cli(&["template", "rm", "cli-app"]));
    assert!(!ok && out.contains("not_found"), "{out}");

    tenants_build_their_own(&server).await;
    assert!(!registry.log().contains("panic"), "{}", registry.log());
}

/// Every tenant builds templates of its own, which only it (and the operator) sees: its
/// `NAME` means its own before the shared one; shared templates stay the operator's.
async fn tenants_build_their_own(server: &TestServer) {
    use space_core::ErrorCode;
    let shared = test_support::TEST_TEMPLATE;
    let other = server.new_tenant_client("not-the-operator").await;
    let third = server.new_tenant_client("a-third-tenant").await;
    let env_build = |name: &str, from: &str, value: &str| json!({"name": name, "from_template": from, "steps": [{"env": {"OWNER": value}}]});
    let (_, mine) = follow(&other, &env_build("mine", shared, "other")).await;
    let mine = mine.expect("a tenant's build");
    let (owner, short) = space_core::template::split_template_owner(&mine.name);
    assert_eq!(short, "mine", "{}", mine.name);
    let owner = owner
        .expect("a tenant's template carries its id")
        .to_owned();

    let names = |list: Vec<TemplateInfo>| list.into_iter().map(|t| t.name).collect::<Vec<_>>();
    let seen = names(other.templates().await.expect("list"));
    assert!(
        seen.contains(&mine.name) && seen.iter().any(|n| n == shared),
        "{seen:?}"
    );
    let seen = names(third.templates().await.expect("list"));
    assert!(
        !seen.contains(&mine.name) && seen.iter().any(|n| n == shared),
        "{seen:?}"
    );
    assert!(names(server.client.templates().await.expect("list")).contains(&mine.name));
    for name in ["mine", mine.name.as_str()] {
        let e = third.template(name).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotFound), "{name}: {e}");
        let e = third
            .create_sandbox(&CreateSandboxRequest {
                template: name.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotFound), "{name}: {e}");
    }
    assert_eq!(other.template("mine").await.expect("own").name, mine.name);

    // Its own `busybox` comes before the shared one, for it alone.
    let (_, shadow) = follow(&other, &env_build(shared, shared, "shadow")).await;
    let shadow = shadow.expect("a tenant's build of a shared name");
    assert_eq!(shadow.name, format!("{owner}.{shared}"));
    let owner_env = |c: &space_cli::client::SpaceClient, template: &str| {
        let (c, template) = (c.clone(), template.to_owned());
        async move {
            let sbx = c
                .create_sandbox(&CreateSandboxRequest {
                    template: template.clone(),
                    ..Default::default()
                })
                .await
                .expect("create");
            let out = shell(&c, &sbx.id, "echo \"[$OWNER]\"", false).await;
            c.delete_sandbox(&sbx.id).await.expect("delete");
            (sbx.template, out.trim().to_owned())
        }
    };
    assert_eq!(
        owner_env(&other, shared).await,
        (shadow.name.clone(), "[shadow]".into())
    );
    assert_eq!(
        owner_env(&other, "mine").await,
        (mine.name.clone(), "[other]".into())
    );
    assert_eq!(
        owner_env(&server.client, shared).await,
        (shared.into(), "[]".into())
    );

    // A build's status is its tenant's: to another it does not exist.
    let started = other
        .build_template(&env_build("later", shared, "x"))
        .await
        .expect("build");
    let e = third
        .template_build(&started.build_id, 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    assert!(other.template_build(&started.build_id, 0).await.is_ok());

    // Files are stored once but known only to who uploaded them.
    let archive = b"not even a tar: never read by a build here".to_vec();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&archive))
    };
    other
        .put_build_files(&sha, archive.clone())
        .await
        .expect("upload");
    let present = |c: space_cli::client::SpaceClient| {
        let sha = sha.clone();
        async move { c.build_files(&sha).await.expect("ask")["present"].as_bool() }
    };
    assert_eq!(present(other.clone()).await, Some(true));
    assert_eq!(present(third.clone()).await, Some(false));
    let copy = json!({"name": "copied", "from_template": shared,
        "steps": [{"copy": {"files": sha, "dest": "/x"}}]});
    let e = third.build_template(&copy).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");

    // The very same template built by two tenants is one digest; what one made from it
    // keeps only its own deletion back, and the other's name going takes nothing from it.
    let (_, twin) = follow(&third, &env_build("mine", shared, "other")).await;
    let twin = twin.expect("the same build by a third tenant");
    assert_eq!(twin.digest, mine.digest);
    let in_use = other
        .create_sandbox(&CreateSandboxRequest {
            template: "mine".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let e = other.delete_template("mine", false).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    third
        .delete_template("mine", false)
        .await
        .expect("its own, unused by it");
    assert_eq!(
        shell(&other, &in_use.id, "echo \"[$OWNER]\"", false)
            .await
            .trim(),
        "[other]"
    );
    other.delete_sandbox(&in_use.id).await.expect("delete");

    // Deleting: its own, not the shared one, not another's.
    other
        .delete_template(shared, false)
        .await
        .expect("its own busybox");
    let e = other.delete_template(shared, true).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
    let e = third.delete_template(&mine.name, true).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
    other
        .delete_template("mine", false)
        .await
        .expect("delete its own");
    assert_eq!(owner_env(&other, shared).await.1, "[]");
}

/// A template the server is told to warm has its memory image and a pool member made at
/// start, before any create asks: the first create is a pool claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_template_is_ready_before_its_first_create() {
    let server = TestServer::start_with(|c| {
        c.node.pool_size = 1;
        c.node.warm_templates = vec![test_support::TEST_TEMPLATE.into(), "missing".into()];
    })
    .await;
    let c = &server.client;
    wait_until(
        Duration::from_secs(120),
        "the warm template's pool member",
        || async {
            c.pool().await.ok().filter(|p| {
                p.pools
                    .iter()
                    .any(|s| s.template == test_support::TEST_TEMPLATE && s.ready >= 1)
            })
        },
    )
    .await;
    let sbx = c
        .create_sandbox(&CreateSandboxRequest {
            template: test_support::TEST_TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let pool = c.pool().await.expect("pool");
    let shape = pool
        .pools
        .iter()
        .find(|s| s.template == test_support::TEST_TEMPLATE)
        .expect("the shape");
    assert!(
        shape.ready == 0 || shape.filling > 0 || sbx.create_latency_ms.is_some_and(|ms| ms < 1000),
        "the first create did not take the warm member: {shape:?} {:?}",
        sbx.create_latency_ms
    );
    eprintln!(
        "first create of a warm template: {:?} ms",
        sbx.create_latency_ms
    );
}

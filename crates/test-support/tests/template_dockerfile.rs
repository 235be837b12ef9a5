//! Templates from Dockerfiles, through the CLI and the API, on a real registry: `FROM` a
//! registry image, `ARG`, `ENV`, `WORKDIR`, `COPY` (with `--chown`) from a build context,
//! `RUN` in a builder sandbox (as root, then as `USER`), the log streamed; the template's
//! defaults and files in a sandbox made from it; a second build taken whole from the step
//! cache, a changed file re-running only from its `COPY` on; a failing `RUN` a clear error
//! with nothing registered; and bad steps refused at the API.

use std::time::Instant;

use serde_json::json;
use space_core::sandbox::CreateSandboxRequest;
use test_support::images::{busybox_layer, Image};
use test_support::registry::TestRegistry;
use test_support::{shell, TestServer};

fn dockerfile(registry: &str) -> String {
    format!(
        r#"# A Dockerfile as a user writes it.
ARG TAG=1
FROM {registry}/team/base:${{TAG}}
ARG MSG=from-arg
ENV APP_MODE=docker \
    EMPTY=""
WORKDIR /srv/app
COPY app/ ./
COPY --chown=user notes.txt /home/user/notes.txt
RUN echo "$MSG $APP_MODE" > built.txt && \
    id -un > who.txt
USER user
RUN echo "as $(id -un) in $(pwd)" > /home/user/as.txt
EXPOSE 8080
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dockerfile_builds_in_a_builder_sandbox_and_its_steps_are_cached() {
    let registry = TestRegistry::start().await;
    let image = Image {
        layers: vec![
            busybox_layer(&["sh", "cat", "echo", "id", "pwd", "ls", "stat", "mkdir"]).finish(),
        ],
        config: json!({}),
    };
    registry.push("team/base", "1", &image).await;
    let ca = std::fs::read_to_string(&registry.ca).expect("registry CA");
    let server = TestServer::start_with(|c| {
        c.node.registry_ca_pem = Some(ca);
    })
    .await;
    let c = &server.client;

    let ctx = tempfile::tempdir().expect("context");
    std::fs::create_dir_all(ctx.path().join("app/lib")).expect("mkdir");
    std::fs::write(ctx.path().join("app/hello.txt"), "hello from the context\n").expect("w");
    std::fs::write(ctx.path().join("app/lib/x.py"), "print(1)\n").expect("w");
    std::fs::write(ctx.path().join("notes.txt"), "notes v1\n").expect("w");
    let file = ctx.path().join("Dockerfile");
    std::fs::write(&file, dockerfile(&registry.host)).expect("Dockerfile");

    let url = server.url();
    let auth = registry.auth_file.to_str().expect("path").to_owned();
    let file_arg = file.to_str().expect("path").to_owned();
    let build = |name: &str| {
        let args = [
            "--url",
            &url,
            "--api-key",
            &server.api_key,
            "template",
            "build",
            name,
            "--file",
            &file_arg,
            "--registry-auth",
            &auth,
        ];
        let started = Instant::now();
        let (ok, out) = tokio::task::block_in_place(|| test_support::images::run_space(&args));
        (ok, out, started.elapsed())
    };

    // The first build runs every step, its output in the log.
    let (ok, out, first) = build("dock");
    assert!(ok, "{out}");
    for expected in [
        "warning: line 14: EXPOSE is ignored",
        "step 1/7: ENV APP_MODE EMPTY",
        "starting a builder sandbox",
        "copied 3 entries",
        "RUN export MSG='from-arg'; echo",
        "built template dock",
    ] {
        assert!(out.contains(expected), "{expected:?} missing:\n{out}");
    }
    let t = c.template("dock").await.expect("template");
    assert_eq!(t.env["APP_MODE"], "docker");
    assert_eq!(t.workdir.as_deref(), Some("/srv/app"));
    assert_eq!(t.default_user, "user");

    // Its sandboxes have what the steps made, where they made it, owned as asked.
    let sbx = c
        .create_sandbox(&CreateSandboxRequest {
            template: "dock".into(),
            ..Default::default()
        })
        .await
        .expect("create from the Dockerfile's template");
    let got = shell(
        c,
        &sbx.id,
        "pwd; cat built.txt who.txt hello.txt lib/x.py /home/user/as.txt; stat -c %U /home/user/notes.txt; id -un; echo $APP_MODE",
        false,
    )
    .await;
    assert_eq!(
        got,
        "/srv/app\nfrom-arg docker\nroot\nhello from the context\nprint(1)\nas user in /srv/app\nuser\nuser\ndocker\n"
    );
    c.delete_sandbox(&sbx.id).await.expect("delete");

    // The same Dockerfile again: every step from the cache, no builder, the same template.
    let (ok, out, second) = build("dock:v2");
    assert!(ok, "{out}");
    assert!(!out.contains("starting a builder"), "{out}");
    assert_eq!(out.matches("  cached").count(), 5, "{out}");
    assert_eq!(
        c.template("dock:v2").await.expect("v2").digest,
        t.digest,
        "the cache gives the same template"
    );
    eprintln!(
        "Dockerfile build: first {} ms, cached {} ms",
        first.as_millis(),
        second.as_millis()
    );

    // A changed file: the steps before its COPY come from the cache, the rest run again.
    std::fs::write(ctx.path().join("notes.txt"), "notes v2\n").expect("w");
    let (ok, out, _) = build("dock:v3");
    assert!(ok, "{out}");
    assert_eq!(out.matches("  cached").count(), 2, "{out}");
    assert_ne!(c.template("dock:v3").await.expect("v3").digest, t.digest);

    // A failing RUN fails the build with its code and registers nothing.
    std::fs::write(
        &file,
        format!(
            "FROM {}/team/base:1\nRUN echo about to fail; exit 3\n",
            registry.host
        ),
    )
    .expect("Dockerfile");
    let (ok, out, _) = build("broken");
    assert!(!ok, "{out}");
    assert!(
        out.contains("about to fail") && out.contains("RUN exited with code 3"),
        "{out}"
    );
    assert!(out.contains("StepFailed"), "{out}");
    assert!(c.template("broken").await.is_err());

    // Bad steps and missing files are refused before anything runs.
    for bad in [
        json!({"name": "x", "from_image": format!("{}/team/base:1", registry.host), "steps": [{"run": ""}]}),
        json!({"name": "x", "from_image": format!("{}/team/base:1", registry.host), "steps": [{"frobnicate": 1}]}),
        json!({"name": "x", "from_template": "dock", "from_image": "a/b"}),
        json!({"name": "x", "from_template": "dock", "builder_disk_mib": 10, "steps": [{"run": "true"}]}),
        json!({"name": "x", "steps": [{"run": "true"}]}),
    ] {
        let e = c.build_template(&bad).await.unwrap_err();
        assert_eq!(
            e.code().map(|c| format!("{c:?}")).as_deref(),
            Some("InvalidRequest"),
            "{bad}"
        );
    }
    let events = test_support::follow_build(
        c,
        &json!({
            "name": "x", "from_template": "dock",
            "steps": [{"copy": {"files": "0".repeat(64), "dest": "/x"}}],
        }),
    )
    .await;
    assert!(
        matches!(
            events.last(),
            Some(space_core::template::TemplateBuildEvent::Failed { error })
                if error.code == space_core::template::TemplateBuildErrorCode::FilesNotFound
        ),
        "{events:?}"
    );
    // An archive that is not what its hash says is refused; the right one is kept.
    let e = c
        .put_build_files(&"1".repeat(64), b"not that".to_vec())
        .await
        .unwrap_err();
    assert_eq!(
        e.code().map(|c| format!("{c:?}")).as_deref(),
        Some("InvalidRequest")
    );

    // A larger builder disk, for steps that install more than the default headroom: the
    // RUN sees it, and the template it makes is that large.
    let events = test_support::follow_build(
        c,
        &json!({
            "name": "dock-big", "from_template": "dock", "builder_disk_mib": 6144,
            "steps": [{"run": "echo big-disk; df -m / | tail -1"}],
        }),
    )
    .await;
    let Some(space_core::template::TemplateBuildEvent::Ready { template }) = events.last() else {
        panic!("{events:?}");
    };
    assert_eq!(template.image_size_mib, 6144, "{template:?}");
    let df_total_mib = events
        .iter()
        .filter_map(|e| match e {
            space_core::template::TemplateBuildEvent::Log(l) if l.line.contains("% /") => {
                l.line.split_whitespace().nth(2)?.parse::<u64>().ok()
            }
            _ => None,
        })
        .next();
    assert!(
        df_total_mib.is_some_and(|m| m > 5000),
        "{df_total_mib:?}: {events:?}"
    );
    c.delete_template("dock-big", true).await.expect("delete");

    // From a template, with steps given through the API: a RUN on top of `dock`.
    build_plus(c, "plus").await;
    let sbx = c
        .create_sandbox(&CreateSandboxRequest {
            template: "dock-plus".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    assert_eq!(
        shell(c, &sbx.id, "cat plus.txt built.txt; id -un", false).await,
        "plus\nfrom-arg docker\nroot\n"
    );

    // The template cache: dock-plus rebuilt while a sandbox of the old one lives leaves the
    // old one cached; a prune keeps it (the sandbox was made from it), removes the steps'
    // caches, and leaves every named template whole.
    let old_plus = c.template("dock-plus").await.expect("dock-plus").digest;
    build_plus(c, "plus2").await;
    let cached = c.template_cache().await.expect("cache");
    assert!(cached.iter().any(|t| t.digest == old_plus), "{cached:?}");
    assert!(
        cached.len() >= 3,
        "steps' caches and the old dock-plus: {cached:?}"
    );
    let all_unused = space_core::template::TemplateCachePruneRequest {
        unused_for_secs: Some(0),
        dry_run: true,
    };
    let dry = c.prune_template_cache(&all_unused).await.expect("dry run");
    assert!(dry.dry_run && !dry.removed.is_empty(), "{dry:?}");
    assert_eq!(
        c.template_cache().await.expect("cache").len(),
        cached.len(),
        "a dry run removes nothing"
    );
    // A day (the default) is longer than this test: nothing goes.
    let recent = c
        .prune_template_cache(&Default::default())
        .await
        .expect("prune recent");
    assert!(recent.removed.is_empty(), "{recent:?}");

    let pruned = c
        .prune_template_cache(&space_core::template::TemplateCachePruneRequest {
            dry_run: false,
            ..all_unused.clone()
        })
        .await
        .expect("prune");
    assert_eq!(
        pruned
            .in_use
            .iter()
            .map(|t| t.digest.as_str())
            .collect::<Vec<_>>(),
        [old_plus.as_str()],
        "{pruned:?}"
    );
    assert_eq!(pruned.removed.len(), cached.len() - 1, "{pruned:?}");
    assert!(pruned.freed_mib > 0, "{pruned:?}");
    let left = c.template_cache().await.expect("cache");
    assert_eq!(
        left.iter().map(|t| t.digest.as_str()).collect::<Vec<_>>(),
        [old_plus.as_str()]
    );
    // The old sandbox goes on; every named template still creates.
    assert_eq!(shell(c, &sbx.id, "cat plus.txt", false).await, "plus\n");
    for name in ["dock", "dock:v3", "dock-plus"] {
        let s = c
            .create_sandbox(&CreateSandboxRequest {
                template: name.into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create from {name} after a prune: {e}"));
        c.delete_sandbox(&s.id).await.expect("delete");
    }
    // Once its last sandbox is gone, the old dock-plus goes too.
    c.delete_sandbox(&sbx.id).await.expect("delete");
    let pruned = c
        .prune_template_cache(&space_core::template::TemplateCachePruneRequest {
            dry_run: false,
            ..all_unused
        })
        .await
        .expect("prune");
    assert_eq!(
        pruned
            .removed
            .iter()
            .map(|t| t.digest.as_str())
            .collect::<Vec<_>>(),
        [old_plus.as_str()],
        "{pruned:?}"
    );
    assert!(c.template_cache().await.expect("cache").is_empty());
}

/// Builds `dock-plus` on `dock` through the API: a RUN writing `content` to `plus.txt`.
async fn build_plus(c: &space_cli::client::SpaceClient, content: &str) {
    let events = test_support::follow_build(
        c,
        &json!({
            "name": "dock-plus", "from_template": "dock",
            "steps": [{"user": "root"}, {"run": ["/bin/sh", "-c", format!("echo {content} > /srv/app/plus.txt")]}],
        }),
    )
    .await;
    assert!(
        matches!(
            events.last(),
            Some(space_core::template::TemplateBuildEvent::Ready { .. })
        ),
        "{events:?}"
    );
}

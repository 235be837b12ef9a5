//! Templates built from container images (`space template build NAME --from REF`), run by
//! the real `space` binary against a test server's store, then booted as sandboxes: the
//! image's files as its layers say (whiteouts, opaque directories, links, owners, setuid
//! bits, file capabilities), its config as the template's defaults, the sandbox plumbing
//! added; a shell-less image still runs argv commands; hostile or broken images refused
//! with a clear error and nothing registered.

use std::path::Path;
use std::process::Command;

use space_core::process::ProcessSpec;
use space_core::sandbox::CreateSandboxRequest;
use test_support::images::{busybox_layer, Image, Layer};
use test_support::registry::TestRegistry;
use test_support::{shell, TestServer};

const APPLETS: &[&str] = &[
    "sh", "echo", "cat", "ls", "stat", "id", "pwd", "env", "readlink", "test", "wc",
];

/// Runs `space template build NAME --from REF` on `data_dir`: (success, output).
fn build(data_dir: &Path, name: &str, from: &str) -> (bool, String) {
    build_with(data_dir, name, from, &[])
}

/// [`build`] with more arguments.
fn build_with(data_dir: &Path, name: &str, from: &str, extra: &[&str]) -> (bool, String) {
    test_support::images::build_template(data_dir, name, from, extra)
}

/// A two-layer image exercising the layer rules, with a config that sets every default.
fn rich_image() -> Image {
    let caps = {
        // A version-2 `security.capability`: cap_net_raw (bit 13), effective.
        let mut v = Vec::new();
        for w in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v
    };
    let lower = busybox_layer(APPLETS)
        .dir("etc", 0o755)
        .file(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234::/home/app:/bin/sh\n",
            0o644,
            0,
        )
        .file("etc/group", b"root:x:0:\napp:x:1234:\n", 0o644, 0)
        .dir_owned("home/app", 0o750, 1234)
        .file("home/app/notes.txt", b"from the image\n", 0o640, 1234)
        .file("usr/bin/fake-su", b"#!/bin/sh\necho su\n", 0o4755, 0)
        .file_with_xattrs(
            "usr/bin/fake-ping",
            b"#!/bin/sh\n",
            0o755,
            &[("security.capability", &caps), ("user.origin", b"test")],
        )
        .hardlink("usr/bin/fake-su-again", "usr/bin/fake-su")
        .symlink("usr/bin/su-link", "fake-su")
        .file("opt/old/a", b"a", 0o644, 0)
        .file("opt/old/b", b"b", 0o644, 0)
        .file("var/gone/file", b"x", 0o644, 0)
        .finish();
    let upper = Layer::new()
        .dir("opt/old", 0o755)
        .file("opt/old/.wh..wh..opq", b"", 0o644, 0)
        .file("opt/old/c", b"c", 0o644, 0)
        .file("var/.wh.gone", b"", 0o644, 0)
        .dir("work", 0o777)
        .finish();
    Image {
        layers: vec![lower, upper],
        config: serde_json::json!({
            "Env": ["PATH=/bin:/usr/bin", "GREETING=hello from the image"],
            "WorkingDir": "/work",
            "User": "app",
            "Entrypoint": ["/bin/sh", "-c"],
            "Cmd": ["echo started"],
        }),
    }
}

fn debugfs(image: &Path, request: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-R", request])
        .arg(image)
        .output()
        .expect("debugfs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_from_an_image_runs_as_the_image_says() {
    let server = TestServer::start().await;
    let c = &server.client;
    let images = tempfile::tempdir().expect("dir");
    let image = rich_image();
    let layout = images.path().join("layout");
    image.write_layout(&layout, "v1");

    let (ok, out) = build(
        &server.data_dir,
        "rich",
        &format!("oci:{}:v1", layout.display()),
    );
    assert!(ok, "build: {out}");
    let store = space_storage::Store::open(&server.data_dir, 1 << 30).expect("store");
    let tpl = store
        .templates()
        .get("rich")
        .expect("read")
        .expect("registered");
    assert_eq!(tpl.default_user, "app");
    assert_eq!(tpl.workdir.as_deref(), Some("/work"));
    assert_eq!(tpl.env["GREETING"], "hello from the image");
    assert_eq!(tpl.image_command, ["/bin/sh", "-c", "echo started"]);
    let origin = tpl.image.clone().expect("image origin");
    assert_eq!(
        origin.config_digest,
        test_support::images::digest(&image.config_json())
    );
    // What no guest command can show: owners and the file capability in the ext4 image.
    let rootfs = store.templates().image_path(&tpl);
    let ping = debugfs(&rootfs, "ea_list /usr/bin/fake-ping");
    assert!(
        ping.contains("security.capability") && ping.contains("user.origin"),
        "{ping}"
    );
    let notes = debugfs(&rootfs, "stat /home/app/notes.txt");
    assert!(
        notes.contains("User:  1234") && notes.contains("Group:  1234"),
        "{notes}"
    );

    // The same image as a `docker save` archive is the same template: found, not unpacked.
    let archive = images.path().join("rich.tar");
    image.write_docker_archive(&archive, "rich:v1");
    let (ok, out) = build(
        &server.data_dir,
        "rich-again",
        &format!("docker-archive:{}", archive.display()),
    );
    assert!(ok, "build from the archive: {out}");
    assert!(out.contains("is cached"), "{out}");
    let again = store
        .templates()
        .get("rich-again")
        .expect("read")
        .expect("registered");
    assert_eq!(again.digest, tpl.digest);

    let sb = c
        .create_sandbox(&CreateSandboxRequest {
            template: "rich".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let id = &sb.id;
    // The image's user, working directory and environment are the defaults.
    assert_eq!(
        shell(c, id, "id -un; pwd; echo $GREETING", false).await,
        "app\n/work\nhello from the image\n"
    );
    // The layers: opaque directory, whiteout, owners, modes, links.
    assert_eq!(shell(c, id, "ls /opt/old", true).await, "c\n");
    assert_eq!(
        shell(c, id, "test -e /var/gone || echo gone", true).await,
        "gone\n"
    );
    assert_eq!(
        shell(c, id, "cat /home/app/notes.txt", false).await,
        "from the image\n"
    );
    assert_eq!(
        shell(
            c,
            id,
            "stat -c '%a %u %h' /usr/bin/fake-su; readlink /usr/bin/su-link",
            true
        )
        .await,
        "4755 0 2\nfake-su\n"
    );
    // The plumbing: the sandbox user, with a home.
    assert_eq!(
        shell(c, id, "id -u user; stat -c '%U %a' /home/user", true).await,
        "1000\nuser 755\n"
    );
    // A request's own cwd and env still win.
    let mut spec = ProcessSpec::shell("pwd; echo $GREETING");
    spec.cwd = Some("/tmp".into());
    spec.env.insert("GREETING".into(), "mine".into());
    let out = c.run(id, &spec).await.expect("run");
    assert_eq!(out.stdout_str(), "/tmp\nmine\n");
    c.delete_sandbox(id.as_str()).await.expect("delete");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_without_a_shell_runs_argv_commands() {
    let server = TestServer::start().await;
    let c = &server.client;
    let images = tempfile::tempdir().expect("dir");
    // Like distroless: one static program, no shell, no passwd.
    let image = Image {
        layers: vec![busybox_layer(&[])
            .file("data/hello.txt", b"hi", 0o644, 0)
            .finish()],
        // A WorkingDir the layers do not have: made by the build.
        config: serde_json::json!({"Entrypoint": ["/bin/busybox"], "WorkingDir": "/srv/app"}),
    };
    let layout = images.path().join("layout");
    image.write_layout(&layout, "latest");
    let (ok, out) = build(&server.data_dir, "noshell", layout.to_str().expect("path"));
    assert!(ok, "build: {out}");
    let sb = c
        .create_sandbox(&CreateSandboxRequest {
            template: "noshell".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let spec = ProcessSpec {
        argv: Some(vec![
            "/bin/busybox".into(),
            "cat".into(),
            "/data/hello.txt".into(),
        ]),
        ..Default::default()
    };
    let out = c.run(&sb.id, &spec).await.expect("run");
    assert_eq!(out.status.exit_code, Some(0), "{}", out.stderr_str());
    assert_eq!(out.stdout_str(), "hi");
    let whoami = ProcessSpec {
        argv: Some(vec!["/bin/busybox".into(), "id".into(), "-un".into()]),
        ..Default::default()
    };
    assert_eq!(
        c.run(&sb.id, &whoami).await.expect("run").stdout_str(),
        "user\n"
    );
    let pwd = ProcessSpec {
        argv: Some(vec!["/bin/busybox".into(), "pwd".into()]),
        ..Default::default()
    };
    assert_eq!(
        c.run(&sb.id, &pwd).await.expect("run").stdout_str(),
        "/srv/app\n"
    );
    c.delete_sandbox(sb.id.as_str()).await.expect("delete");
    server.stop().await;
}

/// Broken and hostile images: each refused with an error naming the problem, no template
/// registered, no work directory left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_and_hostile_images_are_refused_and_nothing_is_registered() {
    let data_dir = test_support::new_data_dir();
    let _config = test_support::test_server_config(&data_dir);
    let images = tempfile::tempdir().expect("dir");
    let good = || busybox_layer(&["sh"]);
    let cases: Vec<(&str, Image, &str)> = vec![
        (
            "dotdot",
            Image {
                layers: vec![good()
                    .raw(tar::EntryType::Regular, "../../escaped", "", 1, b"x")
                    .finish()],
                config: serde_json::json!({}),
            },
            "escapes the root",
        ),
        (
            "abslink",
            Image {
                layers: vec![good()
                    .symlink("evil", "/etc")
                    .raw(tar::EntryType::Regular, "evil/passwd", "", 1, b"x")
                    .finish()],
                config: serde_json::json!({}),
            },
            "escapes the root",
        ),
        (
            "device",
            Image {
                layers: vec![good()
                    .raw(tar::EntryType::Char, "dev/mem", "", 0, b"")
                    .finish()],
                config: serde_json::json!({}),
            },
            "device node",
        ),
        (
            "bomb",
            Image {
                layers: vec![good()
                    .raw(tar::EntryType::Regular, "huge", "", 1 << 42, b"")
                    .finish()],
                config: serde_json::json!({}),
            },
            "too large",
        ),
    ];
    for (name, image, expect) in cases {
        let dir = images.path().join(name);
        image.write_layout(&dir, "t");
        let (ok, out) = build(&data_dir, name, &format!("oci:{}", dir.display()));
        assert!(!ok, "{name}: built: {out}");
        assert!(out.contains(expect), "{name}: {out}");
    }
    // A layer whose bytes do not match its digest, and one cut short.
    let image = Image {
        layers: vec![good().file("f", &vec![7u8; 300_000], 0o644, 0).finish()],
        config: serde_json::json!({}),
    };
    let dir = images.path().join("corrupt");
    let blobs = image.write_layout(&dir, "t");
    let layer = dir
        .join("blobs/sha256")
        .join(&test_support::images::digest(&blobs.layers[0])["sha256:".len()..]);
    let mut bytes = std::fs::read(&layer).expect("layer");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&layer, &bytes).expect("corrupt");
    let (ok, out) = build(&data_dir, "corrupt", &format!("oci:{}", dir.display()));
    assert!(!ok && out.contains("digest mismatch"), "{out}");
    bytes.truncate(mid);
    std::fs::write(&layer, &bytes).expect("truncate");
    let (ok, out) = build(&data_dir, "truncated", &format!("oci:{}", dir.display()));
    assert!(!ok && out.contains("digest mismatch"), "{out}");
    // A layout whose tag is not there, and a path that is no image.
    let (ok, out) = build(&data_dir, "notag", &format!("oci:{}:nope", dir.display()));
    assert!(!ok && out.contains("no image tagged"), "{out}");
    let (ok, out) = build(&data_dir, "nothing", "/nonexistent/image.tar");
    assert!(!ok && out.contains("cannot open"), "{out}");

    let store = space_storage::Store::open(&data_dir, 1 << 30).expect("store");
    let names: Vec<String> = store
        .templates()
        .list()
        .expect("list")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(
        names,
        [test_support::TEST_TEMPLATE],
        "nothing else registered"
    );
    let builds = store.root().join(".image-builds");
    assert!(
        std::fs::read_dir(&builds).map(|d| d.count()).unwrap_or(0) == 0,
        "no work directory left"
    );
    test_support::cleanup_data_dir(&data_dir);
}

/// A registry with TLS (a private CA) and basic auth, an image pushed as a multi-platform
/// index: built with the credentials file and the CA; refused clearly without either, or for
/// a tag it does not have; built again (another name, by digest) without fetching a layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_from_a_registry_with_auth_and_a_private_ca() {
    let registry = TestRegistry::start().await;
    let data_dir = test_support::new_data_dir();
    let _config = test_support::test_server_config(&data_dir);
    let image = Image {
        layers: vec![busybox_layer(&["sh", "cat"])
            .file("srv/tool.txt", b"from the registry", 0o644, 0)
            // Large enough that the blob is still being written when the download ends.
            .file(
                "srv/blob.bin",
                &test_support::images::noise(6 << 20, 7),
                0o644,
                0,
            )
            .finish()],
        config: serde_json::json!({"Env": ["TOOL=1"]}),
    };
    registry.push_index("team/tool", "1.0", &image).await;
    let reference = format!("{}/team/tool:1.0", registry.host);
    let ca = registry.ca.to_str().expect("path");
    let auth = registry.auth_file.to_str().expect("path");

    let (ok, out) = build_with(&data_dir, "tool", &reference, &["--registry-ca", ca]);
    assert!(
        !ok && out.contains("refused the credentials"),
        "without credentials: {out}"
    );
    let (ok, out) = build_with(&data_dir, "tool", &reference, &["--registry-auth", auth]);
    assert!(!ok && out.contains("certificate"), "without the CA: {out}");
    let (ok, out) = build_with(
        &data_dir,
        "tool",
        &format!("{}/team/tool:2.0", registry.host),
        &["--registry-auth", auth, "--registry-ca", ca],
    );
    assert!(!ok && out.contains("not found"), "a missing tag: {out}");

    let (ok, out) = build_with(
        &data_dir,
        "tool",
        &reference,
        &["--registry-auth", auth, "--registry-ca", ca],
    );
    assert!(ok, "build: {out}");
    let store = space_storage::Store::open(&data_dir, 1 << 30).expect("store");
    let tpl = store
        .templates()
        .get("tool")
        .expect("read")
        .expect("registered");
    assert_eq!(tpl.env["TOOL"], "1");
    assert_eq!(
        tpl.image.as_ref().map(|i| i.config_digest.clone()),
        Some(test_support::images::digest(&image.config_json()))
    );
    assert_eq!(
        tpl.image.as_ref().map(|i| i.reference.clone()),
        Some(format!("docker://{reference}"))
    );

    // By digest, under another name: the same template, found before any layer is fetched.
    let manifest = test_support::images::digest(&image.blobs().manifest);
    let (ok, out) = build_with(
        &data_dir,
        "tool-pinned",
        &format!("docker://{}/team/tool@{manifest}", registry.host),
        &["--registry-auth", auth, "--registry-ca", ca],
    );
    assert!(ok, "build by digest: {out}");
    assert!(
        out.contains("is cached") && !out.contains("pulling layer"),
        "{out}"
    );
    let pinned = store
        .templates()
        .get("tool-pinned")
        .expect("read")
        .expect("registered");
    assert_eq!(pinned.digest, tpl.digest);
    assert!(!registry.log().contains("panic"), "{}", registry.log());
    test_support::cleanup_data_dir(&data_dir);
}

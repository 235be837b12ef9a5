//! The E2B compatibility suites: official SDK releases (Python `e2b` and JS `e2b`, the
//! matrix `scripts/e2b-sdks` installs: the newest pinned, the oldest 2.x of the last twelve
//! months, one between) drive a real SPACE server, on real VMs, through every call
//! `tests/e2b` lists. One test per language and release, so each suite's verdict reaches
//! `./scripts/test` and the releases run in parallel; the suites' own output shows which
//! call failed.

use std::process::Stdio;
use std::time::Duration;

use test_support::e2b;

/// Longest a whole suite may take before it is killed (it normally takes minutes).
const SUITE_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// Runs `program args…` in the repository root with the suites' environment pointed at a
/// fresh E2B server; fails with the suite's output unless it exits 0.
async fn run_suite(program: &std::path::Path, args: &[&str], sdk_version: &str) {
    let server = e2b::start_server().await;
    let db = &server.server().state().db;
    let other = db.create_tenant("e2b-other").await.expect("second tenant");
    let other_key = db.create_api_key(&other.id).await.expect("second key");
    let env = e2b::sdk_env(&server, &other_key.plaintext.0, sdk_version);
    run_against(server, env, program, args).await;
}

/// Runs `program args…` against a fresh E2B server with a TLS listener (a CA and a
/// `*.space.test` certificate of the test's own), in the host-mode environment.
async fn run_host_mode(program: &std::path::Path, args: &[&str], sdk_version: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = e2b::test_certificates(dir.path());
    let server = e2b::start_tls_server(&certs).await;
    let env = e2b::host_mode_env(&server, &certs.ca, sdk_version);
    run_against(server, env, program, args).await;
}

/// Runs `program args…` in the repository root with `env`, then stops `server`; fails with
/// the program's output unless it exits 0.
async fn run_against(
    server: test_support::TestServer,
    env: Vec<(String, String)>,
    program: &std::path::Path,
    args: &[&str],
) {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(e2b::repo_root())
        // Only what `env` says: the host-mode suite must not inherit a sandbox URL.
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_SANDBOX_URL")
        .envs(env)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(SUITE_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} {args:?} took longer than {SUITE_TIMEOUT:?}",
                program.display()
            )
        })
        .expect("run the suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    server.stop().await;
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\n{stdout}\n{stderr}",
        program.display(),
        out.status
    );
    println!("{stdout}");
}

/// The Python suites' arguments: pytest on `dir`, quiet, with the reasons of failures, and
/// no cache written into the repository.
fn pytest(dir: &str) -> [&str; 7] {
    ["-m", "pytest", dir, "-q", "-rf", "-p", "no:cacheprovider"]
}

/// The JS suites' runner (`node --test`), once the SDKs are checked to be installed.
fn node() -> &'static std::path::Path {
    require_installed(&e2b::repo_root().join("tests/e2b/js/node_modules/e2b"));
    std::path::Path::new("node")
}

/// The node condition that makes `#e2b` (tests/e2b/js/package.json) the JS SDK `version`:
/// the newest pinned is the default, an older one is installed as `e2b-<version>`.
fn js_condition(version: &str) -> String {
    format!("--conditions=e2b-{version}")
}

/// The Python of the virtualenv of SDK `version`, checked to be installed.
fn python(version: &str) -> std::path::PathBuf {
    let python = e2b::python(version);
    require_installed(&python);
    python
}

/// Fails unless `scripts/e2b-sdks` has installed what the suites need.
fn require_installed(what: &std::path::Path) {
    assert!(
        what.exists(),
        "{} is missing: run ./scripts/e2b-sdks (./scripts/test does) to install the E2B SDKs",
        what.display()
    );
}

/// The Python suite (`tests/e2b/py`) with SDK `version`.
async fn python_suite(version: &str) {
    run_suite(&python(version), &pytest("tests/e2b/py"), version).await;
}

/// The JS suite (`tests/e2b/js`) with SDK `version`.
async fn js_suite(version: &str) {
    let condition = js_condition(version);
    let args = [
        condition.as_str(),
        "--test",
        "--test-concurrency=2",
        "--test-timeout=300000",
        "tests/e2b/js",
    ];
    run_suite(node(), &args, version).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_suite() {
    python_suite(e2b::PYTHON_SDK).await;
}

/// A release between the oldest and the newest; it refuses a key not shaped `e2b_<hex>`.
#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_2_45_1_suite() {
    python_suite("2.45.1").await;
}

/// The oldest 2.x release of the last twelve months.
#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_2_9_0_suite() {
    python_suite("2.9.0").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn js_sdk_suite() {
    js_suite(e2b::JS_SDK).await;
}

/// A release between the oldest and the newest; it refuses a key not shaped `e2b_<hex>`.
#[tokio::test(flavor = "multi_thread")]
async fn js_sdk_2_35_0_suite() {
    js_suite("2.35.0").await;
}

/// The oldest 2.x release of the last twelve months.
#[tokio::test(flavor = "multi_thread")]
async fn js_sdk_2_9_0_suite() {
    js_suite("2.9.0").await;
}

async fn python_host_mode(version: &str) {
    run_host_mode(&python(version), &pytest("tests/e2b/host_mode"), version).await;
}

async fn js_host_mode(version: &str) {
    let condition = js_condition(version);
    let args = [
        condition.as_str(),
        "--test",
        "--test-timeout=300000",
        "tests/e2b/js/host_mode/host_mode.mjs",
    ];
    run_host_mode(node(), &args, version).await;
}

/// The SDK without `E2B_SANDBOX_URL`: envd and ports by host name over HTTPS, on the TLS
/// listener, with a CA of the test's own.
#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_host_mode() {
    python_host_mode(e2b::PYTHON_SDK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_2_45_1_host_mode() {
    python_host_mode("2.45.1").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_2_9_0_host_mode() {
    python_host_mode("2.9.0").await;
}

/// The JS SDK in host mode, as [`python_sdk_host_mode`].
#[tokio::test(flavor = "multi_thread")]
async fn js_sdk_host_mode() {
    js_host_mode(e2b::JS_SDK).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn js_sdk_2_35_0_host_mode() {
    js_host_mode("2.35.0").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn js_sdk_2_9_0_host_mode() {
    js_host_mode("2.9.0").await;
}

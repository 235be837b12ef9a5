//! Servers with the E2B-compatible API on, and the environment the pinned E2B SDKs need to
//! reach them (`tests/e2b`, installed by `scripts/e2b-sdks`).

use std::path::PathBuf;
use std::sync::Arc;

use space_e2b::{E2bApi, E2bConfig};

use crate::TestServer;

/// The domain test sandboxes' hosts are named under (`{port}-{id}.space.test:{server port}`);
/// nothing resolves it: tests send the host in a header to 127.0.0.1.
pub const TEST_DOMAIN: &str = "space.test";
/// The upload limit of E2B test servers: small, so the limit's tests are cheap, and below
/// the most the server reads of an oversized upload before it answers 413
/// (`space_control::api::files::MAX_DRAIN_BYTES`): past that it answers at once and closes,
/// and a client that does not read early answers sees a reset instead.
pub const TEST_MAX_UPLOAD_BYTES: u64 = 4 << 20;

/// A test server that also serves the E2B API, with a small upload limit.
pub async fn start_server() -> TestServer {
    TestServer::start_with(|cfg| {
        cfg.max_upload_bytes = TEST_MAX_UPLOAD_BYTES;
        cfg.surface = Some(Arc::new(E2bApi::new(E2bConfig {
            domain: TEST_DOMAIN.to_owned(),
            private_ports: false,
        })));
    })
    .await
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python of the SDK virtualenv that `scripts/e2b-sdks` makes.
pub fn python() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("e2b/py/bin/python")
}

/// The environment variables the SDK suites read (`tests/e2b/README.md`): the SDKs' own,
/// pointed at `server`, plus SPACE's test settings. `other_key` is an API key of a second
/// tenant.
pub fn sdk_env(server: &TestServer, other_key: &str) -> Vec<(String, String)> {
    let url = server.url();
    let port = server.server().addr().port();
    [
        ("E2B_API_KEY", server.api_key.clone()),
        ("E2B_API_URL", url.clone()),
        ("E2B_SANDBOX_URL", url.clone()),
        ("E2B_DOMAIN", format!("{TEST_DOMAIN}:{port}")),
        ("SPACE_E2B_URL", url),
        ("SPACE_E2B_TEMPLATE", crate::TEST_TEMPLATE.to_owned()),
        ("SPACE_E2B_OTHER_API_KEY", other_key.to_owned()),
        (
            "SPACE_E2B_MAX_UPLOAD_BYTES",
            TEST_MAX_UPLOAD_BYTES.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

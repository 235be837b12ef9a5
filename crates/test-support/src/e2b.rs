//! Servers with the E2B-compatible API on, and the environment the pinned E2B SDKs need to
//! reach them (`tests/e2b`, installed by `scripts/e2b-sdks`).

use std::path::{Path, PathBuf};
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
    start(None).await
}

/// [`start_server`], with a TLS listener too when `tls` says so.
async fn start(tls: Option<space_control::tls::TlsListen>) -> TestServer {
    TestServer::start_with(|cfg| {
        cfg.max_upload_bytes = TEST_MAX_UPLOAD_BYTES;
        cfg.tls = tls;
        cfg.surface = Some(Arc::new(E2bApi::new(E2bConfig {
            domain: TEST_DOMAIN.to_owned(),
            ..E2bConfig::default()
        })));
    })
    .await
}

/// The files of a test CA and of a certificate for `*.space.test` it signed, in a directory.
pub struct TestCertificates {
    /// The CA certificate (what clients trust: `SSL_CERT_FILE`).
    pub ca: PathBuf,
    /// The server's certificate chain (leaf, then CA).
    pub chain: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

/// Makes a CA and a wildcard certificate for [`TEST_DOMAIN`] (and the name itself) signed by
/// it, as PEM files in `dir`.
pub fn test_certificates(dir: &Path) -> TestCertificates {
    test_certificates_for(dir, &[&format!("*.{TEST_DOMAIN}"), TEST_DOMAIN])
}

/// Makes a CA and a certificate for `names` (DNS names or IP addresses) signed by it, as PEM
/// files in `dir`.
pub fn test_certificates_for(dir: &Path, names: &[&str]) -> TestCertificates {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "SPACE test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .expect("server params");
    let leaf = params
        .signed_by(&key, &ca, &ca_key)
        .expect("server certificate");
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write a PEM file");
        path
    };
    TestCertificates {
        ca: write("ca.pem", ca.pem()),
        chain: write("chain.pem", format!("{}{}", leaf.pem(), ca.pem())),
        key: write("key.pem", key.serialize_pem()),
    }
}

/// [`start_server`] with a TLS listener too, presenting `certs`.
pub async fn start_tls_server(certs: &TestCertificates) -> TestServer {
    start(Some(space_control::tls::TlsListen {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        cert: certs.chain.clone(),
        key: certs.key.clone(),
    }))
    .await
}

/// The environment of the host-mode suites (`tests/e2b/host_mode`, `tests/e2b/js/host_mode`): the SDKs' own without
/// `E2B_SANDBOX_URL`, so they reach envd at `https://49983-{id}.{domain}` on the TLS
/// listener, and trust `ca` for it.
pub fn host_mode_env(server: &TestServer, ca: &Path, sdk_version: &str) -> Vec<(String, String)> {
    let tls_port = server
        .server()
        .tls_addr()
        .expect("a server with a TLS listener")
        .port();
    [
        ("E2B_API_KEY", e2b_key(&server.api_key)),
        ("SPACE_E2B_SDK_VERSION", sdk_version.to_owned()),
        ("E2B_API_URL", server.url()),
        ("E2B_DOMAIN", format!("{TEST_DOMAIN}:{tls_port}")),
        // The CA: the Python SDK's transport (rustls-native-certs) and node read these.
        ("SSL_CERT_FILE", ca.display().to_string()),
        ("NODE_EXTRA_CA_CERTS", ca.display().to_string()),
        ("SPACE_E2B_TEMPLATE", crate::TEST_TEMPLATE.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The E2B Python SDK release the suites are written against (the newest pinned).
pub const PYTHON_SDK: &str = "2.63.0";
/// The E2B JS SDK release the suites are written against (the newest pinned).
pub const JS_SDK: &str = "2.51.0";

/// The Python of the virtualenv `scripts/e2b-sdks` makes for E2B Python SDK `version`
/// (`tests/e2b/py/requirements/e2b-<version>.txt`).
pub fn python(version: &str) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("e2b/py")
        .join(version)
        .join("bin/python")
}

/// The key of `server` in the format every E2B SDK release accepts (`e2b_<hex>`).
pub fn e2b_key(key: &str) -> String {
    space_control::keys::in_format(key, space_control::keys::KeyFormat::E2b)
        .expect("a well-formed API key")
}

/// The environment variables the SDK suites read (`tests/e2b/README.md`): the SDKs' own,
/// pointed at `server`, plus SPACE's test settings. `other_key` is an API key of a second
/// tenant; `sdk_version` the release the suite must find installed (it checks). Keys are
/// given in the E2B format, which every release accepts.
pub fn sdk_env(server: &TestServer, other_key: &str, sdk_version: &str) -> Vec<(String, String)> {
    let url = server.url();
    let port = server.server().addr().port();
    [
        ("E2B_API_KEY", e2b_key(&server.api_key)),
        ("SPACE_E2B_SDK_VERSION", sdk_version.to_owned()),
        ("E2B_API_URL", url.clone()),
        ("E2B_SANDBOX_URL", url.clone()),
        ("E2B_DOMAIN", format!("{TEST_DOMAIN}:{port}")),
        ("SPACE_E2B_URL", url),
        ("SPACE_E2B_TEMPLATE", crate::TEST_TEMPLATE.to_owned()),
        ("SPACE_E2B_OTHER_API_KEY", e2b_key(other_key)),
        (
            "SPACE_E2B_MAX_UPLOAD_BYTES",
            TEST_MAX_UPLOAD_BYTES.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

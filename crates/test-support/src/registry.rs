//! A real OCI registry for the template tests: Debian's `docker-registry` (the CNCF
//! distribution project's registry), on loopback with TLS from a test CA and basic auth
//! from an htpasswd file (`htpasswd` from apache2-utils). `scripts/test` installs both.
//! Images are pushed with the registry HTTP API itself (monolithic blob uploads, then the
//! manifest), as any client would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::images::{digest, Image};

/// The user and password the registry accepts.
pub const USER: &str = "builder";
/// Its password.
pub const PASSWORD: &str = "s3cret-registry-pw";

/// A running registry, stopped when dropped.
pub struct TestRegistry {
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The CA its certificate is signed by (PEM).
    pub ca: PathBuf,
    /// A Docker-style auth file with the right credentials.
    pub auth_file: PathBuf,
    dir: tempfile::TempDir,
    child: Child,
    http: reqwest::Client,
}

impl TestRegistry {
    /// Starts one (panics if the packages are missing: `scripts/test` installs them).
    pub async fn start() -> TestRegistry {
        let dir = tempfile::tempdir().expect("registry dir");
        let d = dir.path();
        let certs = crate::e2b::test_certificates_for(d, &["localhost", "127.0.0.1"]);
        let htpasswd = d.join("htpasswd");
        let ok = Command::new("htpasswd")
            .args(["-Bbc"])
            .arg(&htpasswd)
            .args([USER, PASSWORD])
            .stderr(Stdio::null())
            .status()
            .expect("htpasswd (apache2-utils)")
            .success();
        assert!(ok, "htpasswd failed");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let host = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {data}\n\
             http:\n  addr: {host}\n  tls:\n    certificate: {cert}\n    key: {key}\n\
             auth:\n  htpasswd:\n    realm: space-test\n    path: {htpasswd}\n",
            data = d.join("data").display(),
            cert = certs.chain.display(),
            key = certs.key.display(),
            htpasswd = htpasswd.display(),
        );
        std::fs::write(d.join("config.yml"), config).expect("config");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(d.join("log")).expect("log"),
            ))
            .spawn()
            .expect("docker-registry (Debian package docker-registry)");
        let auth = {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
        };
        let auth_file = d.join("auth.json");
        std::fs::write(
            &auth_file,
            format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#),
        )
        .expect("auth file");
        let ca_pem = std::fs::read(&certs.ca).expect("ca");
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca_pem).expect("ca"))
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let registry = TestRegistry {
            host,
            ca: certs.ca,
            auth_file,
            dir,
            child,
            http,
        };
        // Up once /v2/ answers (401 without credentials).
        crate::wait_until(
            Duration::from_secs(30),
            "the registry to listen",
            || async {
                registry
                    .http
                    .get(format!("https://{}/v2/", registry.host))
                    .send()
                    .await
                    .ok()
                    .map(|_| ())
            },
        )
        .await;
        registry
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Where it keeps its data.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    async fn put_blob(&self, repo: &str, bytes: &[u8]) {
        let d = digest(bytes);
        let start = self
            .http
            .post(format!("https://{}/v2/{repo}/blobs/uploads/", self.host))
            .basic_auth(USER, Some(PASSWORD))
            .send()
            .await
            .expect("start upload");
        assert_eq!(
            start.status(),
            202,
            "start upload: {:?}",
            start.text().await
        );
        let location = start
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .expect("upload location")
            .to_owned();
        let url = if location.starts_with("http") {
            location
        } else {
            format!("https://{}{location}", self.host)
        };
        let sep = if url.contains('?') { '&' } else { '?' };
        let put = self
            .http
            .put(format!("{url}{sep}digest={d}"))
            .basic_auth(USER, Some(PASSWORD))
            .header("content-type", "application/octet-stream")
            .body(bytes.to_vec())
            .send()
            .await
            .expect("upload");
        assert_eq!(put.status(), 201, "upload: {:?}", put.text().await);
    }

    async fn put_manifest(&self, repo: &str, reference: &str, media_type: &str, bytes: &[u8]) {
        let put = self
            .http
            .put(format!(
                "https://{}/v2/{repo}/manifests/{reference}",
                self.host
            ))
            .basic_auth(USER, Some(PASSWORD))
            .header("content-type", media_type)
            .body(bytes.to_vec())
            .send()
            .await
            .expect("manifest");
        assert_eq!(put.status(), 201, "manifest: {:?}", put.text().await);
    }

    /// Pushes `image` as `repo:tag`; returns its manifest's digest.
    pub async fn push(&self, repo: &str, tag: &str, image: &Image) -> String {
        let b = image.blobs();
        self.put_blob(repo, &b.config).await;
        for l in &b.layers {
            self.put_blob(repo, l).await;
        }
        self.put_manifest(
            repo,
            tag,
            "application/vnd.oci.image.manifest.v1+json",
            &b.manifest,
        )
        .await;
        digest(&b.manifest)
    }

    /// Pushes `image` as the linux/amd64 entry of a multi-platform index `repo:tag`, beside
    /// an arm64 entry that is the same manifest (a builder picking the wrong one would still
    /// find blobs, but a wrong platform).
    pub async fn push_index(&self, repo: &str, tag: &str, image: &Image) {
        let manifest_digest = self.push(repo, &format!("{tag}-amd64"), image).await;
        let size = image.blobs().manifest.len();
        let entry = |arch: &str| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": size,
                "platform": {"os": "linux", "architecture": arch},
            })
        };
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [entry("arm64"), entry("amd64")],
        }))
        .expect("json");
        self.put_manifest(repo, tag, "application/vnd.oci.image.index.v1+json", &index)
            .await;
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

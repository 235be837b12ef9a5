//! Real key services for the customer-key tests, installed by `scripts/kms-test-servers`:
//! - [`KmipServer`]: PyKMIP's KMIP server on loopback, mutual TLS with a CA of the test's
//!   own; keys are made, revoked and destroyed with PyKMIP's client
//!   (`tests/kms/kmip_admin.py`), the customer's side;
//! - [`SoftHsm`]: a SoftHSM2 token directory; tokens made with `softhsm2-util`, keys made
//!   and destroyed with OpenSC's `pkcs11-tool`, the customer's side.
//!
//! `SPACE_TEST_PYKMIP` names PyKMIP's venv (else `target/kms/pykmip`).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// SoftHSM2's PKCS#11 module, as Debian installs it.
pub const SOFTHSM_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pykmip_dir() -> PathBuf {
    std::env::var_os("SPACE_TEST_PYKMIP")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/kms/pykmip"))
}

/// A client identity of the test CA: PEM certificate and key.
#[derive(Clone)]
pub struct Identity {
    /// The certificate (PEM).
    pub certificate_pem: String,
    /// Its private key (PEM).
    pub private_key_pem: String,
    cert_file: PathBuf,
    key_file: PathBuf,
}

/// A PyKMIP server, stopped on drop.
pub struct KmipServer {
    child: Child,
    dir: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The CA file that its certificate (and every client's) chains to.
    pub ca_file: PathBuf,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl Drop for KmipServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl KmipServer {
    /// Starts a server with a fresh CA and database; waits until it accepts connections.
    pub fn start() -> KmipServer {
        let dir = tempfile::tempdir().expect("temporary directory");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "space test KMIP CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).expect("write CA");
        let mut server = KmipServer {
            child: Command::new("true").spawn().expect("placeholder"),
            port: free_port(),
            ca_file,
            ca,
            ca_key,
            dir,
        };
        let _ = server.child.wait();
        let server_id = server.issue("localhost", &["localhost", "127.0.0.1"]);
        let conf = server.dir.path().join("server.conf");
        std::fs::create_dir_all(server.dir.path().join("policies")).expect("policy dir");
        std::fs::write(
            &conf,
            format!(
                "[server]\nhostname=127.0.0.1\nport={port}\ncertificate_path={cert}\nkey_path={key}\n\
                 ca_path={ca}\nauth_suite=TLS1.2\npolicy_path={dir}/policies\n\
                 enable_tls_client_auth=True\nlogging_level=INFO\ndatabase_path={dir}/pykmip.db\n",
                port = server.port,
                cert = server_id.cert_file.display(),
                key = server_id.key_file.display(),
                ca = server.ca_file.display(),
                dir = server.dir.path().display(),
            ),
        )
        .expect("write server.conf");
        let log = std::fs::File::create(server.dir.path().join("server.out")).expect("log");
        server.child = Command::new(pykmip_dir().join("bin/pykmip-server"))
            .arg("-f")
            .arg(&conf)
            .arg("-l")
            .arg(server.dir.path().join("server.log"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start pykmip-server (install it with scripts/kms-test-servers)");
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", server.port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("pykmip-server exited ({status}): {}", server.output());
            }
            assert!(
                Instant::now() < deadline,
                "pykmip-server did not listen in time"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// What the server wrote (for failure messages).
    pub fn output(&self) -> String {
        let read = |n: &str| std::fs::read_to_string(self.dir.path().join(n)).unwrap_or_default();
        format!("{}\n{}", read("server.out"), read("server.log"))
    }

    /// A certificate of the test CA for `common_name` (a KMIP identity: PyKMIP's owner of the
    /// keys it creates), with `dns` names (for a server).
    pub fn issue(&self, common_name: &str, dns: &[&str]) -> Identity {
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(dns.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = if dns.is_empty() {
            vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth]
        };
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("certificate");
        let cert_file = self.dir.path().join(format!("{common_name}.pem"));
        let key_file = self.dir.path().join(format!("{common_name}.key"));
        std::fs::write(&cert_file, cert.pem()).expect("write certificate");
        std::fs::write(&key_file, key.serialize_pem()).expect("write key");
        Identity {
            certificate_pem: cert.pem(),
            private_key_pem: key.serialize_pem(),
            cert_file,
            key_file,
        }
    }

    fn admin(&self, who: &Identity, args: &[&str]) -> String {
        let out = Command::new(pykmip_dir().join("bin/python"))
            .arg(repo().join("tests/kms/kmip_admin.py"))
            .arg(self.port.to_string())
            .arg(&self.ca_file)
            .arg(&who.cert_file)
            .arg(&who.key_file)
            .args(args)
            .output()
            .expect("run kmip_admin.py");
        assert!(
            out.status.success(),
            "kmip_admin {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.output()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Makes an active AES-256 key owned by `who` (usable for Encrypt and Decrypt); its id.
    pub fn create_key(&self, who: &Identity) -> String {
        self.admin(who, &["create"])
    }

    /// Revokes key `id` (it becomes Deactivated).
    pub fn revoke_key(&self, who: &Identity, id: &str) {
        self.admin(who, &["revoke", id]);
    }

    /// Destroys key `id`.
    pub fn destroy_key(&self, who: &Identity, id: &str) {
        self.admin(who, &["destroy", id]);
    }

    /// The server's `host:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// A SoftHSM2 token directory and the configuration that points at it. The configuration is
/// found through `SOFTHSM2_CONF`, which [`SoftHsm::create`] sets for this process (a test
/// process of its own under nextest) before any module is loaded.
pub struct SoftHsm {
    dir: tempfile::TempDir,
    /// The configuration file.
    pub conf: PathBuf,
}

impl SoftHsm {
    /// An empty token directory; sets `SOFTHSM2_CONF` for this process.
    pub fn create() -> SoftHsm {
        let dir = tempfile::tempdir().expect("temporary directory");
        let tokens = dir.path().join("tokens");
        std::fs::create_dir_all(&tokens).expect("token dir");
        let conf = dir.path().join("softhsm2.conf");
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                tokens.display()
            ),
        )
        .expect("write softhsm2.conf");
        // Before any thread of the test loads the module.
        std::env::set_var("SOFTHSM2_CONF", &conf);
        SoftHsm { dir, conf }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = Command::new(program)
            .args(args)
            .env("SOFTHSM2_CONF", &self.conf)
            .output()
            .unwrap_or_else(|e| {
                panic!("{program} (install it with scripts/kms-test-servers): {e}")
            });
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Makes a token `label` with user PIN `pin`.
    pub fn init_token(&self, label: &str, pin: &str) {
        self.run(
            "softhsm2-util",
            &[
                "--init-token",
                "--free",
                "--label",
                label,
                "--pin",
                pin,
                "--so-pin",
                "0000-so",
            ],
        );
    }

    /// OpenSC's `pkcs11-tool` on token `token`, logged in with `pin`.
    fn pkcs11_tool(&self, token: &str, pin: &str, args: &[&str]) {
        let mut all = vec![
            "--module",
            SOFTHSM_MODULE,
            "--token-label",
            token,
            "--login",
            "--pin",
            pin,
        ];
        all.extend_from_slice(args);
        self.run("pkcs11-tool", &all);
    }

    /// Makes an AES-256 secret key `label` on token `token` (sensitive, not extractable).
    pub fn create_key(&self, token: &str, pin: &str, label: &str) {
        self.pkcs11_tool(
            token,
            pin,
            &[
                "--keygen",
                "--key-type",
                "AES:32",
                "--label",
                label,
                "--sensitive",
            ],
        );
    }

    /// Destroys secret key `label` on token `token`.
    pub fn destroy_key(&self, token: &str, pin: &str, label: &str) {
        self.pkcs11_tool(
            token,
            pin,
            &["--delete-object", "--type", "secrkey", "--label", label],
        );
    }

    /// The token directory (to search it in tests).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

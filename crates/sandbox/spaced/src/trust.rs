//! The sandbox CA in the guest's trust store. The node's gateway terminates TLS towards
//! hosts whose requests it must inspect or inject credentials into, with certificates signed
//! by a CA of this sandbox; programs in the guest verify them only if they trust that CA.
//!
//! The certificate goes where Debian's `update-ca-certificates` looks for local CAs, and is
//! added to the bundle most TLS libraries read, `/etc/ssl/certs/ca-certificates.crt`, as one
//! marked block (replaced, never accumulated, when the node sends another). Runtimes with
//! bundles of their own (Python's requests/certifi, Node.js) are pointed at it through their
//! environment variables: [`TRUST_ENV`].

use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Where the certificate is written for `update-ca-certificates`.
pub const LOCAL_CA_FILE: &str = "/usr/local/share/ca-certificates/space-sandbox.crt";
/// The system bundle the block is added to.
pub const BUNDLE_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Defaults for every process (a request's own env wins): the runtimes that ignore the
/// system bundle read these.
pub const TRUST_ENV: &[(&str, &str)] = &[
    ("SSL_CERT_FILE", BUNDLE_FILE),
    ("REQUESTS_CA_BUNDLE", BUNDLE_FILE),
    ("CURL_CA_BUNDLE", BUNDLE_FILE),
    ("NODE_EXTRA_CA_CERTS", LOCAL_CA_FILE),
];

const BEGIN_MARK: &str = "# space-sandbox-ca begin";
const END_MARK: &str = "# space-sandbox-ca end";
/// Largest bundle we rewrite (Debian's is about 220 KB).
const MAX_BUNDLE_BYTES: u64 = 16 * 1024 * 1024;

/// `bundle` with our marked block replaced by `pem` (or added at the end). Text outside
/// PEM blocks is ignored by every PEM reader, so the markers are harmless.
pub fn bundle_with_ca(bundle: &str, pem: &str) -> String {
    let mut out = String::with_capacity(bundle.len() + pem.len() + 64);
    let mut inside = false;
    for line in bundle.lines() {
        match line {
            BEGIN_MARK => inside = true,
            END_MARK => inside = false,
            _ if !inside => {
                out.push_str(line);
                out.push('\n');
            }
            _ => {}
        }
    }
    out.push_str(BEGIN_MARK);
    out.push('\n');
    out.push_str(pem.trim_end());
    out.push('\n');
    out.push_str(END_MARK);
    out.push('\n');
    out
}

/// Installs `pem` (validated by the caller) in the trust store. Blocking: the root disk
/// may be frozen. Files are replaced atomically, so a reader never sees half a bundle.
pub fn install(pem: &str) -> io::Result<()> {
    let local = Path::new(LOCAL_CA_FILE);
    if let Some(dir) = local.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_atomically(local, pem.as_bytes())?;
    let mut bundle = String::new();
    match std::fs::File::open(BUNDLE_FILE) {
        Ok(f) => {
            f.take(MAX_BUNDLE_BYTES).read_to_string(&mut bundle)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all("/etc/ssl/certs")?;
        }
        Err(e) => return Err(e),
    }
    write_atomically(
        Path::new(BUNDLE_FILE),
        bundle_with_ca(&bundle, pem).as_bytes(),
    )
}

fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("space-tmp");
    std::fs::write(&tmp, bytes)?;
    // World-readable like the rest of the trust store: every user's programs verify TLS.
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    const B: &str = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----";

    #[test]
    fn the_block_is_added_once_and_replaced() {
        let system = "-----BEGIN CERTIFICATE-----\nSYS\n-----END CERTIFICATE-----\n";
        let once = bundle_with_ca(system, A);
        assert!(once.starts_with(system));
        assert_eq!(once.matches("AAAA").count(), 1);
        let again = bundle_with_ca(&once, A);
        assert_eq!(again, once, "installing the same CA twice changes nothing");
        let other = bundle_with_ca(&once, B);
        assert!(!other.contains("AAAA") && other.contains("BBBB") && other.contains("SYS"));
        assert_eq!(other.matches(BEGIN_MARK).count(), 1);
        assert!(bundle_with_ca("", A).starts_with(BEGIN_MARK));
    }
}

//! The cluster CA on a control-plane host: made once by `space cluster init`, read by every
//! replica at start (the operator gives each replica the same directory), and the
//! identities a replica issues itself from it: its client certificate towards node agents
//! and the server certificate of its cluster listener. Both live in memory only and are
//! issued again at each start.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_node_proto::identity::{
    client_config, cluster_server_config, ClusterCa, IdentityError, PeerRole, PEER_VALIDITY,
};

/// The CA's certificate in the cluster directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key in the cluster directory (0600).
pub const CA_KEY_FILE: &str = "ca.key";
/// The key API surfaces sign their tokens with, the same on every replica (0600): the E2B
/// surface's envd and traffic tokens, handed out by one replica, verified by any.
pub const SHARED_TOKEN_KEY_FILE: &str = "token.key";
/// The key every replica seals credential values with in the catalog (made by `space
/// cluster init`, like the token key: every replica must have the same one).
pub const CREDENTIAL_KEY_FILE: &str = "credentials.key";

/// Why the cluster directory cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `space cluster init` on a directory that has a CA already.
    #[error("{0} already holds a cluster CA (remove it to start a new cluster; `space cluster init --add-keys` adds the shared keys it lacks)")]
    Exists(PathBuf),
    /// A key the replicas share is missing from the cluster directory.
    #[error("{0} is missing: run `space cluster init --add-keys --dir DIR` on one host and copy the directory to every replica")]
    MissingSharedKey(PathBuf),
    /// The key can be read by others than its owner: it may be known.
    #[error("{path} has mode {mode:04o}: the cluster CA key must be readable by its owner only (chmod 600)")]
    KeyExposed {
        /// The key file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// The CA or an identity from it is unusable.
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AuthorityError + '_ {
    move |source| AuthorityError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The keys every replica shares, made with the CA.
pub const SHARED_KEY_FILES: &[&str] = &[SHARED_TOKEN_KEY_FILE, CREDENTIAL_KEY_FILE];

/// Makes a new cluster CA in `dir` (created 0700 if missing) with the keys the replicas
/// share; refuses a directory that has a CA. Returns the CA.
pub fn init(dir: &Path) -> Result<ClusterCa, AuthorityError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    let (cert_path, key_path) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
    if key_path.exists() || cert_path.exists() {
        return Err(AuthorityError::Exists(dir.to_owned()));
    }
    let ca = ClusterCa::generate()?;
    let id = ca.identity();
    // The key first, exclusively and private from its first byte.
    let mut key = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key_path)
        .map_err(io(&key_path))?;
    key.write_all(id.key_pem.as_bytes())
        .and_then(|()| key.sync_all())
        .map_err(io(&key_path))?;
    std::fs::write(&cert_path, id.cert_pem.as_bytes()).map_err(io(&cert_path))?;
    add_shared_keys(dir)?;
    Ok(ca)
}

/// Makes the shared keys `dir` lacks (a cluster directory made by an older version has no
/// credential key); keeps the ones it has. Returns the names of those it made. Run it on
/// one host and copy the directory to every replica: they must share the same keys.
pub fn add_shared_keys(dir: &Path) -> Result<Vec<&'static str>, AuthorityError> {
    let mut made = Vec::new();
    for name in SHARED_KEY_FILES {
        let path = dir.join(name);
        if path.exists() {
            continue;
        }
        space_secrets::keyfile::load_or_create_key(&path).map_err(|e| AuthorityError::Io {
            path: path.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        made.push(*name);
    }
    Ok(made)
}

/// A key every replica shares, from `dir`; a missing one is refused (each replica making
/// its own would split the cluster).
pub fn shared_key(
    dir: &Path,
    name: &str,
) -> Result<space_secrets::keyfile::KeyBytes, AuthorityError> {
    let path = dir.join(name);
    if !path.exists() {
        return Err(AuthorityError::MissingSharedKey(path));
    }
    space_secrets::keyfile::load_key(&path).map_err(|e| AuthorityError::Io {
        path: path.clone(),
        source: std::io::Error::other(e.to_string()),
    })
}

/// Reads the cluster CA of `dir`.
pub fn load(dir: &Path) -> Result<ClusterCa, AuthorityError> {
    let (cert_path, key_path) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
    let mode = std::fs::metadata(&key_path)
        .map_err(io(&key_path))?
        .permissions()
        .mode()
        & 0o7777;
    if mode & 0o077 != 0 {
        return Err(AuthorityError::KeyExposed {
            path: key_path,
            mode,
        });
    }
    let cert = std::fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
    let key = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
    Ok(ClusterCa::from_pem(&cert, &key)?)
}

/// What a replica holds of the cluster CA.
#[derive(Clone)]
pub struct Authority {
    /// The CA (signs joining nodes' certificates).
    pub ca: Arc<ClusterCa>,
    /// Dials node agents as the control plane.
    pub dialer: Arc<rustls::ClientConfig>,
    /// The cluster listener's TLS.
    pub listener: Arc<rustls::ServerConfig>,
}

impl Authority {
    /// Issues this replica's identities from `ca`.
    pub fn new(ca: ClusterCa) -> Result<Authority, AuthorityError> {
        let me = ca.issue(&PeerRole::ControlPlane, PEER_VALIDITY)?;
        let dialer = Arc::new(client_config(&me, ca.cert_pem())?);
        let listener = Arc::new(cluster_server_config(&me, ca.cert_pem())?);
        Ok(Authority {
            ca: Arc::new(ca),
            dialer,
            listener,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_directory_is_made_once_and_its_key_kept_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cluster");
        let ca = init(&dir).unwrap();
        assert!(matches!(init(&dir), Err(AuthorityError::Exists(_))));
        let again = load(&dir).unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());
        let key = dir.join(CA_KEY_FILE);
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            load(&dir),
            Err(AuthorityError::KeyExposed { mode: 0o640, .. })
        ));
        assert!(Authority::new(again).is_ok());
        assert!(space_secrets::keyfile::load_key(&dir.join(SHARED_TOKEN_KEY_FILE)).is_ok());
    }
}

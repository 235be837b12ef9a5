//! Each sandbox's CA, kept for the sandbox's life. The guest trusts it once (written into its
//! trust store at create), and that trust lives on its disk and in its checkpoints, so the
//! gateway must sign with the same CA after every restart, restore and node restart; a fork
//! starts from its parent's disk and memory, so it gets a copy of its parent's CA.
//!
//! One file per sandbox, `<data_dir>/sandbox-ca/<id>.pem`: the certificate, then the private
//! key, mode 0600. The keys are node secrets like the credential key: they never enter a
//! guest and are removed with the sandbox. A persistent snapshot keeps a copy (in its
//! `source.json`, mode 0600), which sandboxes created from it get.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_core::SandboxId;
use space_net::ca::SandboxCa;

use crate::sandbox_manager::internal;
use crate::NodeError;

/// Largest CA file read back (a P-256 CA and key take about 1 KiB).
const MAX_CA_FILE: u64 = 64 * 1024;

/// The directory of sandbox CA files.
#[derive(Debug, Clone)]
pub(crate) struct CaStore {
    dir: PathBuf,
}

impl CaStore {
    /// Opens (creating, mode 0700) `dir`.
    pub(crate) fn open(dir: &Path) -> Result<CaStore, NodeError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| internal("sandbox CA: cannot create its directory", e))?;
        Ok(CaStore {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(format!("{id}.pem"))
    }

    /// The sandbox's CA, generated and saved on first use. Blocking (small file I/O).
    pub(crate) fn load_or_create(&self, id: &SandboxId) -> Result<Arc<SandboxCa>, NodeError> {
        if let Some(ca) = self.load(id)? {
            return Ok(Arc::new(ca));
        }
        let ca = SandboxCa::generate(&format!("SPACE sandbox {id}"))
            .map_err(|e| internal("sandbox CA: cannot generate", e))?;
        let (cert, key) = ca.to_pem_pair();
        self.write(id, &format!("{cert}{key}"))?;
        Ok(Arc::new(ca))
    }

    fn load(&self, id: &SandboxId) -> Result<Option<SandboxCa>, NodeError> {
        self.pem(id)?.as_deref().map(parse_pem_pair).transpose()
    }

    /// The sandbox's CA file as it is stored (certificate, then key), if it has one: what a
    /// persistent snapshot keeps, since the trust store on its disk and in its memory holds
    /// this CA.
    pub(crate) fn pem(&self, id: &SandboxId) -> Result<Option<String>, NodeError> {
        use std::io::Read;
        let mut text = String::new();
        match std::fs::File::open(self.path(id)) {
            Ok(f) => f
                .take(MAX_CA_FILE)
                .read_to_string(&mut text)
                .map_err(|e| internal("sandbox CA: cannot read", e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(internal("sandbox CA: cannot open", e)),
        };
        Ok(Some(text))
    }

    /// Gives `id` (a sandbox created from a persistent snapshot) the CA `pem` that the
    /// snapshot kept (as [`CaStore::pem`] returned it), checked to be usable first.
    pub(crate) fn install(&self, id: &SandboxId, pem: &str) -> Result<(), NodeError> {
        parse_pem_pair(pem)?;
        self.write(id, pem)
    }

    /// Gives `child` (a fork) the CA of `parent`, whose trust the child's disk inherited.
    pub(crate) fn copy(&self, parent: &SandboxId, child: &SandboxId) -> Result<(), NodeError> {
        match std::fs::read_to_string(self.path(parent)) {
            Ok(text) => self.write(child, &text),
            // A parent from before CAs were kept: the child gets its own at first use.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(internal("sandbox CA: cannot read the parent's", e)),
        }
    }

    /// Removes the sandbox's CA (no-op if it has none).
    pub(crate) fn remove(&self, id: &SandboxId) {
        match std::fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(%id, error = %e, "cannot remove the sandbox CA")
            }
            _ => {}
        }
    }

    /// Writes atomically, mode 0600 from the start (the key is never world-readable).
    fn write(&self, id: &SandboxId, text: &str) -> Result<(), NodeError> {
        let tmp = self.dir.join(format!(".{id}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| internal("sandbox CA: cannot create", e))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| internal("sandbox CA: cannot write", e))?;
        std::fs::rename(&tmp, self.path(id)).map_err(|e| internal("sandbox CA: cannot rename", e))
    }
}

/// The CA in a file's text (the certificate block, then the key block).
fn parse_pem_pair(text: &str) -> Result<SandboxCa, NodeError> {
    let (cert, key) = split_pem_pair(text).ok_or_else(|| {
        internal(
            "sandbox CA: unreadable file",
            "want a certificate then a key",
        )
    })?;
    SandboxCa::from_pem_pair(cert, key).map_err(|e| internal("sandbox CA: unusable file", e))
}

/// `(certificate PEM, key PEM)` from a file holding the certificate block then the key block.
fn split_pem_pair(text: &str) -> Option<(&str, &str)> {
    const CERT_END: &str = "-----END CERTIFICATE-----";
    let mut at = text.find(CERT_END)? + CERT_END.len();
    // The certificate keeps its line end, as it was written.
    if text[at..].starts_with('\n') {
        at += 1;
    }
    let (cert, key) = text.split_at(at);
    let key = key.trim_start();
    key.starts_with("-----BEGIN PRIVATE KEY-----")
        .then_some((cert, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_keeps_its_ca_and_a_fork_gets_a_copy() {
        let dir = tempfile::tempdir().unwrap();
        let store = CaStore::open(&dir.path().join("ca")).unwrap();
        let (a, b) = (SandboxId::generate(), SandboxId::generate());
        let first = store.load_or_create(&a).unwrap();
        let again = store.load_or_create(&a).unwrap();
        assert_eq!(first.cert_pem(), again.cert_pem(), "the same CA every time");
        let meta = std::fs::metadata(store.path(&a)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o600
        );
        store.copy(&a, &b).unwrap();
        assert_eq!(
            store.load_or_create(&b).unwrap().cert_pem(),
            first.cert_pem()
        );
        // What a persistent snapshot keeps gives a new sandbox the same CA.
        let kept = store.pem(&a).unwrap().expect("a has a CA");
        let c = SandboxId::generate();
        store.install(&c, &kept).unwrap();
        assert_eq!(
            store.load_or_create(&c).unwrap().cert_pem(),
            first.cert_pem()
        );
        assert!(store.install(&c, "junk").is_err());
        assert_eq!(store.pem(&SandboxId::generate()).unwrap(), None);
        store.remove(&a);
        store.remove(&a);
        assert_ne!(
            store.load_or_create(&a).unwrap().cert_pem(),
            first.cert_pem()
        );
        std::fs::write(store.path(&b), "junk").unwrap();
        assert!(
            store.load_or_create(&b).is_err(),
            "a damaged file is an error, not a new CA"
        );
    }
}

//! Object keys and where things go in the store.
//!
//! A key is `/`-separated components of `[A-Za-z0-9._-]`, none empty, `.` or `..`, at
//! most [`MAX_KEY_LEN`] bytes: the same key names the same object on S3 and in a local
//! directory, and no key can leave the store's root. The layout:
//!
//! ```text
//! snapshots/<snapshot id>/<artifact>     a suspended sandbox's snapshot (memory, state, disk delta, …)
//! templates/<digest>/<file>              a published template (rootfs.ext4.zst, then template.json)
//! template-names/<name>                  the digest a template name means (the last published)
//! kernels/<digest>/<file>                a published kernel bundle (its files, then kernel.json)
//! build-files/<sha256>                   an archive of files for build steps' COPY (by content)
//! build-file-owners/<tenant>/<sha256>    empty: that tenant uploaded that archive (when)
//! incoming/<random>                      an upload not yet checked against its name
//! e2b-builds/<build id>.json             an E2B template build asked for, not started yet
//! e2b-uploads/<tenant>/<hash>            files the E2B SDK uploaded for a COPY (E2B's hash)
//! ```

use std::fmt;

/// Longest key.
pub const MAX_KEY_LEN: usize = 512;

/// A validated object key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(String);

/// Why a key is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object key {key:?}: {reason}")]
pub struct KeyError {
    key: String,
    reason: &'static str,
}

fn component_ok(c: &str) -> bool {
    !c.is_empty()
        && c != "."
        && c != ".."
        && c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

impl ObjectKey {
    /// A key from its text.
    pub fn parse(s: &str) -> Result<ObjectKey, KeyError> {
        let refuse = |reason| KeyError {
            key: s.chars().take(80).collect(),
            reason,
        };
        if s.len() > MAX_KEY_LEN {
            return Err(refuse("too long"));
        }
        if !s.split('/').all(component_ok) {
            return Err(refuse("components are [A-Za-z0-9._-], not empty, . or .."));
        }
        Ok(ObjectKey(s.to_owned()))
    }

    /// A key from components, each checked.
    pub fn join(parts: &[&str]) -> Result<ObjectKey, KeyError> {
        ObjectKey::parse(&parts.join("/"))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// `snapshots/<snapshot>/<artifact>`.
    pub fn snapshot_artifact(snapshot: &str, artifact: &str) -> Result<ObjectKey, KeyError> {
        ObjectKey::join(&["snapshots", snapshot, artifact])
    }

    /// `snapshots/<snapshot>/`: every artifact of a snapshot.
    pub fn snapshot_prefix(snapshot: &str) -> Result<ObjectKey, KeyError> {
        ObjectKey::join(&["snapshots", snapshot])
    }

    /// `templates/<digest>/<file>`.
    pub fn template_file(digest: &str, file: &str) -> Result<ObjectKey, KeyError> {
        ObjectKey::join(&["templates", digest, file])
    }

    /// Where the digest template name `name` means is kept: `template-names/<NAME>`, or
    /// `template-tags/<NAME>/<TAG>` for `NAME:TAG` (a key component has no `:`, and a
    /// name's key cannot also be a directory of its tags in a local store).
    pub fn template_name(name: &str) -> Result<ObjectKey, KeyError> {
        match name.split_once(':') {
            Some((base, tag)) => ObjectKey::join(&["template-tags", base, tag]),
            None => ObjectKey::join(&["template-names", name]),
        }
    }

    /// `build-files/<sha256>`: a build step's `COPY` archive, named by its content.
    pub fn build_files(sha256: &str) -> Result<ObjectKey, KeyError> {
        ObjectKey::join(&["build-files", sha256])
    }

    /// `build-file-owners/<tenant>/<sha256>`: the mark that `tenant` uploaded the archive.
    pub fn build_files_owner(tenant: &str, sha256: &str) -> Result<ObjectKey, KeyError> {
        ObjectKey::join(&["build-file-owners", tenant, sha256])
    }

    /// `kernels/<digest>/<file>`.
    pub fn kernel_file(digest: &str, file: &str) -> Result<ObjectKey, KeyError> {
        ObjectKey::join(&["kernels", digest, file])
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_inside_the_store() {
        assert!(ObjectKey::parse("snapshots/snp-1/memory.zst").is_ok());
        for bad in [
            "", "/abs", "a//b", "a/../b", "..", "a/./b", "a/b/", "sp ace", "ünï", "a\\b",
        ] {
            assert!(ObjectKey::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ObjectKey::parse(&"a".repeat(MAX_KEY_LEN + 1)).is_err());
        assert!(ObjectKey::snapshot_artifact("snp-1", "../x").is_err());
        assert_eq!(
            ObjectKey::template_file("abc", "rootfs.ext4")
                .unwrap()
                .file_name(),
            "rootfs.ext4"
        );
        assert_eq!(
            ObjectKey::template_name("py").unwrap().as_str(),
            "template-names/py"
        );
        assert_eq!(
            ObjectKey::template_name("py:3.12").unwrap().as_str(),
            "template-tags/py/3.12"
        );
    }
}

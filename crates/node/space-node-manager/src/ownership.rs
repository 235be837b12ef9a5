//! Who owns what on a node run by two processes. The sandbox manager (an unprivileged uid,
//! "the client") owns its files in the data directory and the store's directories it writes:
//! sandboxes, pool members, memory images, records, persistent snapshots and `incoming/`
//! (templates and kernel bundles it fetched, which the node manager installs). The node
//! manager (root) keeps what it opens, mounts or builds jails in: the data directory itself
//! (mode 1770, group the client's: the client makes its own files there, and the sticky bit
//! keeps it from renaming or replacing root's), the store's image and lock, the store's root,
//! templates and kernels, and the run directory. So no symlink of the client's can stand
//! where root creates, mounts or formats; inside the client's directories the node manager
//! acts as the client ([`FileOwner::act_as`]).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use space_storage::Store;
use space_vmm::FileOwner;

use crate::server::ServerError;

const ROOT: FileOwner = FileOwner { uid: 0, gid: 0 };

/// The store's directories the sandbox manager writes itself.
const CLIENT_DIRS: [&str; 6] = [
    "sandboxes",
    "pool",
    "images",
    "records",
    "snapshots",
    space_storage::INCOMING_DIR,
];
/// The store's directories only root writes (an administrator's template builds).
const ROOT_DIRS: [&str; 2] = ["templates", "kernels"];

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ServerError {
    let path = path.to_owned();
    move |source| ServerError::Io { what, path, source }
}

fn unsafe_path(path: &Path, reason: impl Into<String>) -> ServerError {
    ServerError::Unsafe {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// The data directory, made if missing, root's with the client's group (mode 1770); the
/// store and run directories root's (made if missing); the store's image and lock, if there,
/// root's regular files. One that exists must be root's or the client's already: the node
/// manager never takes over a directory it was merely pointed at. Every entry is taken by
/// descriptor, never through a symlink: the client could otherwise aim a mount, or a
/// `mkfs` of the store image, at any path of the host.
pub(crate) fn prepare_data_dir(data_dir: &Path, client: FileOwner) -> Result<(), ServerError> {
    match std::fs::symlink_metadata(data_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(data_dir)
                .map_err(io_err("create", data_dir))?;
        }
        Err(e) => return Err(io_err("inspect", data_dir)(e)),
        Ok(meta) if !meta.is_dir() => return Err(unsafe_path(data_dir, "not a directory")),
        Ok(meta) if meta.uid() != 0 && meta.uid() != client.uid => {
            return Err(unsafe_path(
                data_dir,
                format!(
                    "owned by uid {}, neither root nor the sandbox manager's uid {}",
                    meta.uid(),
                    client.uid
                ),
            ))
        }
        Ok(_) => {}
    }
    FileOwner {
        uid: 0,
        gid: client.gid,
    }
    .give(data_dir, 0o1770)
    .map_err(io_err("take", data_dir))?;
    for dir in ["store", "run"] {
        make_and_take_dir(&data_dir.join(dir), ROOT)?;
    }
    for file in ["store.btrfs", "store.lock"] {
        let path = data_dir.join(file);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if !m.is_file() => return Err(unsafe_path(&path, "not a regular file")),
            Ok(m) => {
                ROOT.give(&path, m.mode() & 0o600)
                    .map_err(|e| unsafe_path(&path, e.to_string()))?;
            }
            Err(_) => {}
        }
    }
    Ok(())
}

/// The store's root and templates and kernels root's; the directories the sandbox manager
/// writes made if missing and handed to it.
pub(crate) fn prepare_store(store: &Store, client: FileOwner) -> Result<(), ServerError> {
    take_dir(store.root(), ROOT)?;
    for (names, owner) in [(&CLIENT_DIRS[..], client), (&ROOT_DIRS[..], ROOT)] {
        for name in names {
            make_and_take_dir(&store.root().join(name), owner)?;
        }
    }
    Ok(())
}

/// `dir`, made if missing, given to `owner` ([`take_dir`]).
fn make_and_take_dir(dir: &Path, owner: FileOwner) -> Result<(), ServerError> {
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(io_err("create", dir)(e)),
        _ => take_dir(dir, owner),
    }
}

/// `dir` given to `owner`, mode 0755, by descriptor: a symlink or another kind of file is
/// refused.
fn take_dir(dir: &Path, owner: FileOwner) -> Result<(), ServerError> {
    let meta = std::fs::symlink_metadata(dir).map_err(io_err("inspect", dir))?;
    if !meta.is_dir() {
        return Err(unsafe_path(dir, "not a directory"));
    }
    owner
        .give(dir, 0o755)
        .map_err(|e| unsafe_path(dir, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: FileOwner = FileOwner {
        uid: 4343,
        gid: 4343,
    };

    fn owner_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().uid()
    }

    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn a_data_dir_of_another_user_is_refused() {
        if !root() {
            return; // chown needs root
        }
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::lchown(dir.path(), Some(4444), Some(4444)).unwrap();
        let err = prepare_data_dir(dir.path(), CLIENT).unwrap_err();
        assert!(matches!(err, ServerError::Unsafe { .. }), "{err}");
    }

    #[test]
    fn the_data_dir_is_roots_with_the_clients_group_and_sticky() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        prepare_data_dir(&data, CLIENT).unwrap();
        let meta = std::fs::metadata(&data).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (0, CLIENT.gid, 0o1770)
        );
        assert_eq!(owner_of(&data.join("run")), 0);
        assert_eq!(owner_of(&data.join("store")), 0);
    }

    #[test]
    fn symlinks_where_root_mounts_or_formats_are_refused() {
        if !root() {
            return;
        }
        for name in ["store", "store.btrfs", "run"] {
            let dir = tempfile::tempdir().unwrap();
            std::os::unix::fs::symlink("/etc", dir.path().join(name)).unwrap();
            let err = prepare_data_dir(dir.path(), CLIENT).unwrap_err();
            assert!(matches!(err, ServerError::Unsafe { .. }), "{name}: {err}");
            assert_eq!(owner_of(Path::new("/etc")), 0);
        }
    }

    #[test]
    fn giving_never_follows_a_symlink() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("root-only");
        std::fs::write(&target, b"secret").unwrap();
        let link = dir.path().join("disk.raw");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(CLIENT.give(&link, 0o600).is_err(), "give refuses a symlink");
        assert_eq!(owner_of(&target), 0, "the link's target stays root's");
    }

    #[test]
    fn acting_as_the_client_reaches_only_what_the_client_may() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"x").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let read = CLIENT.act_as(|| std::fs::read(&secret)).unwrap();
        assert!(read.is_err(), "the client cannot read root's 0600 file");
        assert!(std::fs::read(&secret).is_ok(), "root can again afterwards");
        let made = dir.path().join("made");
        std::os::unix::fs::lchown(dir.path(), Some(CLIENT.uid), Some(CLIENT.gid)).unwrap();
        CLIENT
            .act_as(|| std::fs::write(&made, b"y"))
            .unwrap()
            .unwrap();
        assert_eq!(
            owner_of(&made),
            CLIENT.uid,
            "files made acting as the client are its"
        );
    }
}

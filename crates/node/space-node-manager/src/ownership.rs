//! Who owns what on a node run by two processes: the sandbox manager (an unprivileged uid,
//! "the client") owns its data directory, its store and every file the node manager makes
//! for it; the node manager (root) keeps the run directory, where it builds the VMMs'
//! jails, so the client can never plant a symlink where root will create or mount.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use space_storage::Store;
use space_vmm::FileOwner;

use crate::server::ServerError;

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ServerError {
    let path = path.to_owned();
    move |source| ServerError::Io { what, path, source }
}

/// The data directory, made for the client if missing. One that exists must be the
/// client's already (the node manager never takes over a directory it was merely pointed
/// at), and the entries the node manager itself opens or mounts there must not be
/// symlinks: the client could otherwise aim a mount, or a `mkfs` of the store image, at
/// any path of the host.
pub(crate) fn prepare_data_dir(data_dir: &Path, client: FileOwner) -> Result<(), ServerError> {
    match std::fs::symlink_metadata(data_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(data_dir)
                .map_err(io_err("create", data_dir))?;
            lchown(data_dir, client).map_err(io_err("hand over", data_dir))?;
        }
        Err(e) => return Err(io_err("inspect", data_dir)(e)),
        Ok(meta) if !meta.is_dir() => {
            return Err(ServerError::Unsafe {
                path: data_dir.to_owned(),
                reason: "not a directory".into(),
            })
        }
        Ok(meta) if meta.uid() != client.uid => {
            return Err(ServerError::Unsafe {
                path: data_dir.to_owned(),
                reason: format!(
                    "owned by uid {}, not by the sandbox manager's uid {} (chown it to that user)",
                    meta.uid(),
                    client.uid
                ),
            })
        }
        Ok(_) => {}
    }
    for name in ["store", "store.btrfs", "store.lock", "run"] {
        let path = data_dir.join(name);
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if meta.file_type().is_symlink() {
                return Err(ServerError::Unsafe {
                    path,
                    reason: "a symlink; the node manager opens and mounts only real files here"
                        .into(),
                });
            }
        }
    }
    Ok(())
}

/// The store's root and the directories [`Store::open`] made, handed to the client: the
/// sandbox manager writes its records, snapshots and memory images there itself. Never
/// through a symlink (`lchown`): a link planted there would hand over only itself.
pub(crate) fn hand_over_store(store: &Store, client: FileOwner) -> Result<(), ServerError> {
    for dir in [
        store.root().to_owned(),
        store.sandboxes_root(),
        store.templates().dir().to_owned(),
        store.kernels().dir().to_owned(),
    ] {
        lchown(&dir, client).map_err(io_err("hand over", &dir))?;
    }
    Ok(())
}

/// The run directory: root's, 0755, never a symlink. The sandbox manager only reads there
/// (logs, pidfiles) and connects to the sockets handed to it.
pub(crate) fn secure_run_root(run_root: &Path) -> Result<(), ServerError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(run_root)
        .map_err(io_err("create", run_root))?;
    let meta = std::fs::symlink_metadata(run_root).map_err(io_err("inspect", run_root))?;
    if !meta.is_dir() {
        return Err(ServerError::Unsafe {
            path: run_root.to_owned(),
            reason: "not a directory".into(),
        });
    }
    FileOwner { uid: 0, gid: 0 }
        .give(run_root, 0o755)
        .map_err(io_err("take", run_root))
}

/// A file the node manager made for the client (a disk it cloned or linked), and its
/// directory if the node manager made that too, handed to the client.
pub(crate) fn hand_over(file: &Path, client: FileOwner) -> io::Result<()> {
    lchown(file, client)?;
    if let Some(dir) = file.parent() {
        if std::fs::symlink_metadata(dir)?.uid() != client.uid {
            lchown(dir, client)?;
        }
    }
    Ok(())
}

fn lchown(path: &Path, owner: FileOwner) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(owner.uid), Some(owner.gid))
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

    #[test]
    fn a_data_dir_the_client_does_not_own_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = prepare_data_dir(dir.path(), CLIENT).unwrap_err();
        assert!(matches!(err, ServerError::Unsafe { .. }), "{err}");
    }

    #[test]
    fn a_missing_data_dir_is_made_for_the_client() {
        if !nix::unistd::geteuid().is_root() {
            return; // chown needs root
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        prepare_data_dir(&data, CLIENT).unwrap();
        assert_eq!(owner_of(&data), CLIENT.uid);
    }

    #[test]
    fn symlinks_where_root_mounts_or_formats_are_refused() {
        for name in ["store", "store.btrfs", "run"] {
            let dir = tempfile::tempdir().unwrap();
            let us = FileOwner::current();
            let client = if us.uid == 0 { CLIENT } else { us };
            std::os::unix::fs::lchown(dir.path(), Some(client.uid), Some(client.gid)).unwrap();
            std::os::unix::fs::symlink("/etc", dir.path().join(name)).unwrap();
            let err = prepare_data_dir(dir.path(), client).unwrap_err();
            assert!(matches!(err, ServerError::Unsafe { .. }), "{name}: {err}");
        }
    }

    #[test]
    fn handing_over_never_follows_a_symlink() {
        if !nix::unistd::geteuid().is_root() {
            return; // chown needs root
        }
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("root-only");
        std::fs::write(&target, b"secret").unwrap();
        let link = dir.path().join("disk.raw");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        hand_over(&link, CLIENT).unwrap();
        assert_eq!(owner_of(&target), 0, "the link's target stays root's");
        assert!(CLIENT.give(&link, 0o600).is_err(), "give refuses a symlink");
        assert_eq!(owner_of(&target), 0);
    }

    #[test]
    fn the_run_directory_is_taken_back_by_root() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::os::unix::fs::lchown(&run, Some(CLIENT.uid), Some(CLIENT.gid)).unwrap();
        secure_run_root(&run).unwrap();
        assert_eq!(owner_of(&run), 0);
        let link = dir.path().join("run2");
        std::os::unix::fs::symlink("/etc", &link).unwrap();
        assert!(secure_run_root(&link).is_err());
    }
}

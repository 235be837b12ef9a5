//! Turns a [`JailPlan`] into the steps the child takes ([`JailSteps`]): makes the jail's
//! directory with an empty mount point for every mount, and lends the VM's own files to its
//! uid. Runs in the parent, before `clone3`.

use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::plan::{Bind, JailPlan};
use super::spawn::{c_path, JailMount, JailSteps};
use super::FileOwner;

/// Hostname every VMM sees in its uts namespace.
const VMM_HOSTNAME: &str = "space-vmm";

/// Prepares the jail root and the child's steps for a VMM running as `uid`, lending it its
/// files (opened as `owner`, their owner while no VMM holds them); returns them too, to be
/// given back by descriptor when the VMM exits.
pub(crate) fn steps(
    plan: &JailPlan,
    uid: u32,
    owner: FileOwner,
) -> io::Result<(JailSteps, Vec<std::fs::File>)> {
    make_dir(&plan.root)?;
    let mut lent = Vec::new();
    for file in &plan.lend {
        let create = plan.binds.iter().any(|b| b.create && b.host == *file);
        lent.push(lend(file, uid, owner, create)?);
    }
    let mut mounts = Vec::new();
    for host in &plan.system {
        let meta = match std::fs::symlink_metadata(host) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.file_type().is_symlink() {
            // /lib -> usr/lib on a merged-/usr system: the same link inside.
            let target = std::fs::read_link(host)?;
            let link = inside(&plan.root, host);
            make_parent(&link)?;
            match std::fs::read_link(&link) {
                Ok(existing) if existing == target => {}
                Ok(_) => {
                    std::fs::remove_file(&link)?;
                    std::os::unix::fs::symlink(&target, &link)?;
                }
                Err(_) => std::os::unix::fs::symlink(&target, &link)?,
            }
            continue;
        }
        mounts.push(bind_mount(
            &plan.root,
            &Bind {
                host: host.clone(),
                jail: host.clone(),
                writable: false,
                exec: meta.is_dir(),
                dev: false,
                create: false,
            },
        )?);
    }
    for bind in &plan.binds {
        mounts.push(bind_mount(&plan.root, bind)?);
    }
    // /proc of its own pid namespace, showing only the VMM's own process: QEMU reopens the
    // sealed memory image through /proc/self/fd.
    let proc_dir = plan.root.join("proc");
    make_dir(&proc_dir)?;
    mounts.push(JailMount {
        source: c"proc".to_owned(),
        target: c_path(&proc_dir)?,
        fstype: Some(c"proc".to_owned()),
        flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        data: Some(c"subset=pid".to_owned()),
        remount: None,
    });
    let steps = JailSteps {
        root: c_path(&plan.root)?,
        mounts,
        uid,
        gid: uid,
        hostname: std::ffi::CString::new(VMM_HOSTNAME).map_err(io::Error::other)?,
        rlimits: plan.rlimits.clone(),
        seccomp: super::seccomp::filters()?,
        empty_network: true,
    };
    Ok((steps, lent))
}

/// Gives a lent file back to `owner` once the VMM it was lent to has exited, by the
/// descriptor it was lent through (its name may lead elsewhere by now).
pub(crate) fn give_back(file: &std::fs::File, owner: FileOwner) {
    let given = std::os::unix::fs::fchown(file, Some(owner.uid), Some(owner.gid))
        .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(0o600)));
    if let Err(e) = given {
        tracing::warn!(uid = owner.uid, error = %e, "cannot give a VMM's file back");
    }
}

/// Hands a socket QEMU will listen on to `owner`, mode 0600: only the sandbox manager may
/// connect to a VM's QMP, console and channel, never another VMM's uid.
pub(crate) fn hand_socket(socket: &Path, owner: FileOwner) -> io::Result<()> {
    owner.give(socket, 0o600)
}

/// The VMM opens its disk (and an image build its RAM file) by path, read-write: the file
/// must be its uid's. It is opened as `owner` (the sandbox manager, in whose directories it
/// lies), read-write and not through a symlink, so only a file that `owner` may write can
/// be lent; then it is changed by descriptor. Mode 0660, group `owner`'s: no other VMM uid
/// may read it, and the sandbox manager may still snapshot it and move it (a pool member's).
fn lend(file: &Path, uid: u32, owner: FileOwner, create: bool) -> io::Result<std::fs::File> {
    let cannot =
        |e: io::Error| io::Error::new(e.kind(), format!("cannot lend {}: {e}", file.display()));
    let f = owner
        .act_as(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .mode(0o660)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(file)
        })
        .and_then(|opened| opened)
        .map_err(cannot)?;
    if !f.metadata().map_err(cannot)?.is_file() {
        return Err(cannot(io::Error::other("not a regular file")));
    }
    std::os::unix::fs::fchown(&f, Some(uid), Some(owner.gid)).map_err(cannot)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o660))
        .map_err(cannot)?;
    Ok(f)
}

fn bind_mount(root: &Path, bind: &Bind) -> io::Result<JailMount> {
    let target = inside(root, &bind.jail);
    // A file to create was made when it was lent.
    let meta = std::fs::metadata(&bind.host)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", bind.host.display())))?;
    make_parent(&target)?;
    if meta.is_dir() {
        make_dir(&target)?;
    } else if std::fs::symlink_metadata(&target).is_err() {
        std::fs::File::create(&target)?;
    }
    let mut remount = libc::MS_NOSUID;
    if !bind.writable {
        remount |= libc::MS_RDONLY;
    }
    if !bind.dev {
        remount |= libc::MS_NODEV;
    }
    if !bind.exec {
        remount |= libc::MS_NOEXEC;
    }
    Ok(JailMount {
        source: c_path(&bind.host)?,
        target: c_path(&target)?,
        fstype: None,
        flags: libc::MS_BIND,
        data: None,
        remount: Some(remount),
    })
}

/// `jail_path` (absolute) under the host directory `root`.
fn inside(root: &Path, jail_path: &Path) -> PathBuf {
    root.join(jail_path.strip_prefix("/").unwrap_or(jail_path))
}

fn make_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => make_dir(dir),
        None => Ok(()),
    }
}

fn make_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const CLIENT: FileOwner = FileOwner {
        uid: 4545,
        gid: 4545,
    };

    #[test]
    fn only_a_file_the_owner_may_write_is_lent() {
        if !nix::unistd::geteuid().is_root() {
            return; // chown needs root
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // A template: root's, readable by all.
        let template = dir.path().join("rootfs.ext4");
        std::fs::write(&template, b"ext4").unwrap();
        std::fs::set_permissions(&template, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(lend(&template, 1_500_000_099, CLIENT, false).is_err());
        assert_eq!(std::fs::metadata(&template).unwrap().uid(), 0, "untouched");
        // A link to it, in a directory of the owner's.
        let link = dir.path().join("disk.raw");
        std::os::unix::fs::symlink(&template, &link).unwrap();
        assert!(lend(&link, 1_500_000_099, CLIENT, false).is_err());
        // The owner's own disk is lent, and given back by descriptor.
        let disk = dir.path().join("own.raw");
        std::fs::write(&disk, b"disk").unwrap();
        std::os::unix::fs::chown(&disk, Some(CLIENT.uid), Some(CLIENT.gid)).unwrap();
        std::os::unix::fs::chown(dir.path(), Some(CLIENT.uid), Some(CLIENT.gid)).unwrap();
        let lent = lend(&disk, 1_500_000_099, CLIENT, false).unwrap();
        let meta = std::fs::metadata(&disk).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o777),
            (1_500_000_099, CLIENT.gid, 0o660)
        );
        give_back(&lent, CLIENT);
        assert_eq!(std::fs::metadata(&disk).unwrap().uid(), CLIENT.uid);
    }
}

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

/// Prepares the jail root and the child's steps for a VMM running as `uid`.
pub(crate) fn steps(plan: &JailPlan, uid: u32) -> io::Result<JailSteps> {
    make_dir(&plan.root)?;
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
    for file in &plan.lend {
        lend(file, uid)?;
    }
    Ok(JailSteps {
        root: c_path(&plan.root)?,
        mounts,
        uid,
        gid: uid,
        hostname: std::ffi::CString::new(VMM_HOSTNAME).map_err(io::Error::other)?,
        rlimits: plan.rlimits.clone(),
        seccomp: super::seccomp::filters()?,
        empty_network: true,
    })
}

/// Gives a file back to `owner` once the VMM it was lent to has exited.
pub(crate) fn give_back(file: &Path, owner: FileOwner) {
    // Not following a symlink: the file's directory is the sandbox manager's, which could
    // have replaced the file by a link to anything while the VMM ran.
    if let Err(e) = std::os::unix::fs::lchown(file, Some(owner.uid), Some(owner.gid)) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(file = %file.display(), uid = owner.uid, error = %e, "cannot give a VMM's file back");
        }
    }
}

/// Hands a socket QEMU will listen on to `owner`, mode 0600: only the sandbox manager may
/// connect to a VM's QMP, console and channel, never another VMM's uid.
pub(crate) fn hand_socket(socket: &Path, owner: FileOwner) -> io::Result<()> {
    owner.give(socket, 0o600)
}

/// `path` opened without following a symlink in its last component.
fn open_no_follow(path: &Path, flags: i32) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// The VMM opens its disk (and an image build its RAM file) by path, read-write: the file
/// must be its uid's. Mode 0600: no other VMM uid may read it even if it could see it.
fn lend(file: &Path, uid: u32) -> io::Result<()> {
    let cannot =
        |e: io::Error| io::Error::new(e.kind(), format!("cannot lend {}: {e}", file.display()));
    // By descriptor, never through a symlink: only a regular file is lent.
    let f = open_no_follow(file, 0).map_err(cannot)?;
    if !f.metadata().map_err(cannot)?.is_file() {
        return Err(cannot(io::Error::other("not a regular file")));
    }
    std::os::unix::fs::fchown(&f, Some(uid), Some(uid)).map_err(cannot)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
}

fn bind_mount(root: &Path, bind: &Bind) -> io::Result<JailMount> {
    let target = inside(root, &bind.jail);
    if bind.create {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&bind.host)?;
    }
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

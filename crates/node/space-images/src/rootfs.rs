//! Building template root filesystem trees: the busybox tree, and a debootstrap tree with
//! the sandbox user. The trees are turned into ext4 images by [`crate::ext4`].

use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::Path;
use std::process::Command;

use crate::error::{ImageError, IoContext};
use crate::hostfiles::make_parents;
use crate::recipes::{ConfigFile, Dir, Link};
use crate::run;

/// uid and gid of the sandbox user.
pub const USER_ID: u32 = 1000;

/// Creates `path` (and missing parents) with `mode` and owner `uid:gid`.
fn make_dir(path: &Path, mode: u32, uid: u32, gid: u32) -> Result<(), ImageError> {
    std::fs::create_dir_all(path).ctx("create directory", path)?;
    // create_dir_all is subject to the umask; set the mode explicitly (sticky bits too).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).ctx("chmod", path)?;
    chown(path, Some(uid), Some(gid)).ctx("chown", path)
}

/// Writes the recipe's files into the tree, owned by root.
pub(crate) fn write_files(tree: &Path, files: &[ConfigFile]) -> Result<(), ImageError> {
    for f in files {
        let path = tree.join(f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).ctx("create directory", parent)?;
        }
        std::fs::write(&path, f.contents).ctx("write", &path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode))
            .ctx("chmod", &path)?;
        chown(&path, Some(0), Some(0)).ctx("chown", &path)?;
    }
    Ok(())
}

/// The busybox tree: `/bin/busybox` with every applet linked in `/bin` and `/usr/bin`, the
/// recipe's directories, links and `/etc` files, `/home/user` owned by the user, and the
/// usual empty directories. (Host files are copied in afterwards, over any applet link.)
pub(crate) fn busybox_tree(
    tree: &Path,
    busybox: &Path,
    applets: &[String],
    files: &[ConfigFile],
    dirs: &[Dir],
    links: &[Link],
) -> Result<(), ImageError> {
    for (dir, mode) in [
        ("bin", 0o755),
        ("usr", 0o755),
        ("usr/bin", 0o755),
        ("etc", 0o755),
        ("home", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("run", 0o755),
    ] {
        make_dir(&tree.join(dir), mode, 0, 0)?;
    }
    make_dir(&tree.join("home/user"), 0o755, USER_ID, USER_ID)?;
    for d in dirs {
        let path = tree.join(d.path);
        make_parents(tree, &path)?;
        make_dir(&path, d.mode, 0, 0)?;
    }
    let bb = tree.join("bin/busybox");
    std::fs::copy(busybox, &bb).ctx("copy busybox to", &bb)?;
    std::fs::set_permissions(&bb, std::fs::Permissions::from_mode(0o755)).ctx("chmod", &bb)?;
    for a in applets {
        for dir in ["bin", "usr/bin"] {
            let link = tree.join(dir).join(a);
            if link.symlink_metadata().is_err() {
                symlink("/bin/busybox", &link).ctx("symlink", &link)?;
            }
        }
    }
    if tree.join("bin/sh").symlink_metadata().is_err() {
        return Err(ImageError::BadOutput {
            program: busybox.display().to_string(),
            detail: "no 'sh' applet".into(),
        });
    }
    for l in links {
        let path = tree.join(l.path);
        make_parents(tree, &path)?;
        symlink(l.target, &path).ctx("symlink", &path)?;
    }
    write_files(tree, files)
}

/// A Debian tree by debootstrap, then `apt_packages` installed in it, with the sandbox user
/// (uid/gid 1000, home /home/user, bash) and the recipe's files; apt lists, caches and the
/// machine id are cleared.
#[allow(clippy::too_many_arguments)]
pub(crate) fn debootstrap_tree(
    tree: &Path,
    suite: &str,
    variant: &str,
    packages: &[String],
    apt_packages: &[String],
    mirror: &str,
    files: &[ConfigFile],
    progress: &dyn Fn(&str),
) -> Result<(), ImageError> {
    progress(&format!(
        "debootstrap {suite} ({variant}) from {mirror}; this takes a few minutes"
    ));
    run::run(
        Command::new("debootstrap")
            .arg(format!("--variant={variant}"))
            .arg(format!("--include={}", packages.join(",")))
            .arg(suite)
            .arg(tree)
            .arg(mirror),
        &|l| progress(&format!("debootstrap: {l}")),
    )?;
    let chroot = |args: &[&str]| run::run(Command::new("chroot").arg(tree).args(args), progress);
    if !apt_packages.is_empty() {
        progress(&format!("installing {}", apt_packages.join(" ")));
        apt_install(tree, apt_packages, progress)?;
    }
    progress("adding user 'user'");
    chroot(&["groupadd", "--gid", "1000", "user"])?;
    chroot(&[
        "useradd",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--create-home",
        "--home-dir",
        "/home/user",
        "--shell",
        "/bin/bash",
        "user",
    ])?;
    write_files(tree, files)?;
    clean(tree)
}

/// `apt-get install` in the tree, with `/proc` mounted for the packages' scripts (and
/// unmounted whatever happens).
fn apt_install(
    tree: &Path,
    packages: &[String],
    progress: &dyn Fn(&str),
) -> Result<(), ImageError> {
    let proc = tree.join("proc");
    run::run(
        Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(&proc),
        progress,
    )?;
    let installed = run::run(
        Command::new("chroot")
            .arg(tree)
            .args([
                "env",
                "DEBIAN_FRONTEND=noninteractive",
                "apt-get",
                "install",
                "-y",
                "--no-install-recommends",
            ])
            .args(packages),
        &|l| progress(&format!("apt-get: {l}")),
    );
    let unmounted = run::run(Command::new("umount").arg(&proc), progress);
    installed?;
    unmounted
}

/// Removes what must not be shared by every sandbox (machine id) or is only bulk (apt lists
/// and caches), and the host's resolver config debootstrap copied in.
fn clean(tree: &Path) -> Result<(), ImageError> {
    for dir in ["var/lib/apt/lists", "var/cache/apt/archives"] {
        let dir = tree.join(dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_file() && e.file_name() != "lock" {
                std::fs::remove_file(&p).ctx("remove", &p)?;
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(tree.join("var/cache/apt")) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(".bin") {
                std::fs::remove_file(e.path()).ctx("remove", &e.path())?;
            }
        }
    }
    for f in ["etc/machine-id", "etc/resolv.conf"] {
        let p = tree.join(f);
        if p.symlink_metadata().is_ok_and(|m| m.is_file()) {
            std::fs::write(&p, b"").ctx("truncate", &p)?;
        }
    }
    let dbus_id = tree.join("var/lib/dbus/machine-id");
    if dbus_id.symlink_metadata().is_ok() {
        std::fs::remove_file(&dbus_id).ctx("remove", &dbus_id)?;
    }
    Ok(())
}

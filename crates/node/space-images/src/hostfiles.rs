//! Files a recipe takes from the host (Debian's curl and openssl, for the busybox template):
//! resolved to the exact set of files to copy, the shared libraries and the dynamic loader
//! of each executable included, so that set can be hashed into the digest and copied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{ImageError, IoContext};
use crate::recipes::HostFile;

/// What a copied file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A dynamically linked program, and its dynamic loader (path in the tree).
    Executable { loader: String },
    /// The dynamic loader.
    Loader,
    /// A shared library.
    Library,
    /// Anything else (e.g. a config file).
    Data,
}

/// One file to copy from the host into the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CopiedFile {
    /// Path in the tree, without the leading `/` (the path the host resolved it at).
    pub dest: String,
    /// The host file (symbolic links are followed when copying and hashing).
    pub source: PathBuf,
    /// What it is.
    pub kind: Kind,
}

impl CopiedFile {
    /// Permission bits in the tree.
    pub fn mode(&self) -> u32 {
        match self.kind {
            Kind::Executable { .. } | Kind::Loader => 0o755,
            Kind::Library | Kind::Data => 0o644,
        }
    }
}

/// The files to copy for `files`, sorted by destination, each once: every host file and,
/// for executables, every shared library `ldd` resolves on the host (at the path the host's
/// loader found it, which is in the loader's default search path when the host has no
/// extra `ld.so.conf` entries for it) and the dynamic loader.
pub(crate) fn resolve(files: &[HostFile]) -> Result<Vec<CopiedFile>, ImageError> {
    let mut out = BTreeMap::new();
    for f in files {
        let source = Path::new("/").join(f.path);
        if !source.is_file() {
            return Err(ImageError::HostFile {
                path: source,
                detail: "not found on the host; install the Debian package that has it \
                         (APT_PACKAGES in scripts/lib/common.sh)"
                    .into(),
            });
        }
        let kind = if f.executable {
            let mut loader = String::new();
            for (lib, is_loader) in shared_libraries(&source)? {
                let dest = relative(&lib)?;
                let kind = if is_loader {
                    loader.clone_from(&dest);
                    Kind::Loader
                } else {
                    Kind::Library
                };
                out.entry(dest.clone()).or_insert(CopiedFile {
                    dest,
                    source: lib,
                    kind,
                });
            }
            Kind::Executable { loader }
        } else {
            Kind::Data
        };
        let dest = relative(&source)?;
        out.insert(dest.clone(), CopiedFile { dest, source, kind });
    }
    Ok(out.into_values().collect())
}

/// The host files an executable loads: `(path, is the dynamic loader)`, by `ldd` with the
/// caller's loader overrides removed.
fn shared_libraries(exe: &Path) -> Result<Vec<(PathBuf, bool)>, ImageError> {
    let out = space_storage::cmd::run(
        Command::new("ldd")
            .arg(exe)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("LD_PRELOAD"),
    )?;
    parse_ldd(&out).map_err(|detail| ImageError::HostFile {
        path: exe.to_owned(),
        detail,
    })
}

/// `ldd` (or `ld.so --list`) output: the resolved libraries and the loader, `(path, is the
/// loader)`; the vDSO has no file and is skipped. A library `not found` is an error.
pub(crate) fn parse_ldd(text: &str) -> Result<Vec<(PathBuf, bool)>, String> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some((name, target)) = line.split_once("=>") {
            let target = target.trim();
            if target.starts_with("not found") {
                return Err(format!("needs {}, which is not found", name.trim()));
            }
            let path = target.split(" (").next().unwrap_or("").trim();
            if path.is_empty() {
                // `name => (0x…)`: a vDSO under another name.
                continue;
            }
            if !path.starts_with('/') {
                return Err(format!("unexpected ldd line {line:?}"));
            }
            libs.push((PathBuf::from(path), false));
        } else if line.starts_with('/') {
            let path = line.split(" (").next().unwrap_or(line).trim();
            libs.push((PathBuf::from(path), true));
        }
        // Else the vDSO (`linux-vdso.so.1 (0x…)`), which has no file.
    }
    if !libs.iter().any(|(_, loader)| *loader) {
        return Err(
            "ldd names no dynamic loader (only dynamically linked executables are supported)"
                .into(),
        );
    }
    Ok(libs)
}

/// An absolute path as a path in the tree (no leading `/`, no `..`).
fn relative(path: &Path) -> Result<String, ImageError> {
    let s = path.to_string_lossy();
    let rel = s.trim_start_matches('/');
    if !path.is_absolute()
        || rel.is_empty()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(ImageError::HostFile {
            path: path.to_owned(),
            detail: "not a plain absolute path".into(),
        });
    }
    Ok(rel.to_owned())
}

/// Copies the files into the tree (owned by root, with their modes), replacing whatever is
/// at a destination (e.g. a busybox applet link of the same name). Missing parent
/// directories are created with mode 0755.
pub(crate) fn copy_into(tree: &Path, files: &[CopiedFile]) -> Result<(), ImageError> {
    use std::os::unix::fs::{chown, PermissionsExt};
    for f in files {
        let dest = tree.join(&f.dest);
        make_parents(tree, &dest)?;
        if dest.symlink_metadata().is_ok() {
            std::fs::remove_file(&dest).ctx("remove", &dest)?;
        }
        std::fs::copy(&f.source, &dest).ctx("copy host file to", &dest)?;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(f.mode()))
            .ctx("chmod", &dest)?;
        chown(&dest, Some(0), Some(0)).ctx("chown", &dest)?;
    }
    Ok(())
}

/// Creates the missing directories between `tree` and `path`'s parent: mode 0755, root's.
pub(crate) fn make_parents(tree: &Path, path: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::{chown, PermissionsExt};
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    let mut missing = Vec::new();
    let mut dir = parent;
    while dir != tree && dir.symlink_metadata().is_err() {
        missing.push(dir);
        match dir.parent() {
            Some(p) => dir = p,
            None => break,
        }
    }
    for d in missing.into_iter().rev() {
        std::fs::create_dir(d).ctx("create directory", d)?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).ctx("chmod", d)?;
        chown(d, Some(0), Some(0)).ctx("chown", d)?;
    }
    Ok(())
}

/// Checks that every copied executable finds all its libraries inside the tree: the tree's
/// own loader lists them in a chroot (`ld.so --list`, which runs nothing of the program).
pub(crate) fn check_in_tree(tree: &Path, files: &[CopiedFile]) -> Result<(), ImageError> {
    for f in files {
        let Kind::Executable { loader } = &f.kind else {
            continue;
        };
        let out = space_storage::cmd::run(
            Command::new("chroot")
                .arg(tree)
                .arg(format!("/{loader}"))
                .arg("--list")
                .arg(format!("/{}", f.dest))
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        )?;
        parse_ldd(&out).map_err(|detail| ImageError::HostFile {
            path: PathBuf::from(format!("/{}", f.dest)),
            detail: format!("in the template: {detail}"),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CURL: &str = "\tlinux-vdso.so.1 (0x00007ffd5c9d2000)
\tlibcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x00007f4e8a15d000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f4e89f5c000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f4e8a267000)
";

    #[test]
    fn parses_ldd() {
        assert_eq!(
            parse_ldd(CURL).unwrap(),
            vec![
                (PathBuf::from("/lib/x86_64-linux-gnu/libcurl.so.4"), false),
                (PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"), false),
                (PathBuf::from("/lib64/ld-linux-x86-64.so.2"), true),
            ]
        );
        let missing = format!("{CURL}\tlibz.so.1 => not found\n");
        assert!(parse_ldd(&missing).unwrap_err().contains("libz.so.1"));
        assert!(parse_ldd("\tnot a dynamic executable\n").is_err());
        assert!(parse_ldd("\tlibx.so => x/libx.so (0x1)\n\t/lib64/ld.so (0x2)\n").is_err());
    }

    #[test]
    fn resolves_data_files_and_rejects_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.cnf");
        std::fs::write(&path, "x").unwrap();
        let rel: &'static str = Box::leak(
            path.to_string_lossy()
                .trim_start_matches('/')
                .to_owned()
                .into_boxed_str(),
        );
        let got = resolve(&[HostFile {
            path: rel,
            executable: false,
        }])
        .unwrap();
        assert_eq!(
            got,
            vec![CopiedFile {
                dest: rel.to_owned(),
                source: path.clone(),
                kind: Kind::Data,
            }]
        );
        let err = resolve(&[HostFile {
            path: "nonexistent/space-test-file",
            executable: false,
        }])
        .unwrap_err();
        assert!(err.to_string().contains("APT_PACKAGES"), "{err}");
        assert!(relative(Path::new("/a/../b")).is_err());
        assert_eq!(relative(Path::new("/lib64/ld.so")).unwrap(), "lib64/ld.so");
    }

    #[test]
    fn makes_missing_parents_0755() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            return; // chown to root
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a/b/c/file");
        make_parents(dir.path(), &file).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            let mode = std::fs::metadata(dir.path().join(d))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o755, "{d}");
        }
        assert!(!file.exists());
    }
}

//! The initramfs: what goes in it (a pure list of entries) and writing it as an uncompressed
//! cpio "newc" archive (uncompressed boots faster under TCG than decompressing).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use cpio::newc::{Builder, ModeFileType};

use crate::error::{ImageError, IoContext};

/// The `/init` script (kept as a file in `images/initramfs/init`).
pub const INIT_SCRIPT: &str = include_str!("../../../../images/initramfs/init");

/// One entry of the archive. Paths are relative to the archive root, without a leading `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir { path: String, mode: u32 },
    /// A regular file copied from the host.
    File {
        path: String,
        mode: u32,
        source: PathBuf,
    },
    /// A regular file with inline contents.
    Data {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    /// A symbolic link.
    Symlink { path: String, target: String },
    /// A character device node.
    CharDev {
        path: String,
        mode: u32,
        major: u32,
        minor: u32,
    },
}

impl Entry {
    /// Its path in the archive.
    pub fn path(&self) -> &str {
        match self {
            Entry::Dir { path, .. }
            | Entry::File { path, .. }
            | Entry::Data { path, .. }
            | Entry::Symlink { path, .. }
            | Entry::CharDev { path, .. } => path,
        }
    }
}

/// Inputs of the initramfs.
#[derive(Debug, Clone)]
pub struct InitramfsSpec {
    /// Static busybox binary.
    pub busybox: PathBuf,
    /// Its applets (`busybox --list`), linked in `/bin`.
    pub applets: Vec<String>,
    /// Module files on the host, in load order; installed flat in `/lib/modules`.
    pub modules: Vec<PathBuf>,
    /// The guest daemon binary (static).
    pub spaced: PathBuf,
}

/// The file name a module gets in `/lib/modules` (and in `/modules.order`).
pub fn module_file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether an applet name is safe to use as a file name in `/bin`.
pub fn valid_applet(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name != "busybox"
        && name.len() <= 64
        && !name.contains('/')
        && !name.contains('\0')
}

/// The archive's entries, parents before children.
pub fn entries(spec: &InitramfsSpec) -> Result<Vec<Entry>, ImageError> {
    let mut out = vec![];
    for dir in ["bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules"] {
        out.push(Entry::Dir {
            path: dir.into(),
            mode: 0o755,
        });
    }
    // The kernel opens /dev/console for init before /init can mount devtmpfs.
    out.push(Entry::CharDev {
        path: "dev/console".into(),
        mode: 0o600,
        major: 5,
        minor: 1,
    });
    out.push(Entry::File {
        path: "bin/busybox".into(),
        mode: 0o755,
        source: spec.busybox.clone(),
    });
    let mut applets: Vec<&String> = spec.applets.iter().filter(|a| valid_applet(a)).collect();
    applets.sort();
    applets.dedup();
    for a in applets {
        out.push(Entry::Symlink {
            path: format!("bin/{a}"),
            target: "busybox".into(),
        });
    }
    out.push(Entry::Data {
        path: "init".into(),
        mode: 0o755,
        data: INIT_SCRIPT.as_bytes().to_vec(),
    });
    let mut order = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for m in &spec.modules {
        let name = module_file_name(m);
        if !seen.insert(name.clone()) {
            return Err(ImageError::ModuleNameClash(name));
        }
        out.push(Entry::File {
            path: format!("lib/modules/{name}"),
            mode: 0o644,
            source: m.clone(),
        });
        order.push_str(&name);
        order.push('\n');
    }
    out.push(Entry::Data {
        path: "modules.order".into(),
        mode: 0o644,
        data: order.into_bytes(),
    });
    out.push(Entry::File {
        path: "spaced".into(),
        mode: 0o755,
        source: spec.spaced.clone(),
    });
    Ok(out)
}

/// Writes `entries` to `dest` as a newc cpio archive: owned by root, mtime 0, inode numbers
/// in order, so the same inputs give the same bytes.
pub fn write(entries: &[Entry], dest: &Path) -> Result<(), ImageError> {
    let file = File::create(dest).ctx("create", dest)?;
    let mut w = BufWriter::new(file);
    for (i, e) in entries.iter().enumerate() {
        let ino = u32::try_from(i + 1).map_err(|_| ImageError::TooLarge(dest.to_owned()))?;
        let b = Builder::new(e.path()).ino(ino).uid(0).gid(0).mtime(0);
        match e {
            Entry::Dir { mode, .. } => {
                b.mode(*mode)
                    .set_mode_file_type(ModeFileType::Directory)
                    .nlink(2)
                    .write(&mut w, 0)
                    .finish()
                    .ctx("write", dest)?;
            }
            Entry::CharDev {
                mode, major, minor, ..
            } => {
                b.mode(*mode)
                    .set_mode_file_type(ModeFileType::Char)
                    .rdev_major(*major)
                    .rdev_minor(*minor)
                    .write(&mut w, 0)
                    .finish()
                    .ctx("write", dest)?;
            }
            Entry::Symlink { target, .. } => {
                let data = target.as_bytes();
                let mut fw = b
                    .mode(0o777)
                    .set_mode_file_type(ModeFileType::Symlink)
                    .write(&mut w, data.len() as u32);
                fw.write_all(data).ctx("write", dest)?;
                fw.finish().ctx("write", dest)?;
            }
            Entry::Data { mode, data, .. } => {
                let len = u32::try_from(data.len())
                    .map_err(|_| ImageError::TooLarge(PathBuf::from(e.path())))?;
                let mut fw = b
                    .mode(*mode)
                    .set_mode_file_type(ModeFileType::Regular)
                    .write(&mut w, len);
                fw.write_all(data).ctx("write", dest)?;
                fw.finish().ctx("write", dest)?;
            }
            Entry::File { mode, source, .. } => {
                let mut src = File::open(source).ctx("open", source)?;
                let len = src.metadata().ctx("stat", source)?.len();
                let len32 = u32::try_from(len).map_err(|_| ImageError::TooLarge(source.clone()))?;
                let mut fw = b
                    .mode(*mode)
                    .set_mode_file_type(ModeFileType::Regular)
                    .write(&mut w, len32);
                let copied = std::io::copy(&mut (&mut src).take(len), &mut fw)
                    .ctx("copy into initramfs", source)?;
                if copied != len {
                    return Err(ImageError::io(
                        "copy into initramfs",
                        source,
                        std::io::Error::other("file shrank while being copied"),
                    ));
                }
                fw.finish().ctx("write", dest)?;
            }
        }
    }
    let mut w = cpio::newc::trailer(w).ctx("write", dest)?;
    w.flush().ctx("write", dest)?;
    w.into_inner()
        .map_err(|e| ImageError::io("write", dest, e.into_error()))?
        .sync_all()
        .ctx("sync", dest)?;
    Ok(())
}

/// The entry names of a newc archive, in order, with their modes (for tests and inspection).
pub fn list(archive: &Path) -> Result<Vec<(String, u32)>, ImageError> {
    let mut r = std::io::BufReader::new(File::open(archive).ctx("open", archive)?);
    let mut out = Vec::new();
    loop {
        let entry = cpio::newc::Reader::new(r).ctx("read", archive)?;
        if entry.entry().is_trailer() {
            break;
        }
        out.push((entry.entry().name().to_owned(), entry.entry().mode()));
        r = entry.finish().ctx("read", archive)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let bb = dir.path().join("busybox");
        std::fs::write(&bb, b"#!fake busybox").unwrap();
        let m1 = dir.path().join("virtio_ring.ko");
        let m2 = dir.path().join("virtio.ko");
        std::fs::write(&m1, b"ring").unwrap();
        std::fs::write(&m2, b"virtio").unwrap();
        let spec = InitramfsSpec {
            busybox: bb.clone(),
            applets: vec![
                "sh".into(),
                "mount".into(),
                "../evil".into(),
                "busybox".into(),
                "sh".into(),
            ],
            modules: vec![m1, m2],
            spaced: bb,
        };
        let e = entries(&spec).unwrap();
        let out = dir.path().join("initramfs.cpio");
        write(&e, &out).unwrap();
        let names: Vec<String> = list(&out).unwrap().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"init".to_owned()));
        assert!(names.contains(&"bin/sh".to_owned()));
        assert!(!names.iter().any(|n| n.contains("evil")));
        let i_ring = names
            .iter()
            .position(|n| n == "lib/modules/virtio_ring.ko")
            .unwrap();
        let i_virtio = names
            .iter()
            .position(|n| n == "lib/modules/virtio.ko")
            .unwrap();
        assert!(i_ring < i_virtio);
        // Deterministic.
        let out2 = dir.path().join("again.cpio");
        write(&e, &out2).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&out2).unwrap());
    }

    #[test]
    fn duplicate_module_names_are_rejected() {
        let spec = InitramfsSpec {
            busybox: "/bin/busybox".into(),
            applets: vec![],
            modules: vec!["a/x.ko".into(), "b/x.ko".into()],
            spaced: "/bin/busybox".into(),
        };
        assert!(matches!(
            entries(&spec),
            Err(ImageError::ModuleNameClash(_))
        ));
    }

    #[test]
    fn init_script_powers_off_on_failure_and_announces_switch() {
        assert!(INIT_SCRIPT.starts_with("#!/bin/busybox sh"));
        assert!(
            INIT_SCRIPT.contains("space-initramfs: switching root")
                || INIT_SCRIPT.contains("say \"switching root\"")
        );
        assert!(INIT_SCRIPT.contains("exec switch_root /newroot /run/space/spaced init"));
        assert!(INIT_SCRIPT.contains("poweroff -f"));
    }
}

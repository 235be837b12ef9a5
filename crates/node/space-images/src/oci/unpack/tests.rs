//! The layer rules, on real trees (run as root, as the suite does: owners are applied).

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::*;

const LIMITS: UnpackLimits = UnpackLimits {
    max_bytes: 64 << 20,
    max_entries: 10_000,
};

/// A layer under construction.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Layer(tar::Builder::new(Vec::new()))
    }
    fn header(kind: tar::EntryType, mode: u32, uid: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_mtime(1_700_000_000);
        h.set_size(0);
        h
    }
    fn dir(mut self, path: &str, mode: u32, uid: u64) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, mode, uid);
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }
    fn file(mut self, path: &str, body: &[u8], mode: u32, uid: u64) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, mode, uid);
        h.set_size(body.len() as u64);
        self.0.append_data(&mut h, path, body).unwrap();
        self
    }
    fn xattr_file(mut self, path: &str, xattrs: &[(&str, &[u8])]) -> Self {
        let recs: Vec<(String, &[u8])> = xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
            .collect();
        self.0
            .append_pax_extensions(recs.iter().map(|(k, v)| (k.as_str(), *v)))
            .unwrap();
        self.file(path, b"x", 0o755, 0)
    }
    fn link(mut self, kind: tar::EntryType, path: &str, target: &str) -> Self {
        let mut h = Self::header(kind, 0o777, 0);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }
    /// An entry with name (and link target) written into the header as given: the tar
    /// crate's own setters refuse `..`, a hostile layer does not.
    fn hostile(mut self, kind: tar::EntryType, path: &str, target: &str, body: &[u8]) -> Self {
        let mut h = Self::header(kind, 0o644, 0);
        h.set_size(body.len() as u64);
        let old = h.as_old_mut();
        old.name[..path.len()].copy_from_slice(path.as_bytes());
        old.linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        self.0.append(&h, body).unwrap();
        self
    }
    fn raw(mut self, kind: tar::EntryType, path: &str) -> Self {
        let mut h = Self::header(kind, 0o644, 0);
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }
    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn diff_id(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn apply(root: &Path, layers: &[Vec<u8>]) -> Result<Unpacker, UnpackError> {
    let mut u = Unpacker::open(root, LIMITS)?;
    for (i, l) in layers.iter().enumerate() {
        u.apply_layer(i + 1, &l[..], &diff_id(l))?;
    }
    Ok(u)
}

fn tree() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn files_links_owners_modes_and_xattrs() {
    let t = tree();
    let l = Layer::new()
        .dir("usr/", 0o755, 0)
        .dir("usr/bin", 0o755, 0)
        .file("usr/bin/sudo", b"#!fake", 0o4755, 0)
        .file("home/app/notes", b"hello", 0o640, 1000)
        .link(tar::EntryType::Symlink, "bin", "usr/bin")
        .link(tar::EntryType::Link, "usr/bin/sudo2", "usr/bin/sudo")
        .raw(tar::EntryType::Fifo, "run-fifo")
        .xattr_file(
            "usr/bin/ping",
            &[
                ("security.capability", &cap_net_raw()),
                ("user.note", b"v"),
                ("trusted.x", b"y"),
            ],
        )
        .bytes();
    let u = apply(t.path(), &[l]).unwrap();
    let p = t.path();
    let sudo = std::fs::metadata(p.join("usr/bin/sudo")).unwrap();
    assert_eq!(sudo.permissions().mode() & 0o7777, 0o4755, "setuid kept");
    assert_eq!(sudo.nlink(), 2, "hard link");
    assert_eq!(sudo.mtime(), 1_700_000_000);
    let notes = std::fs::metadata(p.join("home/app/notes")).unwrap();
    assert_eq!(
        (notes.uid(), notes.gid(), notes.permissions().mode() & 0o777),
        (1000, 1000, 0o640)
    );
    assert_eq!(std::fs::read(p.join("home/app/notes")).unwrap(), b"hello");
    // The parent the layer omitted was made.
    assert!(p.join("home/app").is_dir());
    assert_eq!(
        std::fs::read_link(p.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
    assert!(std::fs::symlink_metadata(p.join("run-fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    let caps = xattr_of(&p.join("usr/bin/ping"), "security.capability");
    assert_eq!(caps.as_deref(), Some(&cap_net_raw()[..]));
    assert_eq!(
        xattr_of(&p.join("usr/bin/ping"), "user.note").as_deref(),
        Some(&b"v"[..])
    );
    assert!(u.skipped_xattrs.contains("trusted.x"));
}

/// A version-2 `security.capability` value granting cap_net_raw (bit 13), effective.
fn cap_net_raw() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
    v.extend_from_slice(&(1u32 << 13).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v
}

fn xattr_of(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    let n = rustix::fs::lgetxattr(path, name, &mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

#[test]
fn whiteouts_and_opaque_directories() {
    let t = tree();
    let lower = Layer::new()
        .file("a/x", b"1", 0o644, 0)
        .file("a/y", b"2", 0o644, 0)
        .file("b/z", b"3", 0o644, 0)
        .file("c/old", b"4", 0o644, 0)
        .file("d/f", b"5", 0o644, 0)
        .bytes();
    let upper = Layer::new()
        .file("a/.wh.x", b"", 0o644, 0)
        .dir("b", 0o755, 0)
        .file("b/.wh..wh..opq", b"", 0o644, 0)
        .file("b/new", b"n", 0o644, 0)
        // The same layer writes c/kept before the opaque marker: it stays.
        .file("c/kept", b"k", 0o644, 0)
        .file("c/.wh..wh..opq", b"", 0o644, 0)
        // A whole directory whited out, and one for a name that never existed.
        .file(".wh.d", b"", 0o644, 0)
        .file(".wh.never", b"", 0o644, 0)
        .bytes();
    apply(t.path(), &[lower, upper]).unwrap();
    let p = t.path();
    assert!(!p.join("a/x").exists());
    assert!(p.join("a/y").exists());
    assert!(!p.join("b/z").exists());
    assert!(p.join("b/new").exists());
    assert!(!p.join("c/old").exists());
    assert!(p.join("c/kept").exists());
    assert!(!p.join("d").exists());
    assert!(!p.join("a/.wh.x").exists(), "whiteouts are not files");
}

#[test]
fn later_entries_replace_earlier_ones() {
    let t = tree();
    let lower = Layer::new()
        .file("etc/conf", b"old", 0o644, 0)
        .file("thing/inside", b"i", 0o644, 0)
        .link(tar::EntryType::Symlink, "ln", "etc")
        .bytes();
    let upper = Layer::new()
        .file("etc/conf", b"new", 0o600, 0)
        // A file where a directory was, a directory re-declared keeps its contents.
        .file("thing", b"now a file", 0o644, 0)
        .dir("etc", 0o700, 0)
        // A file where a symlink was: the link is replaced, not followed.
        .file("ln", b"plain", 0o644, 0)
        .bytes();
    apply(t.path(), &[lower, upper]).unwrap();
    let p = t.path();
    assert_eq!(std::fs::read(p.join("etc/conf")).unwrap(), b"new");
    assert_eq!(std::fs::read(p.join("thing")).unwrap(), b"now a file");
    assert_eq!(
        std::fs::metadata(p.join("etc"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert!(std::fs::symlink_metadata(p.join("ln")).unwrap().is_file());
}

#[test]
fn links_inside_the_tree_are_followed_and_escapes_refused() {
    let t = tree();
    // Merged /usr: lib -> usr/lib, then a file under lib/ lands in usr/lib.
    let ok = Layer::new()
        .dir("usr/lib", 0o755, 0)
        .link(tar::EntryType::Symlink, "lib", "usr/lib")
        .file("lib/libx.so", b"elf", 0o755, 0)
        .bytes();
    apply(t.path(), &[ok]).unwrap();
    assert!(t.path().join("usr/lib/libx.so").is_file());

    let outside = tree();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "dot-dot name",
            Layer::new()
                .hostile(tar::EntryType::Regular, "../escaped", "", b"x")
                .bytes(),
        ),
        (
            "dot-dot inside",
            Layer::new()
                .hostile(tar::EntryType::Regular, "a/../../escaped", "", b"x")
                .bytes(),
        ),
        (
            "absolute link used as a path",
            Layer::new()
                .link(
                    tar::EntryType::Symlink,
                    "evil",
                    outside.path().to_str().unwrap(),
                )
                .file("evil/escaped", b"x", 0o644, 0)
                .bytes(),
        ),
        (
            "relative link out of the tree",
            Layer::new()
                .link(tar::EntryType::Symlink, "up", "../../../../../../..")
                .file("up/tmp/escaped", b"x", 0o644, 0)
                .bytes(),
        ),
        (
            "hard link out of the tree",
            Layer::new()
                .hostile(tar::EntryType::Link, "passwd", "../../../etc/passwd", b"")
                .bytes(),
        ),
    ];
    for (what, layer) in cases {
        let t = tree();
        let err = apply(t.path(), &[layer]).err();
        assert!(
            matches!(err, Some(UnpackError::Escape { .. })),
            "{what}: {err:?}"
        );
        assert!(
            std::fs::read_dir(outside.path()).unwrap().next().is_none(),
            "{what}"
        );
    }
}

#[test]
fn refusals() {
    type Case = (&'static str, Vec<u8>, fn(&UnpackError) -> bool);
    let cases: Vec<Case> = vec![
        (
            "device node",
            Layer::new().raw(tar::EntryType::Char, "dev/kmem").bytes(),
            |e| matches!(e, UnpackError::DeviceNode { .. }),
        ),
        (
            "block device",
            Layer::new().raw(tar::EntryType::Block, "dev/sda").bytes(),
            |e| matches!(e, UnpackError::DeviceNode { .. }),
        ),
        (
            "owner outside the range",
            Layer::new().file("f", b"x", 0o644, 70_000).bytes(),
            |e| matches!(e, UnpackError::BadEntry { .. }),
        ),
        (
            "hard link to nothing",
            Layer::new()
                .link(tar::EntryType::Link, "a", "missing")
                .bytes(),
            |e| matches!(e, UnpackError::BadEntry { .. }),
        ),
        (
            "layer bomb: a declared size past the limit",
            bomb(1 << 40),
            |e| matches!(e, UnpackError::TooLarge { .. }),
        ),
    ];
    for (what, layer, ok) in cases {
        let t = tree();
        let err = apply(t.path(), &[layer]).err();
        assert!(err.as_ref().is_some_and(ok), "{what}: {err:?}");
    }
}

/// A tar whose only header declares `size` bytes and carries none.
fn bomb(size: u64) -> Vec<u8> {
    let mut h = Layer::header(tar::EntryType::Regular, 0o644, 0);
    h.set_path("huge").unwrap();
    h.set_size(size);
    h.set_cksum();
    let mut v = h.as_bytes().to_vec();
    v.extend_from_slice(&[0u8; 1024]);
    v
}

#[test]
fn too_many_entries() {
    let t = tree();
    let mut l = Layer::new();
    for i in 0..20 {
        l = l.file(&format!("f{i}"), b"", 0o644, 0);
    }
    let l = l.bytes();
    let mut u = Unpacker::open(
        t.path(),
        UnpackLimits {
            max_bytes: 1 << 20,
            max_entries: 10,
        },
    )
    .unwrap();
    assert!(matches!(
        u.apply_layer(1, &l[..], &diff_id(&l)),
        Err(UnpackError::TooLarge { .. })
    ));
}

#[test]
fn compressed_layers_and_their_digests() {
    let l = Layer::new().file("hello", b"world", 0o644, 0).bytes();
    let id = diff_id(&l);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&l).unwrap();
    let gz = gz.finish().unwrap();
    let zst = zstd::encode_all(&l[..], 3).unwrap();
    for blob in [&gz, &zst] {
        let t = tree();
        let mut u = Unpacker::open(t.path(), LIMITS).unwrap();
        u.apply_layer(1, &blob[..], &id).unwrap();
        assert_eq!(std::fs::read(t.path().join("hello")).unwrap(), b"world");
    }
    // The config says another content: refused.
    let t = tree();
    let mut u = Unpacker::open(t.path(), LIMITS).unwrap();
    assert!(matches!(
        u.apply_layer(1, &gz[..], &format!("sha256:{}", "0".repeat(64))),
        Err(UnpackError::DiffIdMismatch { .. })
    ));
    // Truncated: refused.
    let t = tree();
    let mut u = Unpacker::open(t.path(), LIMITS).unwrap();
    assert!(matches!(
        u.apply_layer(1, &gz[..gz.len() / 2], &id),
        Err(UnpackError::BadLayer { .. })
    ));
}

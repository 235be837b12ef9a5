//! The file-level diff of two guest ext4 images, on images made with `mkfs.ext4 -d` from
//! temporary trees; and what it does with corrupt, truncated and hostile images. Needs
//! e2fsprogs; runs as root (file ownership is copied into the images).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use space_core::{FileChange, FileChangeKind};
use space_storage::{diff_disk_images, StorageError, MAX_DIFF_DEPTH};

/// `mkfs.ext4 -d tree` into `image` (16 MiB), with a fixed creation time.
fn mkfs(tree: &Path, image: &Path) {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-I", "256", "-d"])
        .arg(tree)
        .arg(image)
        .arg("16M")
        .env("E2FSPROGS_FAKE_TIME", "1700000000")
        .output()
        .expect("mkfs.ext4 (e2fsprogs) is installed");
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn sh(script: &str, dir: &Path) {
    let st = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(st.success(), "{script}");
}

/// A temp dir with tree `a`, a copy `b` (`cp -a`: same modes, owners, mtimes) changed by
/// `change`, and their images.
struct Pair {
    dir: tempfile::TempDir,
}

impl Pair {
    fn new(build_a: &str, change_b: &str) -> Pair {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        sh(build_a, &dir.path().join("a"));
        sh("cp -a a b", dir.path());
        sh(change_b, &dir.path().join("b"));
        let p = Pair { dir };
        mkfs(&p.dir.path().join("a"), &p.a());
        mkfs(&p.dir.path().join("b"), &p.b());
        p
    }
    fn a(&self) -> PathBuf {
        self.dir.path().join("a.img")
    }
    fn b(&self) -> PathBuf {
        self.dir.path().join("b.img")
    }
}

fn change(path: &str, kind: FileChangeKind, before: Option<u64>, after: Option<u64>) -> FileChange {
    FileChange {
        path: path.into(),
        kind,
        size_before: before,
        size_after: after,
    }
}

const TREE: &str = "
    echo same > keep.txt
    mkdir -p sub/deep
    echo bye > sub/removed.txt
    echo v1 > sub/modified.txt
    echo still > sub/deep/unchanged
    echo file > replaced
    ln -s keep.txt link
    mkdir links hidden
    ln -s ../keep.txt links/l1
    ln -s ../keep.txt hidden/l2
    mkfifo pipe
    # a big directory (htree), unchanged
    mkdir many; i=0; while [ $i -lt 300 ]; do echo $i > many/f$i; i=$((i+1)); done
    touch -d '2020-01-02 03:04:05' keep.txt
";

#[test]
fn added_removed_modified_and_type_changed_exactly() {
    let p = Pair::new(
        TREE,
        "
        echo new > added.txt
        rm sub/removed.txt
        echo 'version 2' > sub/modified.txt
        rm replaced; mkdir replaced; echo in > replaced/inner
        ",
    );
    let (changes, truncated) = diff_disk_images(&p.a(), &p.b(), 1000).unwrap();
    use FileChangeKind::*;
    assert_eq!(
        changes,
        vec![
            change("/added.txt", Added, None, Some(4)),
            change("/replaced", TypeChanged, Some(5), Some(4096)),
            change("/replaced/inner", Added, None, Some(3)),
            change("/sub/modified.txt", Modified, Some(3), Some(10)),
            change("/sub/removed.txt", Removed, Some(4), None),
        ]
    );
    assert!(!truncated);

    // The other way round, everything flips.
    let (back, _) = diff_disk_images(&p.b(), &p.a(), 1000).unwrap();
    let kinds: Vec<_> = back.iter().map(|c| (c.path.as_str(), c.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            ("/added.txt", Removed),
            ("/replaced", TypeChanged),
            ("/replaced/inner", Removed),
            ("/sub/modified.txt", Modified),
            ("/sub/removed.txt", Added),
        ]
    );

    // An image against itself: nothing.
    assert_eq!(
        diff_disk_images(&p.a(), &p.a(), 1000).unwrap(),
        (vec![], false)
    );

    // The limit cuts the list in path order and says so.
    let (cut, truncated) = diff_disk_images(&p.a(), &p.b(), 2).unwrap();
    assert_eq!(cut, changes[..2]);
    assert!(truncated);
    let (exact, truncated) = diff_disk_images(&p.a(), &p.b(), 5).unwrap();
    assert_eq!((exact.len(), truncated), (5, false));
    let (none, truncated) = diff_disk_images(&p.a(), &p.b(), 0).unwrap();
    assert!(none.is_empty() && truncated);
}

#[test]
fn metadata_only_changes_and_symlink_targets() {
    let p = Pair::new(
        TREE,
        "
        chmod 600 keep.txt
        chown 1000:1000 sub/deep/unchanged
        chmod 700 many
        # same length target, same mtime: only the target differs (its directory changed)
        ln -sfn ../keep.txx links/l1
        touch -h -r ../a/links/l1 links/l1
        # (mkfs.ext4 -d keeps whole seconds only: make the directory's change visible)
        touch -d '2021-01-01' links
        # the same, with the directory's mtime put back too: not visible by design
        ln -sfn ../keep.txx hidden/l2
        touch -h -r ../a/hidden/l2 hidden/l2
        touch -r ../a/hidden hidden
        # contents changed but size and mtime put back: not visible by design
        echo v2 > sub/modified.txt
        touch -r ../a/sub/modified.txt sub/modified.txt
        # a directory whose entries changed but not itself: its mtime does not count
        touch sub/deep/new; rm sub/deep/new
        ",
    );
    let (changes, truncated) = diff_disk_images(&p.a(), &p.b(), 1000).unwrap();
    let got: Vec<_> = changes.iter().map(|c| (c.path.as_str(), c.kind)).collect();
    assert_eq!(
        got,
        vec![
            ("/keep.txt", FileChangeKind::Modified),
            ("/links/l1", FileChangeKind::Modified),
            ("/many", FileChangeKind::Modified),
            ("/sub/deep/unchanged", FileChangeKind::Modified),
        ]
    );
    assert!(!truncated);
}

#[test]
fn deep_trees_stop_at_the_depth_bound() {
    let p = Pair::new(
        "echo x > top",
        "i=0; d=.; while [ $i -lt 70 ]; do d=$d/d; i=$((i+1)); done; mkdir -p $d",
    );
    let (changes, truncated) = diff_disk_images(&p.a(), &p.b(), 1000).unwrap();
    assert_eq!(changes.len(), MAX_DIFF_DEPTH);
    assert!(changes.iter().all(|c| c.kind == FileChangeKind::Added));
    assert_eq!(
        changes.last().unwrap().path,
        "/d".repeat(MAX_DIFF_DEPTH),
        "the deepest reported path"
    );
    assert!(truncated, "a skipped subtree marks the diff truncated");
}

fn is_ext4_error(r: Result<(Vec<FileChange>, bool), StorageError>) -> bool {
    match r {
        Err(StorageError::Ext4 { message, .. }) => {
            assert!(
                !message.contains("unexpectedly"),
                "the reader panicked: {message}"
            );
            true
        }
        Err(StorageError::Io { .. }) => false,
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(_) => false,
    }
}

#[test]
fn corrupt_and_truncated_images_are_errors_not_panics() {
    let p = Pair::new(TREE, "echo new > added.txt");
    let dir = p.dir.path();

    // Random bytes.
    let random = dir.join("random.img");
    let mut bytes = vec![0u8; 4 << 20];
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for b in bytes.iter_mut() {
        *b = next() as u8;
    }
    std::fs::write(&random, &bytes).unwrap();
    assert!(is_ext4_error(diff_disk_images(&p.a(), &random, 100)));
    assert!(is_ext4_error(diff_disk_images(&random, &p.b(), 100)));

    // Empty, and a valid image cut short.
    let empty = dir.join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    assert!(is_ext4_error(diff_disk_images(&p.a(), &empty, 100)));
    let image = std::fs::read(p.b()).unwrap();
    for cut in [2048, 64 << 10, 1 << 20, 4 << 20] {
        let short = dir.join("short.img");
        std::fs::write(&short, &image[..cut]).unwrap();
        let r = diff_disk_images(&p.a(), &short, 100);
        assert!(r.is_err(), "cut at {cut}: {r:?}");
        assert!(is_ext4_error(r), "cut at {cut}");
    }

    // A missing image is an I/O error naming it.
    let err = diff_disk_images(&p.a(), &dir.join("nope.img"), 100).unwrap_err();
    assert!(err.to_string().contains("nope.img"), "{err}");

    // Hostile metadata: random bytes written over the superblock, group descriptors, bitmaps
    // and inode tables (the first 2 MiB). Every outcome is fine except a panic or a hang.
    let fuzzed = dir.join("fuzzed.img");
    std::fs::write(&fuzzed, &image).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&fuzzed)
        .unwrap();
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..300 {
        let offset = next() % (2 << 20);
        let len = 1 + next() % 64;
        let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        f.write_all_at(&junk, offset).unwrap();
        match diff_disk_images(&p.a(), &fuzzed, 10_000) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(
                    is_ext4_error(Err(e)),
                    "corruption must be reported as an ext4 error"
                );
                failed += 1;
            }
        }
        // Put the image back now and then so later rounds hit a mostly valid filesystem.
        if next() % 4 == 0 {
            f.write_all_at(&image[..2 << 20], 0).unwrap();
        }
    }
    eprintln!("fuzz: {ok} diffs succeeded, {failed} reported corruption");
    assert!(failed > 0, "no corruption detected at all");
}

//! Helpers shared by the integration tests: a guard owning loop-mounted btrfs stores, templates
//! of random data, and `btrfs filesystem du` to check space accounting against.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use space_core::template::TemplateInfo;
use space_core::Resources;
use space_storage::{StorageError, Store, IMAGE_FILE};

pub const LOOP_SIZE: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// Owns a temp data directory and every store opened in it; unmounts and detaches on drop,
/// even when the test failed.
pub struct Guard {
    pub stores: Vec<Store>,
    pub dir: tempfile::TempDir,
}

impl Guard {
    pub fn new() -> Guard {
        Guard {
            stores: Vec::new(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn open(&mut self, sub: &str) -> Store {
        let s = Store::open(&self.dir.path().join(sub), LOOP_SIZE).unwrap();
        self.stores.push(s.clone());
        s
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for s in self.stores.iter().rev() {
            if let Err(e) = s.unmount() {
                eprintln!("guard: unmount of {} failed: {e}", s.root().display());
            }
        }
        space_storage::mountinfo::release_all_under(self.dir.path());
    }
}

/// Loop devices attached to `image`, as `losetup -j` reports them.
pub fn losetup_j(image: &Path) -> Vec<String> {
    let out = Command::new("losetup")
        .arg("-j")
        .arg(image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').next().map(str::to_owned))
        .collect()
}

pub fn info(name: &str, digest: &str) -> TemplateInfo {
    TemplateInfo {
        name: name.into(),
        digest: digest.into(),
        image_sha256: String::new(),
        image_size_mib: 64,
        kernel_digest: "aaaaaaaaaaaaaaaa".into(),
        default_resources: Resources::default(),
        default_user: "user".into(),
        description: "test".into(),
        built_at_ms: 0,
        image: None,
        env: Default::default(),
        workdir: None,
        image_command: Vec::new(),
        start: None,
    }
}

/// Builds a template whose image is `mib` MiB of random data.
pub fn random_template(store: &Store, name: &str, digest: &str, mib: u64) -> PathBuf {
    let t = store
        .templates()
        .build_or_wait(name, digest, |staging| {
            let mut f = std::fs::File::create(staging.join(IMAGE_FILE)).unwrap();
            let mut rng = std::fs::File::open("/dev/urandom").unwrap();
            std::io::copy(&mut std::io::Read::take(&mut rng, mib * MIB), &mut f).unwrap();
            f.flush().unwrap();
            Ok::<_, StorageError>(info(name, digest))
        })
        .unwrap();
    store.templates().image_path(&t)
}

/// (total, exclusive) bytes of a file per `btrfs filesystem du --raw`.
pub fn btrfs_du(store: &Store, file: &Path) -> (u64, u64) {
    assert!(Command::new("btrfs")
        .args(["filesystem", "sync"])
        .arg(store.root())
        .status()
        .unwrap()
        .success());
    let out = Command::new("btrfs")
        .args(["filesystem", "du", "--raw"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().nth(1).unwrap();
    let cols: Vec<u64> = line
        .split_whitespace()
        .take(2)
        .map(|c| c.parse().unwrap())
        .collect();
    (cols[0], cols[1])
}

//! Integration tests on real loop-mounted btrfs images: opening (and reopening) the store,
//! reflinked sandbox disks, build coordination across threads and processes, unmounting.
//! Needs root, btrfs-progs and util-linux.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use space_core::SandboxId;
use space_storage::{mountinfo, StorageError, Store, StoreBacking, IMAGE_FILE};

mod common;
use common::{btrfs_du, info, losetup_j, random_template, Guard, LOOP_SIZE, MIB};

#[test]
fn loop_store_lifecycle() {
    let mut g = Guard::new();
    let store = g.open("data");
    let StoreBacking::LoopImage { image, loop_device } = store.backing().clone() else {
        panic!(
            "/tmp is not btrfs here, expected a loop image, got {:?}",
            store.backing()
        )
    };
    // Mounted btrfs from our loop device at the root; the image is sparse.
    let mounts = mountinfo::read().unwrap();
    let m = mountinfo::mount_at(&mounts, store.root()).expect("store root is a mount point");
    assert_eq!(
        (m.fstype.as_str(), m.source.as_str()),
        ("btrfs", loop_device.as_str())
    );
    assert!(space_storage::is_btrfs(store.root()).unwrap());
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&image).unwrap();
    assert_eq!(meta.len(), LOOP_SIZE);
    assert!(meta.blocks() * 512 < LOOP_SIZE / 4, "image is not sparse");
    assert_eq!(losetup_j(&image), vec![loop_device.clone()]);

    // Reopening reuses the mount: same loop device, no second one.
    let again = g.open("data");
    assert_eq!(again.backing(), store.backing());
    assert_eq!(losetup_j(&image), vec![loop_device.clone()]);

    // A sandbox disk is a reflink, grown sparsely to the requested size.
    let tpl = random_template(&store, "t", "1111111111111111", 64);
    let id = SandboxId::generate();
    let disk = store.create_sandbox_disk(&id, &tpl, 256).unwrap();
    assert_eq!(disk, store.sandbox_dir(&id).join("rootfs.ext4"));
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 256 * MIB);
    let (total, exclusive) = btrfs_du(&store, &disk);
    assert_eq!(
        (total, exclusive),
        (64 * MIB, 0),
        "disk shares all its extents with the template"
    );
    assert_eq!(
        std::fs::read(&disk).unwrap()[..(64 * MIB) as usize],
        std::fs::read(&tpl).unwrap()[..]
    );
    assert!(matches!(
        store.create_sandbox_disk(&id, &tpl, 256),
        Err(StorageError::DiskExists(_))
    ));
    // Never smaller than the template.
    let id2 = SandboxId::generate();
    let disk2 = store.create_sandbox_disk(&id2, &tpl, 1).unwrap();
    assert_eq!(std::fs::metadata(&disk2).unwrap().len(), 64 * MIB);

    store.remove_sandbox_dir(&id).unwrap();
    store.remove_sandbox_dir(&id).unwrap();
    assert!(!store.sandbox_dir(&id).exists());

    // Busy while a file is open; clean after.
    let open_file = std::fs::File::open(&disk2).unwrap();
    assert!(matches!(store.unmount(), Err(StorageError::Busy { .. })));
    drop(open_file);
    store.unmount().unwrap();
    assert!(mountinfo::mount_at(&mountinfo::read().unwrap(), store.root()).is_none());
    assert!(losetup_j(&image).is_empty(), "loop device left behind");
    store.unmount().unwrap(); // idempotent

    // Reopen after unmount: the image keeps its contents.
    let third = g.open("data");
    assert!(third.templates().get("t").unwrap().is_some());
    assert!(third.sandbox_dir(&id2).join("rootfs.ext4").exists());
}

#[test]
fn build_or_wait_from_eight_threads_builds_once() {
    let mut g = Guard::new();
    let store = g.open("data");
    let count = Arc::new(AtomicUsize::new(0));
    let digest = "abcdefabcdefabcdef";
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (templates, count) = (store.templates(), count.clone());
            std::thread::spawn(move || {
                templates
                    .build_or_wait("busy", digest, |staging| {
                        count.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(300));
                        std::fs::write(staging.join(IMAGE_FILE), vec![7u8; 1 << 20]).unwrap();
                        Ok::<_, StorageError>(info("busy", digest))
                    })
                    .unwrap()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap().digest, digest);
    }
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(store.templates().list().unwrap().len(), 1);
}

const CHILD_ENV: &str = "SPACE_STORAGE_TEST_CHILD_TEMPLATES";

/// Not a test on its own: the body of each child process in `two_processes_build_once`.
#[test]
#[ignore]
fn child_build() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let templates = space_storage::TemplateStore::new(dir.clone());
    templates
        .build_or_wait("proc", "fedcbafedcbafedcba", |staging| {
            // Record the build in a shared log; only one process may ever append.
            let mut log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(Path::new(&dir).join("builds.log"))
                .unwrap();
            writeln!(log, "{}", std::process::id()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(500));
            std::fs::write(staging.join(IMAGE_FILE), b"img").unwrap();
            Ok::<_, StorageError>(info("proc", "fedcbafedcbafedcba"))
        })
        .unwrap();
}

#[test]
fn two_processes_build_once() {
    let mut g = Guard::new();
    let store = g.open("data");
    let dir = store.templates().dir().to_owned();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "child_build", "--ignored", "--nocapture"])
                .env(CHILD_ENV, &dir)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let log = std::fs::read_to_string(dir.join("builds.log")).unwrap();
    assert_eq!(log.lines().count(), 1, "built more than once: {log}");
    assert_eq!(
        store.templates().get("proc").unwrap().unwrap().digest,
        "fedcbafedcbafedcba"
    );
}

#[test]
fn native_store_and_cross_store_rules() {
    let mut g = Guard::new();
    let outer = g.open("outer");
    // A data directory inside a btrfs: the store is a plain directory, no loop image.
    let native = g.open("outer/store/nested");
    assert_eq!(native.backing(), &StoreBacking::Native);
    assert_eq!(native.root(), outer.root().join("nested/store"));
    let tpl = random_template(&native, "n", "2222222222222222", 8);
    let id = SandboxId::generate();
    native.create_sandbox_disk(&id, &tpl, 16).unwrap();
    native.unmount().unwrap(); // no-op

    // Another loop store is another filesystem: a disk cannot be a reflink of it, and the
    // store says so instead of copying.
    let other = g.open("other");
    let err = other
        .create_sandbox_disk(&SandboxId::generate(), &tpl, 16)
        .unwrap_err();
    assert!(matches!(err, StorageError::Reflink { .. }), "{err}");
    assert!(err.to_string().contains("same btrfs"), "{err}");
    // Templates can still be shared between them, by copy.
    let imported = other.templates().import(&native.templates(), "n").unwrap();
    assert_eq!(
        std::fs::read(other.templates().image_path(&imported)).unwrap(),
        std::fs::read(&tpl).unwrap()
    );
    other
        .create_sandbox_disk(
            &SandboxId::generate(),
            &other.templates().image_path(&imported),
            16,
        )
        .unwrap();
}

#[test]
fn concurrent_opens_share_one_mount() {
    let mut g = Guard::new();
    let data = g.dir.path().join("data");
    let stores: Vec<Store> = (0..4)
        .map(|_| {
            let data = data.clone();
            std::thread::spawn(move || Store::open(&data, LOOP_SIZE))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    g.stores.extend(stores.iter().cloned());
    for s in &stores[1..] {
        assert_eq!(s.backing(), stores[0].backing());
    }
    let StoreBacking::LoopImage { image, .. } = stores[0].backing() else {
        panic!("expected a loop store")
    };
    assert_eq!(losetup_j(image).len(), 1);
    let mounts = mountinfo::read().unwrap();
    assert_eq!(
        mounts
            .iter()
            .filter(|m| m.mount_point == stores[0].root())
            .count(),
        1
    );
}

//! Snapshots on a real loop-mounted btrfs: exclusive bytes from FIEMAP, the two-phase
//! snapshot directory (commit, abort, drop, crash debris), listing, deletion, and cloning a
//! snapshot disk for rollback and fork. Needs root, btrfs-progs and util-linux.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use space_core::snapshot::{SnapshotKind, SnapshotTrigger};
use space_core::{SandboxId, SnapshotId, SnapshotInfo};
use space_storage::{
    exclusive_bytes, extent_usage, ExistingDisk, SnapshotDisk, SnapshotSizes, StorageError, Store,
    SNAPSHOT_DISK_FILE, SNAPSHOT_SEALED_DISK_FILE,
};

mod common;
use common::{btrfs_du, random_template, Guard, MIB};

fn random_bytes(len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    let mut f = std::fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut f, &mut v).unwrap();
    v
}

/// Overwrites `len` bytes at `offset` with random data and fsyncs.
fn overwrite(path: &Path, offset: u64, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&random_bytes(len), offset).unwrap();
    f.sync_all().unwrap();
}

fn info(sandbox: &SandboxId, id: &SnapshotId, kind: SnapshotKind, at: i64) -> SnapshotInfo {
    SnapshotInfo {
        id: id.clone(),
        sandbox_id: sandbox.clone(),
        kind,
        trigger: SnapshotTrigger::Manual,
        created_at_ms: at,
        exclusive_bytes: 12345, // filled in by commit
        total_bytes: 0,
        label: None,
        persistent: false,
        stored: false,
    }
}

#[test]
fn exclusive_bytes_of_reflinks() {
    let mut g = Guard::new();
    let store = g.open("data");
    let a = store.root().join("a");
    let b = store.root().join("b");
    let mut f = std::fs::File::create(&a).unwrap();
    f.write_all(&random_bytes(8 * MIB)).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        exclusive_bytes(&a).unwrap(),
        8 * MIB,
        "a fresh file is all its own"
    );

    space_storage::reflink(&a, &b).unwrap();
    assert_eq!(exclusive_bytes(&a).unwrap(), 0);
    assert_eq!(exclusive_bytes(&b).unwrap(), 0);
    assert_eq!(
        extent_usage(&b).unwrap().shared,
        8 * MIB,
        "all of it shared"
    );

    // Overwrite 1 MiB of one copy: that copy holds ~1 MiB alone. The other still shares the
    // whole original extent (btrfs frees an extent only when no file references any of it).
    overwrite(&b, 3 * MIB, MIB);
    let ex_b = exclusive_bytes(&b).unwrap();
    assert!((MIB..MIB + 64 * 1024).contains(&ex_b), "b exclusive {ex_b}");
    assert_eq!(exclusive_bytes(&a).unwrap(), 0);
    // Agrees with btrfs' own accounting.
    assert_eq!(btrfs_du(&store, &b).1, ex_b);
    assert_eq!(btrfs_du(&store, &a).1, 0);

    // Holes are not space: a sparse 1 GiB file with 1 MiB written holds 1 MiB.
    let sparse = store.root().join("sparse");
    let mut f = std::fs::File::create(&sparse).unwrap();
    f.set_len(1 << 30).unwrap();
    f.seek(SeekFrom::Start(512 * MIB)).unwrap();
    f.write_all(&random_bytes(MIB)).unwrap();
    f.sync_all().unwrap();
    assert_eq!(exclusive_bytes(&sparse).unwrap(), MIB);
    // Dirty data is flushed before mapping: counted without an explicit fsync.
    let dirty = store.root().join("dirty");
    std::fs::write(&dirty, random_bytes(2 * MIB)).unwrap();
    assert_eq!(exclusive_bytes(&dirty).unwrap(), 2 * MIB);

    let err = exclusive_bytes(&store.root().join("missing")).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn a_delta_of_a_reflink_reads_only_what_was_written() {
    use space_storage::delta::{apply_delta, write_delta, DELTA_BLOCK};
    let mut g = Guard::new();
    let store = g.open("data");
    let (base, disk) = (store.root().join("base"), store.root().join("disk"));
    std::fs::write(&base, random_bytes(32 * MIB)).unwrap();
    space_storage::reflink(&base, &disk).unwrap();
    // The sandbox writes 1 MiB at 5 MiB and 10 bytes at 20 MiB, and grows its disk to
    // 48 MiB with 4 KiB written near its new end.
    overwrite(&disk, 5 * MIB, MIB);
    overwrite(&disk, 20 * MIB + 7, 10);
    let f = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    f.set_len(48 * MIB).unwrap();
    drop(f);
    overwrite(&disk, 47 * MIB, 4096);

    // Known the same from the maps: everything but those three places.
    let same = space_storage::identical_ranges(&base, &disk).unwrap();
    let known: u64 = same.iter().map(|r| r.end - r.start).sum();
    let written = MIB + 4096 + 4096;
    assert!(
        known >= 48 * MIB - written - 2 * 4096 && known <= 48 * MIB - written + 4096,
        "{known} bytes known the same of {} ({same:?})",
        48 * MIB
    );
    for place in [5 * MIB, 20 * MIB + 7, 47 * MIB] {
        assert!(
            !same.iter().any(|r| r.contains(&place)),
            "{place} is written, not the same"
        );
    }

    // The delta holds exactly the changed blocks, and rebuilds the disk.
    let mut delta = Vec::new();
    let stats = write_delta(&base, "base", &disk, &mut delta).unwrap();
    assert_eq!(stats.disk_size, 48 * MIB);
    assert_eq!(stats.changed_blocks, MIB / DELTA_BLOCK as u64 + 2);
    let rebuilt = store.root().join("rebuilt");
    space_storage::reflink(&base, &rebuilt).unwrap();
    apply_delta(&mut &delta[..], "base", &rebuilt, 64 * MIB).unwrap();
    assert!(std::fs::read(&rebuilt).unwrap() == std::fs::read(&disk).unwrap());
    // A copy that shares nothing with its base gives the same delta, read the long way.
    let copy = store.root().join("copy");
    std::fs::write(&copy, std::fs::read(&disk).unwrap()).unwrap();
    let mut long_way = Vec::new();
    assert_eq!(
        write_delta(&base, "base", &copy, &mut long_way).unwrap(),
        stats
    );
    assert!(long_way == delta);
}

/// A sandbox with a 64 MiB random template disk.
fn sandbox(store: &Store) -> (SandboxId, std::path::PathBuf) {
    let tpl = random_template(store, "t", "1111111111111111", 64);
    let id = SandboxId::generate();
    let disk = store.create_sandbox_disk(&id, &tpl, 128).unwrap();
    (id, disk)
}

fn snapshot_dir_names(store: &Store, id: &SandboxId) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.snapshots_dir(id))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn snapshot_lifecycle() {
    let mut g = Guard::new();
    let store = g.open("data");
    let (sbx, disk) = sandbox(&store);
    assert!(store
        .list_snapshots(&sbx, SnapshotSizes::Refresh)
        .unwrap()
        .is_empty());
    // 4 MiB of the sandbox's own data (not shared with the template).
    overwrite(&disk, 0, 4 * MIB);

    // A disk snapshot.
    let s1 = SnapshotId::generate();
    let p = store.begin_snapshot(&sbx, &s1).unwrap();
    assert!(p.dir().ends_with(format!("snapshots/.pending-{s1}")));
    p.reflink_disk(&disk).unwrap();
    // Not listed before commit.
    assert!(store
        .list_snapshots(&sbx, SnapshotSizes::Stored)
        .unwrap()
        .is_empty());
    assert!(store.snapshot(&sbx, &s1).unwrap().is_none());
    let mut i1 = info(&sbx, &s1, SnapshotKind::Disk, 1000);
    i1.label = Some("before rm -rf".into());
    let c1 = p.commit(i1).unwrap();
    assert_eq!(c1.total_bytes, 128 * MIB);
    assert_eq!(c1.exclusive_bytes, 0, "a fresh reflink holds nothing alone");
    assert_eq!(snapshot_dir_names(&store, &sbx), vec![s1.to_string()]);

    // A checkpoint, with a state file the caller writes.
    let s2 = SnapshotId::generate();
    let p = store.begin_snapshot(&sbx, &s2).unwrap();
    p.reflink_disk(&disk).unwrap();
    std::fs::write(p.state_path(), random_bytes(MIB)).unwrap();
    let c2 = p
        .commit(info(&sbx, &s2, SnapshotKind::Checkpoint, 500))
        .unwrap();
    assert_eq!(c2.total_bytes, 129 * MIB);
    assert_eq!(c2.exclusive_bytes, MIB, "the state file is its own");

    // Listed oldest first, committed only.
    let list = store.list_snapshots(&sbx, SnapshotSizes::Stored).unwrap();
    assert_eq!(list, vec![c2.clone(), c1.clone()]);
    let (got, paths) = store.snapshot(&sbx, &s2).unwrap().unwrap();
    assert_eq!(got, c2);
    assert_eq!(
        paths.disk,
        SnapshotDisk::Image(paths.dir.join(SNAPSHOT_DISK_FILE))
    );
    assert!(paths.state.is_some() && paths.memory.is_none());
    assert!(store
        .snapshot(&sbx, &s1)
        .unwrap()
        .unwrap()
        .1
        .state
        .is_none());

    // The sandbox overwrites its own 4 MiB: now only the snapshots hold the old data. Both
    // reference it, so neither holds it alone...
    overwrite(&disk, 0, 4 * MIB);
    let list = store.list_snapshots(&sbx, SnapshotSizes::Refresh).unwrap();
    assert_eq!(list[0].exclusive_bytes, MIB);
    assert_eq!(list[1].exclusive_bytes, 0);
    // ...until one is deleted: exclusive bytes change as other snapshots go.
    assert!(store.delete_snapshot(&sbx, &s2).unwrap());
    assert!(!store.delete_snapshot(&sbx, &s2).unwrap(), "idempotent");
    let list = store.list_snapshots(&sbx, SnapshotSizes::Refresh).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].exclusive_bytes, 4 * MIB);
    assert_eq!(list[0].label.as_deref(), Some("before rm -rf"));
    assert_eq!(snapshot_dir_names(&store, &sbx), vec![s1.to_string()]);

    // Rollback: the sandbox disk replaced by a clone of the snapshot.
    let snap_disk = store
        .snapshot(&sbx, &s1)
        .unwrap()
        .unwrap()
        .1
        .disk
        .path()
        .to_owned();
    store
        .clone_snapshot_disk(&snap_disk, &disk, 128, ExistingDisk::Replace)
        .unwrap();
    assert_eq!(
        std::fs::read(&disk).unwrap(),
        std::fs::read(&snap_disk).unwrap()
    );
    assert_eq!(exclusive_bytes(&disk).unwrap(), 0);
    // Fork: a new sandbox's disk, grown; an existing disk is never overwritten.
    let child = SandboxId::generate();
    let child_disk = store
        .sandbox_dir(&child)
        .join(space_storage::SANDBOX_DISK_FILE);
    store
        .clone_snapshot_disk(&snap_disk, &child_disk, 256, ExistingDisk::Refuse)
        .unwrap();
    assert_eq!(std::fs::metadata(&child_disk).unwrap().len(), 256 * MIB);
    assert!(matches!(
        store.clone_snapshot_disk(&snap_disk, &child_disk, 256, ExistingDisk::Refuse),
        Err(StorageError::DiskExists(_))
    ));
    // create_sandbox_disk from a snapshot disk works the same way.
    let child2 = SandboxId::generate();
    store.create_sandbox_disk(&child2, &snap_disk, 64).unwrap();
    assert_eq!(
        std::fs::read_dir(store.sandbox_dir(&child))
            .unwrap()
            .count(),
        1,
        "no temporary left behind"
    );

    // Removing the sandbox removes its snapshots.
    store.remove_sandbox_dir(&sbx).unwrap();
    assert!(store
        .list_snapshots(&sbx, SnapshotSizes::Refresh)
        .unwrap()
        .is_empty());
}

#[test]
fn a_disk_sealed_at_rest_is_the_snapshots_only_disk() {
    let mut g = Guard::new();
    let store = g.open("data");
    let (sbx, disk) = sandbox(&store);
    let id = SnapshotId::generate();
    let p = store.begin_snapshot(&sbx, &id).unwrap();
    // The caller seals the reflink into its own file and removes the reflink.
    p.reflink_disk(&disk).unwrap();
    std::fs::write(p.sealed_disk_path(), random_bytes(MIB)).unwrap();
    std::fs::remove_file(p.disk_path()).unwrap();
    let committed = p.commit(info(&sbx, &id, SnapshotKind::Disk, 1)).unwrap();
    assert_eq!(
        committed.total_bytes, MIB,
        "the sealed delta is all it holds"
    );
    let (_, paths) = store.snapshot(&sbx, &id).unwrap().unwrap();
    assert_eq!(
        paths.disk,
        SnapshotDisk::SealedDelta(paths.dir.join(SNAPSHOT_SEALED_DISK_FILE))
    );
    assert!(!paths.dir.join(SNAPSHOT_DISK_FILE).exists());
}

#[test]
fn failed_aborted_and_crashed_snapshots_are_never_listed() {
    let mut g = Guard::new();
    let store = g.open("data");
    let (sbx, disk) = sandbox(&store);

    // No such sandbox.
    assert!(matches!(
        store.begin_snapshot(&SandboxId::generate(), &SnapshotId::generate()),
        Err(StorageError::NotFound { .. })
    ));

    // Abort and drop remove the pending directory.
    let p = store.begin_snapshot(&sbx, &SnapshotId::generate()).unwrap();
    p.reflink_disk(&disk).unwrap();
    p.abort().unwrap();
    {
        let p = store.begin_snapshot(&sbx, &SnapshotId::generate()).unwrap();
        p.reflink_disk(&disk).unwrap();
    }
    assert!(snapshot_dir_names(&store, &sbx).is_empty());

    // Commit refuses: no disk; metadata of another snapshot or sandbox; a bad label. Each
    // time nothing is left.
    let id = SnapshotId::generate();
    let p = store.begin_snapshot(&sbx, &id).unwrap();
    let err = p
        .commit(info(&sbx, &id, SnapshotKind::Disk, 1))
        .unwrap_err();
    assert!(err.to_string().contains("disk.raw"), "{err}");
    // Both forms of a disk at once: which one is the snapshot's is not clear.
    let p = store.begin_snapshot(&sbx, &id).unwrap();
    p.reflink_disk(&disk).unwrap();
    std::fs::write(p.sealed_disk_path(), b"sealed").unwrap();
    let err = p
        .commit(info(&sbx, &id, SnapshotKind::Disk, 1))
        .unwrap_err();
    assert!(err.to_string().contains("both"), "{err}");
    let p = store.begin_snapshot(&sbx, &id).unwrap();
    p.reflink_disk(&disk).unwrap();
    let other = SnapshotId::generate();
    assert!(matches!(
        p.commit(info(&sbx, &other, SnapshotKind::Disk, 1)),
        Err(StorageError::InvalidSnapshot { .. })
    ));
    let p = store.begin_snapshot(&sbx, &id).unwrap();
    p.reflink_disk(&disk).unwrap();
    assert!(p
        .commit(info(&SandboxId::generate(), &id, SnapshotKind::Disk, 1))
        .is_err());
    let p = store.begin_snapshot(&sbx, &id).unwrap();
    p.reflink_disk(&disk).unwrap();
    let mut bad = info(&sbx, &id, SnapshotKind::Disk, 1);
    bad.label = Some("x".repeat(200));
    assert!(matches!(p.commit(bad), Err(StorageError::Snapshot(_))));
    assert!(snapshot_dir_names(&store, &sbx).is_empty());

    // Ids are unique: a committed or pending id cannot be begun again.
    let p = store.begin_snapshot(&sbx, &id).unwrap();
    assert!(matches!(
        store.begin_snapshot(&sbx, &id),
        Err(StorageError::SnapshotExists(_))
    ));
    p.reflink_disk(&disk).unwrap();
    p.commit(info(&sbx, &id, SnapshotKind::Disk, 1)).unwrap();
    assert!(matches!(
        store.begin_snapshot(&sbx, &id),
        Err(StorageError::SnapshotExists(_))
    ));

    // A crash mid-snapshot and mid-delete leaves debris (simulated: a pending snapshot that
    // is never dropped, a half-deleted directory); it is not listed and recovery removes it.
    let crashed = store.begin_snapshot(&sbx, &SnapshotId::generate()).unwrap();
    crashed.reflink_disk(&disk).unwrap();
    std::mem::forget(crashed);
    let half_deleted = store
        .snapshots_dir(&sbx)
        .join(format!(".deleting-{}-abcdefgh", SnapshotId::generate()));
    std::fs::create_dir(&half_deleted).unwrap();
    std::fs::write(half_deleted.join("disk.raw"), b"x").unwrap();
    // Unreadable metadata: skipped with a warning by list, an error for a direct lookup.
    let broken = SnapshotId::generate();
    let p = store.begin_snapshot(&sbx, &broken).unwrap();
    p.reflink_disk(&disk).unwrap();
    p.commit(info(&sbx, &broken, SnapshotKind::Disk, 2))
        .unwrap();
    std::fs::write(
        store
            .snapshots_dir(&sbx)
            .join(broken.as_str())
            .join("meta.json"),
        b"{not json",
    )
    .unwrap();
    // A stray directory that is not a snapshot id.
    std::fs::create_dir(store.snapshots_dir(&sbx).join("junk")).unwrap();

    let list = store.list_snapshots(&sbx, SnapshotSizes::Refresh).unwrap();
    assert_eq!(list.iter().map(|i| &i.id).collect::<Vec<_>>(), vec![&id]);
    assert!(matches!(
        store.snapshot(&sbx, &broken),
        Err(StorageError::Metadata { .. })
    ));
    assert_eq!(store.remove_pending_snapshots(&sbx).unwrap(), 2);
    assert_eq!(store.remove_pending_snapshots(&sbx).unwrap(), 0);
    let mut left = snapshot_dir_names(&store, &sbx);
    left.sort();
    let mut want = vec![id.to_string(), broken.to_string(), "junk".to_string()];
    want.sort();
    assert_eq!(left, want);
    // A sandbox without snapshots: nothing to do.
    assert_eq!(
        store
            .remove_pending_snapshots(&SandboxId::generate())
            .unwrap(),
        0
    );
}

/// Takes a committed disk snapshot of `sbx`; persistent ones carry a source.json.
fn take(store: &Store, sbx: &SandboxId, disk: &Path, persistent: bool, at: i64) -> SnapshotInfo {
    let id = SnapshotId::generate();
    let p = store.begin_snapshot(sbx, &id).unwrap();
    p.reflink_disk(disk).unwrap();
    if persistent {
        p.write_source(format!("{{\"of\": \"{id}\"}}").as_bytes())
            .unwrap();
    }
    p.commit(SnapshotInfo {
        persistent,
        stored: false,
        ..info(sbx, &id, SnapshotKind::Disk, at)
    })
    .unwrap()
}

#[test]
fn persistent_snapshots_move_out_of_their_sandbox_whole_and_once() {
    use std::os::unix::fs::PermissionsExt;
    let mut g = Guard::new();
    let store = g.open("data");
    let (sbx, disk) = sandbox(&store);
    assert!(store
        .list_persistent_snapshots(SnapshotSizes::Stored)
        .unwrap()
        .is_empty());

    // A persistent snapshot is committed only with its source.
    let id = SnapshotId::generate();
    let p = store.begin_snapshot(&sbx, &id).unwrap();
    p.reflink_disk(&disk).unwrap();
    let err = p
        .commit(SnapshotInfo {
            persistent: true,
            stored: false,
            ..info(&sbx, &id, SnapshotKind::Disk, 1)
        })
        .unwrap_err();
    assert!(err.to_string().contains("source.json"), "{err}");

    let kept: Vec<SnapshotInfo> = (0..3)
        .map(|i| take(&store, &sbx, &disk, true, 10 + i))
        .collect();
    let gone = take(&store, &sbx, &disk, false, 20);
    let (_, paths) = store.snapshot(&sbx, &kept[0].id).unwrap().unwrap();
    let source = paths.source.clone().expect("a source");
    assert_eq!(
        std::fs::metadata(&source).unwrap().permissions().mode() & 0o777,
        0o600,
        "the source holds secrets"
    );
    assert_eq!(
        kept[0].total_bytes,
        128 * MIB,
        "the source is not counted as snapshot data"
    );
    assert!(store
        .snapshot(&sbx, &gone.id)
        .unwrap()
        .unwrap()
        .1
        .source
        .is_none());

    // A delete that a crash interrupts after the first move...
    assert!(store.persist_snapshot(&sbx, &kept[0].id).unwrap());
    assert!(
        !store.persist_snapshot(&sbx, &kept[0].id).unwrap(),
        "moved once"
    );
    let listed = |store: &Store| {
        let mut ids: Vec<SnapshotId> = store
            .list_persistent_snapshots(SnapshotSizes::Refresh)
            .unwrap()
            .into_iter()
            .map(|i| i.id)
            .collect();
        ids.extend(
            store
                .list_snapshots(&sbx, SnapshotSizes::Stored)
                .unwrap()
                .into_iter()
                .filter(|i| i.persistent)
                .map(|i| i.id),
        );
        ids.sort();
        ids
    };
    let mut want: Vec<SnapshotId> = kept.iter().map(|i| i.id.clone()).collect();
    want.sort();
    // ...has each snapshot in exactly one of the two places...
    assert_eq!(listed(&store), want);
    // ...and the resumed delete moves the rest, then removes the sandbox.
    for k in &kept {
        store.persist_snapshot(&sbx, &k.id).unwrap();
    }
    store.remove_sandbox_dir(&sbx).unwrap();
    assert_eq!(listed(&store), want);
    let list = store
        .list_persistent_snapshots(SnapshotSizes::Stored)
        .unwrap();
    assert_eq!(list, kept, "oldest first, metadata as committed");
    let (got, paths) = store.persistent_snapshot(&kept[1].id).unwrap().unwrap();
    assert_eq!(got, kept[1]);
    assert_eq!(
        space_storage::read_snapshot_source(&paths)
            .unwrap()
            .unwrap(),
        format!("{{\"of\": \"{}\"}}", kept[1].id).into_bytes()
    );
    // The moved disk is still a reflink: it reads as the sandbox's did.
    assert_eq!(
        std::fs::metadata(paths.disk.path()).unwrap().len(),
        128 * MIB
    );
    assert!(store.persistent_snapshot(&gone.id).unwrap().is_none());

    // Deleting: once; a half-deleted one is cleared at start.
    assert!(store.delete_persistent_snapshot(&kept[1].id).unwrap());
    assert!(!store.delete_persistent_snapshot(&kept[1].id).unwrap());
    std::fs::create_dir(
        store
            .persistent_snapshots_dir()
            .join(format!(".deleting-{}-abcdefgh", kept[2].id)),
    )
    .unwrap();
    assert_eq!(
        store
            .list_persistent_snapshots(SnapshotSizes::Stored)
            .unwrap()
            .len(),
        2
    );
    assert_eq!(store.remove_pending_persistent_snapshots().unwrap(), 1);
    assert_eq!(store.remove_pending_persistent_snapshots().unwrap(), 0);
}

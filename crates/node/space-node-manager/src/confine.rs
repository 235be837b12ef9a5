//! Where the node manager lets a request reach: the store and the run directory, and in the
//! store only the parts the sandbox manager may have changed.
//!
//! Every [`NodePath`] is resolved here, never by joining strings elsewhere. A path whose
//! existing part goes through a symlink is refused (the sandbox manager, or a guest through
//! it, could otherwise point a request at `/etc/shadow`). What may be *written*—a clone's
//! destination, a VM's disk, a shared memory file, a directory to remove—is narrower:
//! sandboxes, pool members, image builds in progress and persistent snapshots; never a
//! template, a kernel, a published memory image or the records.
//!
//! The check is made on the path as it is when the request arrives; a caller that owns a
//! directory on the way could swap in a symlink between the check and the use. So what
//! the node manager does in the directories the sandbox manager owns, it does acting as the
//! sandbox manager (`FileOwner::act_as`, `server.rs`): a symlink swapped in there leads
//! only where the sandbox manager itself may go. The directories above them (the data
//! directory, the store's root, templates, kernels, the run directory) are root's
//! (`ownership.rs`).

use std::path::{Component, Path, PathBuf};

use crate::protocol::{Area, NodePath, Refusal, RefusalCode, RelPath};

/// Store directories a request may write into (`images/.staging`: memory images being
/// built; they are published by a rename the node manager does not take part in;
/// `snapshots`: persistent snapshots whose sandbox is gone, the sandbox manager's own files,
/// where a stored snapshot downloaded onto the node gets its disk).
const WRITABLE_IN_STORE: [&str; 4] = ["sandboxes", "pool", "images/.staging", "snapshots"];

/// The areas of a node.
#[derive(Debug, Clone)]
pub struct Areas {
    store: PathBuf,
    run: PathBuf,
    fork_images: PathBuf,
    /// What the first component of a path among the fork images starts with.
    fork_prefix: String,
}

/// Whether a path is only read or also changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read (a clone's source, a kernel, a saved state).
    Read,
    /// Written, created or removed.
    Write,
}

impl Areas {
    /// The areas rooted at `store` (the store's root) and `run` (the node's run directory),
    /// with its fork images (named after `run`) in `fork_images`.
    pub fn new(store: &Path, run: &Path, fork_images: &Path) -> Self {
        Areas {
            store: store.to_owned(),
            run: run.to_owned(),
            fork_images: fork_images.to_owned(),
            fork_prefix: crate::fork_image_prefix(run),
        }
    }

    /// The root of `area`.
    pub fn root(&self, area: Area) -> &Path {
        match area {
            Area::Store => &self.store,
            Area::Run => &self.run,
            Area::ForkImages => &self.fork_images,
        }
    }

    /// The absolute path of `p`, if `access` to it is allowed.
    pub fn resolve(&self, p: &NodePath, access: Access) -> Result<PathBuf, Refusal> {
        if access == Access::Write && p.area == Area::Store {
            if !WRITABLE_IN_STORE.iter().any(|w| p.rel.is_under(w)) {
                return Err(refuse(
                    p,
                    "is not a sandbox's, a pool member's, an image build's or a persistent snapshot's",
                ));
            }
            // The top of a writable tree itself is not one sandbox's.
            if WRITABLE_IN_STORE.iter().any(|w| p.rel.as_str() == *w) {
                return Err(refuse(p, "is a whole area"));
            }
        }
        if p.area == Area::ForkImages
            && !p
                .rel
                .components()
                .next()
                .is_some_and(|c| c.starts_with(&self.fork_prefix))
        {
            return Err(refuse(p, "is not one of this node's fork images"));
        }
        let root = self.root(p.area);
        let mut at = root.to_owned();
        for c in p.rel.components() {
            at.push(c);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(refuse(p, "goes through a symlink"));
                }
                Ok(_) => {}
                // The rest is to be made.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => {
                    return Err(Refusal::new(
                        RefusalCode::Io,
                        format!("cannot inspect {p}: {e}"),
                    ))
                }
            }
        }
        Ok(root.join(p.rel.as_str()))
    }

    /// The [`NodePath`] naming absolute path `abs`, if it lies in an area.
    pub fn name(&self, abs: &Path) -> Result<NodePath, Refusal> {
        for area in [Area::Store, Area::Run, Area::ForkImages] {
            if let Ok(rest) = abs.strip_prefix(self.root(area)) {
                let parts: Option<Vec<&str>> = rest
                    .components()
                    .map(|c| match c {
                        Component::Normal(s) => s.to_str(),
                        _ => None,
                    })
                    .collect();
                let rel = parts
                    .map(|p| p.join("/"))
                    .ok_or_else(|| outside(abs))
                    .and_then(|s| RelPath::new(&s).map_err(|_| outside(abs)))?;
                return Ok(NodePath { area, rel });
            }
        }
        Err(outside(abs))
    }
}

fn refuse(p: &NodePath, why: &str) -> Refusal {
    Refusal::new(RefusalCode::Confinement, format!("{p} {why}"))
}

fn outside(abs: &Path) -> Refusal {
    Refusal::new(
        RefusalCode::Confinement,
        format!("{} is outside the store and run directories", abs.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(area: Area, rel: &str) -> NodePath {
        NodePath {
            area,
            rel: RelPath::new(rel).unwrap(),
        }
    }

    #[test]
    fn writes_reach_sandboxes_pool_and_image_builds_only() {
        let dir = tempfile::tempdir().unwrap();
        let areas = Areas::new(
            &dir.path().join("store"),
            &dir.path().join("run"),
            &dir.path().join("shm"),
        );
        for ok in [
            "sandboxes/sbx-1/rootfs.ext4",
            "pool/pool-1/disk",
            "images/.staging/abc-1/disk.raw",
        ] {
            assert!(
                areas.resolve(&path(Area::Store, ok), Access::Write).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "templates/abc/rootfs.ext4",
            "kernels/k/vmlinuz",
            "images/abc/memory",
            "records/sbx-1.json",
            "sandboxes",
            "sandboxesX/a",
        ] {
            let r = areas.resolve(&path(Area::Store, bad), Access::Write);
            assert_eq!(r.unwrap_err().code, RefusalCode::Confinement, "{bad}");
            // Reading them is fine.
            assert!(areas.resolve(&path(Area::Store, bad), Access::Read).is_ok());
        }
        assert!(areas
            .resolve(&path(Area::Run, "sbx-1"), Access::Write)
            .is_ok());
    }

    #[test]
    fn symlinks_on_the_way_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir_all(store.join("sandboxes/sbx-1")).unwrap();
        std::os::unix::fs::symlink("/etc", store.join("sandboxes/sbx-2")).unwrap();
        let areas = Areas::new(&store, &dir.path().join("run"), &dir.path().join("shm"));
        assert!(areas
            .resolve(&path(Area::Store, "sandboxes/sbx-1/x"), Access::Write)
            .is_ok());
        let r = areas.resolve(&path(Area::Store, "sandboxes/sbx-2/shadow"), Access::Read);
        assert_eq!(r.unwrap_err().code, RefusalCode::Confinement);
    }

    #[test]
    fn absolute_paths_are_named_only_inside_an_area() {
        let areas = Areas::new(
            Path::new("/d/store"),
            Path::new("/d/run"),
            Path::new("/dev/shm"),
        );
        let p = areas
            .name(Path::new("/d/store/sandboxes/sbx-1/rootfs.ext4"))
            .unwrap();
        assert_eq!(p, path(Area::Store, "sandboxes/sbx-1/rootfs.ext4"));
        assert_eq!(
            areas.name(Path::new("/d/run/sbx-1")).unwrap().area,
            Area::Run
        );
        for bad in ["/etc/passwd", "/d/store", "/d/store/../x", "/d/storeX/a"] {
            assert!(areas.name(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn fork_images_are_only_this_nodes() {
        let run = Path::new("/d/run");
        let areas = Areas::new(Path::new("/d/store"), run, Path::new("/dev/shm"));
        let ours = format!("/dev/shm/{}abc/memory", crate::fork_image_prefix(run));
        let p = areas.name(Path::new(&ours)).unwrap();
        assert_eq!(p.area, Area::ForkImages);
        assert!(areas.resolve(&p, Access::Write).is_ok());
        let theirs = path(Area::ForkImages, "space-fork-000000000000-abc/memory");
        assert_eq!(
            areas.resolve(&theirs, Access::Read).unwrap_err().code,
            RefusalCode::Confinement
        );
        let other = path(Area::ForkImages, "some-other-file");
        assert!(areas.resolve(&other, Access::Read).is_err());
    }
}

//! What a directory watch makes of inotify's records: which changes to report under which
//! names, which directories to start or stop watching. Pure; the watcher does the I/O.
//!
//! The tracker knows every watched directory by its watch descriptor and its path relative
//! to the watched root. The reported changes follow fsnotify: `IN_CREATE` → `create`,
//! `IN_MODIFY` → `write`, `IN_ATTRIB` → `chmod`, `IN_DELETE` → `remove`, `IN_MOVED_FROM` →
//! `rename` (old name), `IN_MOVED_TO` → `create` (new name). A directory moved away
//! (`IN_MOVED_FROM`) is remembered until the next record: if that is the matching
//! `IN_MOVED_TO`, the directory moved inside the tree and its subtree's paths change;
//! otherwise it left the tree and its watches go.

use std::collections::HashMap;

use space_core::files::watch::{FileChange, WATCH_ROOT_NAME};

use crate::files::inotify::RawEvent;

/// What the watcher should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Report a change of `name` (relative to the root).
    Change {
        /// Path relative to the watched root.
        name: String,
        /// What happened.
        change: FileChange,
    },
    /// Report that changes were lost.
    Overflow,
    /// A directory appeared in the tree: watch it and every directory below it, then report
    /// its `create` (so a reader that sees it can rely on the watch), followed, when it was
    /// `created`, by a `create` for each entry found (they may predate the watch).
    Watch {
        /// Path relative to the watched root.
        name: String,
        /// Created (rather than moved in).
        created: bool,
    },
    /// Stop watching these descriptors (a directory that left the tree, and its subtree).
    Unwatch(Vec<i32>),
    /// The watched root is gone: end the stream.
    End,
}

/// The state of one watch.
#[derive(Debug)]
pub struct Tracker {
    root_wd: i32,
    recursive: bool,
    /// Watched directories: descriptor → path relative to the root (`""` for the root).
    dirs: HashMap<i32, String>,
    /// A directory moved away by the last record: (cookie, its old relative path).
    moved_away: Option<(u32, String)>,
}

/// `dir/name`, or `name` at the root.
fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// `path` is `dir` or inside it.
fn within(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

impl Tracker {
    /// A tracker whose root is watched as `root_wd`.
    pub fn new(root_wd: i32, recursive: bool) -> Self {
        Tracker {
            root_wd,
            recursive,
            dirs: HashMap::from([(root_wd, String::new())]),
            moved_away: None,
        }
    }

    /// Records a new watch of the directory at `name` (relative to the root).
    pub fn add_dir(&mut self, wd: i32, name: String) {
        self.dirs.insert(wd, name);
    }

    /// Directories watched.
    pub fn dirs(&self) -> usize {
        self.dirs.len()
    }

    /// Whether a directory moved away waits for its possible other half.
    pub fn awaiting_move(&self) -> bool {
        self.moved_away.is_some()
    }

    /// Settles a directory moved away whose other half never came: it left the tree.
    pub fn settle(&mut self, out: &mut Vec<Step>) {
        if let Some((_, old)) = self.moved_away.take() {
            let gone: Vec<i32> = self
                .dirs
                .iter()
                .filter(|(_, p)| within(p, &old))
                .map(|(wd, _)| *wd)
                .collect();
            for wd in &gone {
                self.dirs.remove(wd);
            }
            if !gone.is_empty() {
                out.push(Step::Unwatch(gone));
            }
        }
    }

    /// The paths of a directory that moved inside the tree, and of its subtree, change.
    fn moved(&mut self, old: &str, new: &str) {
        for path in self.dirs.values_mut() {
            if within(path, old) {
                *path = format!("{new}{}", &path[old.len()..]);
            }
        }
    }

    /// Handles one record.
    pub fn event(&mut self, ev: &RawEvent, out: &mut Vec<Step>) {
        if ev.has(libc::IN_Q_OVERFLOW) {
            out.push(Step::Overflow);
            return;
        }
        let pair = match &self.moved_away {
            Some((cookie, _)) if ev.has(libc::IN_MOVED_TO) && *cookie == ev.cookie => {
                self.moved_away.take().map(|(_, old)| old)
            }
            _ => {
                self.settle(out);
                None
            }
        };
        let Some(dir) = self.dirs.get(&ev.wd).cloned() else {
            // A watch we already dropped.
            return;
        };
        let root = ev.wd == self.root_wd;
        if ev.has(libc::IN_IGNORED) {
            self.dirs.remove(&ev.wd);
            if root {
                out.push(Step::End);
            }
            return;
        }
        if ev.name.is_empty() {
            // About a watched directory itself. The parent reports its subdirectories; the
            // root reports for itself.
            if !root {
                return;
            }
            let change = if ev.has(libc::IN_DELETE_SELF) {
                FileChange::Remove
            } else if ev.has(libc::IN_MOVE_SELF) {
                FileChange::Rename
            } else if ev.has(libc::IN_ATTRIB) {
                FileChange::Chmod
            } else {
                return;
            };
            out.push(Step::Change {
                name: WATCH_ROOT_NAME.to_owned(),
                change,
            });
            if change != FileChange::Chmod {
                // Removed or moved away: the path no longer names it.
                out.push(Step::End);
            }
            return;
        }
        let name = join(&dir, &String::from_utf8_lossy(&ev.name));
        let subdir = self.recursive && ev.has(libc::IN_ISDIR);
        let change = |change| Step::Change {
            name: name.clone(),
            change,
        };
        if ev.has(libc::IN_CREATE) {
            out.push(if subdir {
                Step::Watch {
                    name: name.clone(),
                    created: true,
                }
            } else {
                change(FileChange::Create)
            });
        }
        if ev.has(libc::IN_MODIFY) {
            out.push(change(FileChange::Write));
        }
        if ev.has(libc::IN_ATTRIB) {
            out.push(change(FileChange::Chmod));
        }
        if ev.has(libc::IN_DELETE) {
            out.push(change(FileChange::Remove));
        }
        if ev.has(libc::IN_MOVED_FROM) {
            out.push(change(FileChange::Rename));
            if subdir {
                self.moved_away = Some((ev.cookie, name.clone()));
            }
        }
        if ev.has(libc::IN_MOVED_TO) {
            out.push(match pair {
                Some(old) => {
                    self.moved(&old, &name);
                    change(FileChange::Create)
                }
                None if subdir => Step::Watch {
                    name: name.clone(),
                    created: false,
                },
                None => change(FileChange::Create),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: i32 = 1;

    fn ev(wd: i32, mask: u32, cookie: u32, name: &str) -> RawEvent {
        RawEvent {
            wd,
            mask,
            cookie,
            name: name.as_bytes().to_vec(),
        }
    }

    fn steps(t: &mut Tracker, evs: &[RawEvent]) -> Vec<Step> {
        let mut out = Vec::new();
        for e in evs {
            t.event(e, &mut out);
        }
        out
    }

    fn ch(name: &str, change: FileChange) -> Step {
        Step::Change {
            name: name.into(),
            change,
        }
    }

    #[test]
    fn plain_changes_follow_fsnotify() {
        let mut t = Tracker::new(ROOT, false);
        let out = steps(
            &mut t,
            &[
                ev(ROOT, libc::IN_CREATE, 0, "a"),
                ev(ROOT, libc::IN_MODIFY, 0, "a"),
                ev(ROOT, libc::IN_ATTRIB, 0, "a"),
                ev(ROOT, libc::IN_DELETE, 0, "a"),
                ev(ROOT, libc::IN_CREATE | libc::IN_ISDIR, 0, "d"),
                ev(-1, libc::IN_Q_OVERFLOW, 0, ""),
            ],
        );
        assert_eq!(
            out,
            vec![
                ch("a", FileChange::Create),
                ch("a", FileChange::Write),
                ch("a", FileChange::Chmod),
                ch("a", FileChange::Remove),
                ch("d", FileChange::Create),
                Step::Overflow,
            ],
            "without recursion a new directory is not watched"
        );
    }

    #[test]
    fn recursion_watches_new_directories_and_names_relative_paths() {
        let mut t = Tracker::new(ROOT, true);
        let out = steps(
            &mut t,
            &[ev(ROOT, libc::IN_CREATE | libc::IN_ISDIR, 0, "d")],
        );
        assert_eq!(
            out,
            vec![Step::Watch {
                name: "d".into(),
                created: true
            }],
            "the watcher reports the create once the directory is watched"
        );
        t.add_dir(2, "d".into());
        t.add_dir(3, "d/e".into());
        let out = steps(
            &mut t,
            &[
                ev(3, libc::IN_CREATE, 0, "f.txt"),
                // The subdirectory's own record about itself: its parent reports it.
                ev(3, libc::IN_ATTRIB, 0, ""),
                ev(2, libc::IN_ATTRIB | libc::IN_ISDIR, 0, "e"),
            ],
        );
        assert_eq!(
            out,
            vec![
                ch("d/e/f.txt", FileChange::Create),
                ch("d/e", FileChange::Chmod)
            ]
        );
        assert_eq!(t.dirs(), 3);
    }

    #[test]
    fn a_move_inside_the_tree_is_rename_then_create_and_moves_the_subtree() {
        let mut t = Tracker::new(ROOT, true);
        t.add_dir(2, "a".into());
        t.add_dir(3, "a/b".into());
        t.add_dir(4, "ab".into());
        let out = steps(
            &mut t,
            &[
                ev(ROOT, libc::IN_MOVED_FROM | libc::IN_ISDIR, 9, "a"),
                ev(ROOT, libc::IN_MOVED_TO | libc::IN_ISDIR, 9, "z"),
                ev(3, libc::IN_CREATE, 0, "new"),
                ev(4, libc::IN_CREATE, 0, "kept"),
            ],
        );
        assert_eq!(
            out,
            vec![
                ch("a", FileChange::Rename),
                ch("z", FileChange::Create),
                ch("z/b/new", FileChange::Create),
                ch("ab/kept", FileChange::Create),
            ]
        );
        // Files: the same pairing, nothing to track.
        let out = steps(
            &mut t,
            &[
                ev(ROOT, libc::IN_MOVED_FROM, 5, "x"),
                ev(2, libc::IN_MOVED_TO, 5, "y"),
            ],
        );
        assert_eq!(
            out,
            vec![ch("x", FileChange::Rename), ch("z/y", FileChange::Create)]
        );
    }

    #[test]
    fn a_directory_moved_out_is_forgotten_and_one_moved_in_watched() {
        let mut t = Tracker::new(ROOT, true);
        t.add_dir(2, "a".into());
        t.add_dir(3, "a/b".into());
        let out = steps(
            &mut t,
            &[ev(ROOT, libc::IN_MOVED_FROM | libc::IN_ISDIR, 9, "a")],
        );
        assert_eq!(out, vec![ch("a", FileChange::Rename)]);
        assert!(t.awaiting_move());
        let mut out = Vec::new();
        t.settle(&mut out);
        let Some(Step::Unwatch(mut wds)) = out.pop() else {
            panic!("{out:?}")
        };
        wds.sort();
        assert_eq!(wds, vec![2, 3]);
        assert_eq!(t.dirs(), 1);
        // Records of the forgotten watches are ignored.
        assert!(steps(&mut t, &[ev(3, libc::IN_CREATE, 0, "late")]).is_empty());
        // A move in without a move away: create, and watch it (its entries predate it).
        let out = steps(
            &mut t,
            &[ev(ROOT, libc::IN_MOVED_TO | libc::IN_ISDIR, 4, "in")],
        );
        assert_eq!(
            out,
            vec![Step::Watch {
                name: "in".into(),
                created: false
            }]
        );
        // Any other record settles a pending move away.
        let out = steps(
            &mut t,
            &[
                ev(ROOT, libc::IN_MOVED_FROM | libc::IN_ISDIR, 5, "in"),
                ev(ROOT, libc::IN_CREATE, 0, "f"),
            ],
        );
        assert_eq!(
            out,
            vec![ch("in", FileChange::Rename), ch("f", FileChange::Create)]
        );
        assert!(
            !t.awaiting_move(),
            "no watch of 'in' was added, nothing to drop"
        );
    }

    #[test]
    fn the_root_going_away_ends_the_watch() {
        let mut t = Tracker::new(ROOT, true);
        t.add_dir(2, "d".into());
        let out = steps(
            &mut t,
            &[
                ev(ROOT, libc::IN_ATTRIB, 0, ""),
                ev(2, libc::IN_DELETE_SELF, 0, ""),
                ev(2, libc::IN_IGNORED, 0, ""),
                ev(ROOT, libc::IN_DELETE | libc::IN_ISDIR, 0, "d"),
                ev(ROOT, libc::IN_DELETE_SELF, 0, ""),
            ],
        );
        assert_eq!(
            out,
            vec![
                ch(".", FileChange::Chmod),
                ch("d", FileChange::Remove),
                ch(".", FileChange::Remove),
                Step::End
            ]
        );
        assert_eq!(t.dirs(), 1);
        let mut t = Tracker::new(ROOT, false);
        assert_eq!(
            steps(&mut t, &[ev(ROOT, libc::IN_MOVE_SELF, 0, "")]),
            vec![ch(".", FileChange::Rename), Step::End]
        );
        let mut t = Tracker::new(ROOT, false);
        assert_eq!(
            steps(&mut t, &[ev(ROOT, libc::IN_IGNORED, 0, "")]),
            vec![Step::End],
            "an unmounted root ends the watch too"
        );
    }

    #[test]
    fn paths_match_whole_components() {
        assert!(within("a/b", "a") && within("a", "a"));
        assert!(!within("ab", "a"));
        assert_eq!(join("", "x"), "x");
        assert_eq!(join("d/e", "x"), "d/e/x");
    }
}

//! Resolving request paths: relative paths are taken from the acting user's home; `.` and
//! repeated slashes are normalised away. `..` never gets here (`validate_path` refuses it).

use std::path::{Component, Path, PathBuf};

/// The absolute path `path` names for a user whose home is `home`. `path` must have passed
/// `space_core::files::validate_path`.
pub fn resolve(home: &str, path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    let joined = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        Path::new("/").join(home).join(path)
    };
    for c in joined.components() {
        match c {
            Component::Normal(n) => out.push(n),
            // Defensive: validate_path already refused `..`; never climb above `/` anyway.
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_relative_to_home_and_normalises() {
        assert_eq!(
            resolve("/home/u", "notes.txt"),
            PathBuf::from("/home/u/notes.txt")
        );
        assert_eq!(resolve("/home/u", "./a//b/."), PathBuf::from("/home/u/a/b"));
        assert_eq!(
            resolve("/home/u", "/etc//hosts"),
            PathBuf::from("/etc/hosts")
        );
        assert_eq!(resolve("/home/u", "/"), PathBuf::from("/"));
        assert_eq!(resolve("home", "x"), PathBuf::from("/home/x"));
        assert_eq!(resolve("/", "."), PathBuf::from("/"));
    }
}

//! Packing a Dockerfile `COPY`'s sources from the build context into a tar archive whose
//! SHA-256 names it: entries in name order, with no owners or times (`HeaderMode::
//! Deterministic`), so unchanged files pack to the same archive and the step's cache holds.

use std::io::{Seek, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// An archive ready to upload.
pub struct PackedFiles {
    /// The archive (a temporary file, removed when dropped).
    pub file: tempfile::NamedTempFile,
    /// Its SHA-256 (hex).
    pub sha256: String,
    /// The directory its entries go under (relative paths: under the working directory).
    pub dest_dir: String,
}

/// Packs `sources` (paths in `context`) for a `COPY` into `dest`, with Docker's meaning of
/// `dest`: a directory when it ends in `/`, when several sources are copied or a source is
/// a directory (whose contents are copied); otherwise the file's new path.
pub fn pack(context: &Path, sources: &[String], dest: &str) -> anyhow::Result<PackedFiles> {
    let root = context
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("build context {}: {e}", context.display()))?;
    let mut resolved = Vec::new();
    for s in sources {
        let rel = relative(s)?;
        let path = root.join(&rel);
        let md = std::fs::symlink_metadata(&path)
            .map_err(|e| anyhow::anyhow!("COPY {s}: {e} (in the context {})", root.display()))?;
        resolved.push((rel, path, md.is_dir()));
    }
    let into_dir =
        dest.ends_with('/') || dest == "." || sources.len() > 1 || resolved.iter().any(|r| r.2);
    let (dest_dir, rename) = if into_dir {
        (dest.to_owned(), None)
    } else {
        let d = Path::new(dest);
        let parent = d
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| ".".into());
        let name = d
            .file_name()
            .ok_or_else(|| anyhow::anyhow!("COPY's destination {dest:?} names no file"))?;
        (parent, Some(PathBuf::from(name)))
    };
    let file = tempfile::NamedTempFile::new()?;
    let mut tar = tar::Builder::new(file.reopen()?);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.follow_symlinks(false);
    for (rel, path, is_dir) in &resolved {
        if *is_dir {
            add_tree(&mut tar, path, Path::new(""))?;
        } else {
            let name = match &rename {
                Some(n) => n.clone(),
                None => PathBuf::from(rel.file_name().unwrap_or(rel.as_os_str())),
            };
            tar.append_path_with_name(path, &name)?;
        }
    }
    tar.into_inner()?.flush()?;
    let mut f = file.reopen()?;
    f.rewind()?;
    let mut hash = Sha256::new();
    std::io::copy(&mut f, &mut hash)?;
    Ok(PackedFiles {
        file,
        sha256: hex::encode(hash.finalize()),
        dest_dir,
    })
}

/// `s` as a path inside the context (a leading `/` means the context's root); one that
/// climbs out is refused, as Docker refuses it.
fn relative(s: &str) -> anyhow::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in Path::new(s).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    anyhow::bail!("COPY {s}: outside the build context");
                }
            }
            Component::Prefix(_) => anyhow::bail!("COPY {s}: not a path"),
        }
    }
    Ok(out)
}

/// Adds directory `dir`'s contents under `name`, in name order.
fn add_tree(tar: &mut tar::Builder<std::fs::File>, dir: &Path, name: &Path) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let entry_name = name.join(e.file_name());
        let md = std::fs::symlink_metadata(&path)?;
        if md.is_dir() {
            tar.append_dir(&entry_name, &path)?;
            add_tree(tar, &path, &entry_name)?;
        } else {
            tar.append_path_with_name(&path, &entry_name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &PackedFiles) -> Vec<String> {
        let mut a = tar::Archive::new(std::fs::File::open(p.file.path()).unwrap());
        a.entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn docker_meanings_of_the_destination() {
        let ctx = tempfile::tempdir().unwrap();
        std::fs::write(ctx.path().join("a.txt"), "a").unwrap();
        std::fs::create_dir_all(ctx.path().join("src/sub")).unwrap();
        std::fs::write(ctx.path().join("src/z.py"), "z").unwrap();
        std::fs::write(ctx.path().join("src/sub/b.py"), "b").unwrap();

        let renamed = pack(ctx.path(), &["a.txt".into()], "/app/b.txt").unwrap();
        assert_eq!(renamed.dest_dir, "/app");
        assert_eq!(names(&renamed), vec!["b.txt"]);

        let into = pack(ctx.path(), &["a.txt".into()], "/app/").unwrap();
        assert_eq!(into.dest_dir, "/app/");
        assert_eq!(names(&into), vec!["a.txt"]);

        let tree = pack(ctx.path(), &["src".into()], "/app").unwrap();
        assert_eq!(tree.dest_dir, "/app");
        assert_eq!(names(&tree), vec!["sub", "sub/b.py", "z.py"]);

        let again = pack(ctx.path(), &["src".into()], "/app").unwrap();
        assert_eq!(again.sha256, tree.sha256, "the same files pack the same");
        std::fs::write(ctx.path().join("src/z.py"), "changed").unwrap();
        let changed = pack(ctx.path(), &["src".into()], "/app").unwrap();
        assert_ne!(changed.sha256, tree.sha256);

        assert!(pack(ctx.path(), &["../etc/passwd".into()], "/x").is_err());
        assert!(pack(ctx.path(), &["missing".into()], "/x").is_err());
    }
}

//! Packing a Dockerfile `COPY`'s sources from the build context into a tar archive whose
//! SHA-256 names it: entries in name order, with no owners or times (`HeaderMode::
//! Deterministic`), so unchanged files pack to the same archive and the step's cache holds.
//!
//! As Docker: a source may be a wildcard (`*.py`, `src/*/conf.?`; `*` does not cross `/`),
//! matched against the context's paths; the context's `.dockerignore` (one pattern a line,
//! `**` for any depth, `!` re-including, the last matching line deciding, a directory's
//! pattern covering what is under it) leaves files out of every `COPY`, and a source it
//! excludes is "not in the context".

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

/// The context's `.dockerignore`: patterns in order, each negated (`!`) or not.
#[derive(Default)]
pub struct DockerIgnore {
    patterns: Vec<(globset::GlobMatcher, bool)>,
}

impl DockerIgnore {
    /// Reads `context/.dockerignore`; none is an empty one.
    pub fn load(context: &Path) -> anyhow::Result<DockerIgnore> {
        match std::fs::read_to_string(context.join(".dockerignore")) {
            Ok(text) => DockerIgnore::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DockerIgnore::default()),
            Err(e) => Err(anyhow::anyhow!(".dockerignore: {e}")),
        }
    }

    /// Parses `.dockerignore` text (comments with `#`, blank lines skipped).
    pub fn parse(text: &str) -> anyhow::Result<DockerIgnore> {
        let mut patterns = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (negated, pattern) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            // Relative to the context's root, however it is written.
            let pattern = pattern.trim_start_matches('/').trim_start_matches("./");
            let pattern = pattern.trim_end_matches('/');
            if pattern.is_empty() {
                continue;
            }
            patterns.push((
                glob(pattern).map_err(|e| anyhow::anyhow!(".dockerignore line {}: {e}", n + 1))?,
                negated,
            ));
        }
        Ok(DockerIgnore { patterns })
    }

    /// Whether `rel` (a path in the context, `/`-separated) is left out: the last pattern
    /// that matches it or a directory above it decides.
    pub fn excludes(&self, rel: &Path) -> bool {
        let mut excluded = false;
        for (m, negated) in &self.patterns {
            let hit = rel
                .ancestors()
                .any(|a| !a.as_os_str().is_empty() && m.is_match(a));
            if hit {
                excluded = !negated;
            }
        }
        excluded
    }
}

/// A Docker pattern: `*` and `?` within one path component, `**` across any.
fn glob(pattern: &str) -> Result<globset::GlobMatcher, globset::Error> {
    Ok(globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()?
        .compile_matcher())
}

/// Whether `s` is a wildcard source.
fn is_wildcard(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The context's paths (relative, in name order) that wildcard `pattern` matches and the
/// ignore file keeps.
fn expand(root: &Path, pattern: &str, ignore: &DockerIgnore) -> anyhow::Result<Vec<PathBuf>> {
    let pattern = pattern.trim_start_matches('/').trim_start_matches("./");
    let m = glob(pattern).map_err(|e| anyhow::anyhow!("COPY {pattern}: {e}"))?;
    let mut out = Vec::new();
    walk(root, Path::new(""), ignore, &mut |rel| {
        if m.is_match(rel) {
            out.push(rel.to_owned());
        }
    })?;
    out.sort();
    Ok(out)
}

/// Calls `each` with every path under `dir` (relative to the context) the ignore file keeps.
fn walk(
    root: &Path,
    dir: &Path,
    ignore: &DockerIgnore,
    each: &mut dyn FnMut(&Path),
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(dir))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let rel = dir.join(e.file_name());
        if ignore.excludes(&rel) {
            continue;
        }
        each(&rel);
        if e.file_type()?.is_dir() {
            walk(root, &rel, ignore, each)?;
        }
    }
    Ok(())
}

/// Packs `sources` (paths or wildcards in `context`, less what `ignore` leaves out) for a
/// `COPY` into `dest`, with Docker's meaning of `dest`: a directory when it ends in `/`,
/// when several files are copied or a source is a directory (whose contents are copied);
/// otherwise the file's new path.
pub fn pack(
    context: &Path,
    sources: &[String],
    dest: &str,
    ignore: &DockerIgnore,
) -> anyhow::Result<PackedFiles> {
    let root = context
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("build context {}: {e}", context.display()))?;
    let mut resolved = Vec::new();
    for s in sources {
        let rels = if is_wildcard(s) {
            let found = expand(&root, s, ignore)?;
            if found.is_empty() {
                anyhow::bail!(
                    "COPY {s}: no file in the context {} matches",
                    root.display()
                );
            }
            found
        } else {
            vec![relative(s)?]
        };
        for rel in rels {
            if ignore.excludes(&rel) {
                anyhow::bail!("COPY {s}: excluded by the context's .dockerignore");
            }
            let path = root.join(&rel);
            let md = std::fs::symlink_metadata(&path).map_err(|e| {
                anyhow::anyhow!("COPY {s}: {e} (in the context {})", root.display())
            })?;
            resolved.push((rel, path, md.is_dir()));
        }
    }
    let into_dir =
        dest.ends_with('/') || dest == "." || resolved.len() > 1 || resolved.iter().any(|r| r.2);
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
            add_tree(&mut tar, path, rel, Path::new(""), ignore)?;
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

/// Adds directory `dir`'s contents (`rel` in the context) under `name`, in name order,
/// less what `ignore` leaves out.
fn add_tree(
    tar: &mut tar::Builder<std::fs::File>,
    dir: &Path,
    rel: &Path,
    name: &Path,
    ignore: &DockerIgnore,
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let entry_rel = rel.join(e.file_name());
        if ignore.excludes(&entry_rel) {
            continue;
        }
        let entry_name = name.join(e.file_name());
        let md = std::fs::symlink_metadata(&path)?;
        if md.is_dir() {
            tar.append_dir(&entry_name, &path)?;
            add_tree(tar, &path, &entry_rel, &entry_name, ignore)?;
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

        let none = DockerIgnore::default();
        let pack = |ctx: &Path, s: &[String], d: &str| pack(ctx, s, d, &none);
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

    #[test]
    fn wildcards_and_dockerignore_as_docker_has_them() {
        let ctx = tempfile::tempdir().unwrap();
        for (f, body) in [
            ("a.py", "a"),
            ("b.py", "b"),
            ("c.txt", "c"),
            ("src/x.py", "x"),
            ("src/secret.env", "s"),
            ("src/keep.env", "k"),
            ("node_modules/m/index.js", "m"),
        ] {
            let p = ctx.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        let ignore =
            DockerIgnore::parse("# comment\nnode_modules\n**/*.env\n!src/keep.env\n/c.txt\n")
                .unwrap();
        // `*` stays in one directory; several matches go into the destination directory.
        let py = pack(ctx.path(), &["*.py".into()], "/app/", &ignore).unwrap();
        assert_eq!(names(&py), vec!["a.py", "b.py"]);
        let nested = pack(ctx.path(), &["*/*.py".into()], "/app/", &ignore).unwrap();
        assert_eq!(names(&nested), vec!["x.py"]);
        // A directory loses what the ignore file leaves out, and keeps what `!` brings back.
        let tree = pack(ctx.path(), &[".".into()], "/app", &ignore).unwrap();
        assert_eq!(
            names(&tree),
            vec!["a.py", "b.py", "src", "src/keep.env", "src/x.py"]
        );
        assert!(pack(ctx.path(), &["c.txt".into()], "/x", &ignore).is_err());
        assert!(pack(ctx.path(), &["*.none".into()], "/x/", &ignore).is_err());
        let e = DockerIgnore::parse("[")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("line 1"), "{e}");
    }
}

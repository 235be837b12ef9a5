//! The files of an E2B template build's `COPY`, as SPACE's build steps take them.
//!
//! The E2B SDKs upload, per `COPY`, a (gzipped) tar of the files its source matches, at
//! their paths in the build context, named by a hash of their own making (which the server
//! cannot check). E2B's builder extracts it and moves the source's entry to the
//! destination: a file to exactly the destination path, a directory's (or a glob's base
//! directory's) contents merged into it. SPACE's `COPY` unpacks an archive's entries under a
//! directory, so an upload is rewritten here into such an archive: the source's entries
//! only, re-rooted, in name order with no times or owners (the same upload makes the same
//! archive, so the step cache holds), modes set to the step's if it gives one. Pure: paths
//! and bytes in, an archive out; bounded in entries and bytes, hostile entries refused.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use sha2::{Digest, Sha256};

/// Most entries one upload may hold.
pub const MAX_ENTRIES: usize = 100_000;
/// Largest total of file bytes one upload may unpack to (it is rewritten in memory).
pub const MAX_BYTES: u64 = 256 << 20;

/// Why an upload cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilesError {
    /// Not a tar archive (gzipped or not), or a damaged one.
    #[error("the uploaded files are not a readable tar archive: {0}")]
    Unreadable(String),
    /// An entry escapes the context (`..`, an absolute path) or is a device, fifo or hard
    /// link.
    #[error("the uploaded files hold an entry SPACE does not copy: {0}")]
    BadEntry(String),
    /// Too many entries or bytes.
    #[error("the uploaded files are over the limit of {MAX_ENTRIES} entries or {MAX_BYTES} bytes")]
    TooLarge,
    /// Nothing in the upload is the step's source.
    #[error("COPY's source {0} is not in its uploaded files")]
    SourceMissing(String),
    /// A mode that is not octal permissions.
    #[error("COPY's mode {0:?} is not octal permissions (e.g. 0755)")]
    BadMode(String),
}

/// A `COPY` as SPACE runs it: the archive's entries go under `dest_dir`.
#[derive(Debug)]
pub struct RewrittenCopy {
    /// The archive.
    pub archive: Vec<u8>,
    /// Its SHA-256 (hex): the name it is uploaded under.
    pub sha256: String,
    /// The directory its entries go under (relative: under the working directory).
    pub dest_dir: String,
}

/// One entry read from an upload.
enum Entry {
    Dir,
    File(Vec<u8>, u32),
    Link(String),
}

/// The literal part of an E2B `COPY` source: up to its first component with a glob
/// character, without `./` or a trailing `/` (`""`: the context's root).
pub fn source_base(src: &str) -> String {
    let mut parts = Vec::new();
    for c in src.split('/') {
        if c.contains(['*', '?', '[', '{']) {
            break;
        }
        if !c.is_empty() && c != "." {
            parts.push(c);
        }
    }
    parts.join("/")
}

/// Parses an E2B mode argument (`"0755"`, `"755"`); `None` for an empty one.
pub fn parse_mode(mode: &str) -> Result<Option<u32>, FilesError> {
    if mode.is_empty() {
        return Ok(None);
    }
    u32::from_str_radix(mode, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .map(Some)
        .ok_or_else(|| FilesError::BadMode(mode.chars().take(16).collect()))
}

/// Rewrites `upload` (a tar, gzipped or not) for a `COPY` of `src` to `dest` (see the
/// module doc), every file and directory given `mode` if there is one.
pub fn rewrite(
    upload: &[u8],
    src: &str,
    dest: &str,
    mode: Option<u32>,
) -> Result<RewrittenCopy, FilesError> {
    let entries = read_entries(upload)?;
    let base = source_base(src);
    // What the source is: one entry (a file or link, copied to `dest` itself), or a
    // directory whose contents are merged into `dest`.
    let single = match entries.get(&base) {
        Some(Entry::File(..) | Entry::Link(_)) if !base.is_empty() => true,
        Some(Entry::Dir) | None => false,
        Some(_) => false,
    };
    let mut out: BTreeMap<String, &Entry> = BTreeMap::new();
    let dest_dir;
    if single {
        let name = base.rsplit('/').next().unwrap_or(&base).to_owned();
        let (dir, file) = if dest.ends_with('/') {
            (dest.trim_end_matches('/').to_owned(), name)
        } else {
            match dest.rsplit_once('/') {
                Some((d, f)) => (d.to_owned(), f.to_owned()),
                None => (".".to_owned(), dest.to_owned()),
            }
        };
        dest_dir = if dir.is_empty() { "/".to_owned() } else { dir };
        if let Some(e) = entries.get(&base) {
            out.insert(file, e);
        }
    } else {
        let prefix = if base.is_empty() {
            String::new()
        } else {
            format!("{base}/")
        };
        for (path, e) in &entries {
            if let Some(rel) = path.strip_prefix(&prefix) {
                if !rel.is_empty() {
                    out.insert(rel.to_owned(), e);
                }
            }
        }
        if out.is_empty() && !entries.contains_key(&base) {
            return Err(FilesError::SourceMissing(src.chars().take(256).collect()));
        }
        dest_dir = if dest.is_empty() {
            ".".into()
        } else {
            dest.to_owned()
        };
    }
    let mut builder = tar::Builder::new(Vec::new());
    for (path, e) in out {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            Entry::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(mode.unwrap_or(0o755));
                h.set_size(0);
                h.set_cksum();
                builder.append_data(&mut h, format!("{path}/"), std::io::empty())
            }
            Entry::File(data, m) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(mode.unwrap_or(*m));
                h.set_size(data.len() as u64);
                h.set_cksum();
                builder.append_data(&mut h, &path, data.as_slice())
            }
            Entry::Link(target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                builder.append_link(&mut h, &path, target)
            }
        }
        .map_err(|e| FilesError::Unreadable(e.to_string()))?;
    }
    let mut archive = builder
        .into_inner()
        .map_err(|e| FilesError::Unreadable(e.to_string()))?;
    archive
        .flush()
        .map_err(|e| FilesError::Unreadable(e.to_string()))?;
    let sha256 = hex::encode(Sha256::digest(&archive));
    Ok(RewrittenCopy {
        archive,
        sha256,
        dest_dir,
    })
}

/// The upload's entries by normalized path; refuses what escapes or is not a file,
/// directory or symlink.
fn read_entries(upload: &[u8]) -> Result<BTreeMap<String, Entry>, FilesError> {
    let gz = upload.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read + '_> = if gz {
        Box::new(flate2::read::GzDecoder::new(upload))
    } else {
        Box::new(upload)
    };
    let unreadable = |e: std::io::Error| FilesError::Unreadable(e.to_string());
    let mut archive = tar::Archive::new(reader);
    let mut entries = BTreeMap::new();
    let mut total = 0u64;
    for entry in archive.entries().map_err(unreadable)? {
        let mut entry = entry.map_err(unreadable)?;
        if entries.len() >= MAX_ENTRIES {
            return Err(FilesError::TooLarge);
        }
        let raw = entry
            .path()
            .map_err(unreadable)?
            .to_string_lossy()
            .into_owned();
        let path =
            normalize(&raw).ok_or_else(|| FilesError::BadEntry(raw.chars().take(256).collect()))?;
        let kind = entry.header().entry_type();
        let e = if kind.is_dir() {
            Entry::Dir
        } else if kind.is_file() {
            let size = entry.header().size().map_err(unreadable)?;
            total = total.saturating_add(size);
            if total > MAX_BYTES {
                return Err(FilesError::TooLarge);
            }
            let mode = entry.header().mode().map_err(unreadable)? & 0o7777;
            let mut data = Vec::with_capacity(size.min(1 << 20) as usize);
            entry
                .by_ref()
                .take(size)
                .read_to_end(&mut data)
                .map_err(unreadable)?;
            Entry::File(data, mode)
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(unreadable)?
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            Entry::Link(target)
        } else if matches!(
            kind,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader | tar::EntryType::GNULongName
        ) {
            continue;
        } else {
            return Err(FilesError::BadEntry(format!("{path} ({kind:?})")));
        };
        if path.is_empty() {
            continue;
        }
        entries.insert(path, e);
    }
    Ok(entries)
}

/// `p` without `./`, empty components or a trailing `/`; `None` if it is absolute or
/// climbs with `..`.
fn normalize(p: &str) -> Option<String> {
    if p.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(entries: &[(&str, Option<&str>)], gzip: bool) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, content) in entries {
            let mut h = tar::Header::new_gnu();
            match content {
                Some(c) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(0o640);
                    h.set_size(c.len() as u64);
                    h.set_cksum();
                    b.append_data(&mut h, path, c.as_bytes()).unwrap();
                }
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    h.set_cksum();
                    b.append_data(&mut h, path, std::io::empty()).unwrap();
                }
            }
        }
        let tar = b.into_inner().unwrap();
        if !gzip {
            return tar;
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    fn names(archive: &[u8]) -> Vec<(String, u32)> {
        let mut a = tar::Archive::new(archive);
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    e.header().mode().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn a_file_goes_to_the_destination_path_or_into_a_directory() {
        let up = upload(&[("app/", None), ("app/req.txt", Some("x"))], true);
        let r = rewrite(&up, "app/req.txt", "/srv/requirements.txt", None).unwrap();
        assert_eq!(r.dest_dir, "/srv");
        assert_eq!(names(&r.archive), [("requirements.txt".to_string(), 0o640)]);
        let r = rewrite(&up, "./app/req.txt", "/srv/", Some(0o600)).unwrap();
        assert_eq!(r.dest_dir, "/srv");
        assert_eq!(names(&r.archive), [("req.txt".to_string(), 0o600)]);
        let r = rewrite(&up, "app/req.txt", "here.txt", None).unwrap();
        assert_eq!(r.dest_dir, ".");
    }

    #[test]
    fn a_directory_or_glob_merges_its_contents() {
        let up = upload(
            &[
                ("src/", None),
                ("src/a.py", Some("a")),
                ("src/lib/", None),
                ("src/lib/b.py", Some("b")),
                ("other.txt", Some("o")),
            ],
            false,
        );
        let r = rewrite(&up, "src", "/app", None).unwrap();
        assert_eq!(r.dest_dir, "/app");
        let got: Vec<_> = names(&r.archive).into_iter().map(|n| n.0).collect();
        assert_eq!(got, ["a.py", "lib/", "lib/b.py"]);
        let r = rewrite(&up, "src/**/*.py", "/app", None).unwrap();
        assert_eq!(names(&r.archive).len(), 3);
        // The same upload, the same archive: the step cache holds.
        assert_eq!(rewrite(&up, "src", "/app", None).unwrap().sha256, {
            rewrite(&up, "src/", "/app", None).unwrap().sha256
        });
        let all = rewrite(&up, "*", "/ctx", None).unwrap();
        assert_eq!(names(&all.archive).len(), 5);
    }

    #[test]
    fn hostile_or_missing_sources_are_refused() {
        let up = upload(&[("a.txt", Some("a"))], false);
        assert!(matches!(
            rewrite(&up, "b.txt", "/x", None),
            Err(FilesError::SourceMissing(_))
        ));
        assert!(matches!(
            rewrite(b"not a tar at all, not even close", "a", "/x", None),
            Err(FilesError::Unreadable(_)) | Err(FilesError::SourceMissing(_))
        ));
        assert!(matches!(parse_mode("999"), Err(FilesError::BadMode(_))));
        assert_eq!(parse_mode("0755"), Ok(Some(0o755)));
        assert_eq!(parse_mode(""), Ok(None));
        assert_eq!(normalize("../x"), None);
        assert_eq!(normalize("/etc/passwd"), None);
        assert_eq!(normalize("./a//b/"), Some("a/b".into()));
        // A `..` entry: refused, not skipped.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1);
        {
            let name = b"../evil";
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name);
        }
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        let evil = b.into_inner().unwrap();
        assert!(matches!(
            rewrite(&evil, "*", "/x", None),
            Err(FilesError::BadEntry(_))
        ));
    }
}

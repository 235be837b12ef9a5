//! Images on a disk: an OCI image layout directory, or a tarball (`docker save`, legacy or
//! OCI form, or a tarred layout). Nothing is trusted: every JSON document is bounded, every
//! blob hashed against the digest that names it, every path inside an archive a plain
//! relative name.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageIndex, OciImageManifest};

use crate::oci::config::ImageConfig;
use crate::oci::fetch::{
    blob_path, check_shape, copy_verified, digest_of, read_json_file, verified_config, LayerBlob,
    PulledImage,
};
use crate::oci::{ImageLimits, OciError};

/// The annotation a layout's index tags an image with.
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Files an archive may hold (a layout's blobs, or a legacy save's layer directories).
const MAX_ARCHIVE_FILES: usize = 10_000;

fn layout_err(path: &Path, detail: impl Into<String>) -> OciError {
    OciError::Layout {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Reads the image `tag` (or the only one) of layout `dir` into blob directory `blobs`.
pub fn read_layout(
    dir: &Path,
    tag: Option<&str>,
    blobs: &Path,
    limits: &ImageLimits,
    source: &str,
) -> Result<PulledImage, OciError> {
    let marker = read_json_file(&dir.join("oci-layout"), 4096, "oci-layout")
        .map_err(|_| layout_err(dir, "not an OCI image layout (no readable oci-layout file)"))?;
    let marker: serde_json::Value = serde_json::from_slice(&marker)
        .map_err(|e| layout_err(dir, format!("oci-layout is not JSON: {e}")))?;
    if marker.get("imageLayoutVersion").and_then(|v| v.as_str()) != Some("1.0.0") {
        return Err(layout_err(
            dir,
            "oci-layout is not imageLayoutVersion 1.0.0",
        ));
    }
    let index_bytes = read_json_file(&dir.join("index.json"), limits.max_json_bytes, "index.json")?;
    let index: OciImageIndex = serde_json::from_slice(&index_bytes)
        .map_err(|e| layout_err(dir, format!("index.json: {e}")))?;
    let entry = pick_tagged(&index.manifests, tag).map_err(|detail| OciError::NotFound {
        reference: source.to_owned(),
        detail,
    })?;
    let manifest = resolve_manifest(dir, entry.media_type.as_str(), &entry.digest, limits, 0)?;
    let config_path = layout_blob(dir, &manifest.config.digest)?;
    let config_bytes = read_json_file(&config_path, limits.max_json_bytes, "image config")?;
    let config = verified_config(
        &config_bytes,
        &manifest.config.digest,
        manifest.layers.len(),
        limits,
    )?;
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (i, l) in manifest.layers.iter().enumerate() {
        check_layer_descriptor(l, limits)?;
        let from = layout_blob(dir, &l.digest)?;
        let to = blob_path(blobs, &l.digest)?;
        let f = std::fs::File::open(&from)
            .map_err(|e| layout_err(&from, format!("cannot open layer {i}: {e}")))?;
        let (digest, size) = copy_verified(
            f,
            &to,
            Some(&l.digest),
            limits.max_layer_bytes,
            &format!("layer {i} ({})", l.digest),
        )?;
        layers.push(LayerBlob {
            path: to,
            digest,
            size,
        });
    }
    Ok(PulledImage {
        source: source.to_owned(),
        config_digest: manifest.config.digest,
        config_bytes,
        config,
        layers,
    })
}

/// The index entry for `tag`, or the only entry when no tag is asked for.
fn pick_tagged<'a>(
    entries: &'a [ImageIndexEntry],
    tag: Option<&str>,
) -> Result<&'a ImageIndexEntry, String> {
    let tags = || {
        entries
            .iter()
            .filter_map(|e| e.annotations.as_ref()?.get(REF_NAME).cloned())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match tag {
        Some(t) => entries
            .iter()
            .find(|e| {
                e.annotations
                    .as_ref()
                    .and_then(|a| a.get(REF_NAME))
                    .is_some_and(|n| n == t)
            })
            .ok_or_else(|| format!("no image tagged {t:?} in the layout (tags: {})", tags())),
        None => match entries {
            [one] => Ok(one),
            [] => Err("the layout holds no image".into()),
            _ => Err(format!(
                "the layout holds {} images; name one with oci:DIR:TAG (tags: {})",
                entries.len(),
                tags()
            )),
        },
    }
}

/// Follows an index (a multi-platform image) to its linux/amd64 manifest.
fn resolve_manifest(
    dir: &Path,
    media_type: &str,
    digest: &str,
    limits: &ImageLimits,
    depth: u32,
) -> Result<OciImageManifest, OciError> {
    let path = layout_blob(dir, digest)?;
    let bytes = read_json_file(&path, limits.max_json_bytes, "manifest")?;
    let got = digest_of(&bytes);
    if got != digest {
        return Err(OciError::DigestMismatch {
            what: "manifest".into(),
            expected: digest.to_owned(),
            got,
        });
    }
    if is_index(media_type) {
        if depth > 0 {
            return Err(OciError::BadImage {
                what: "image index".into(),
                detail: "an index inside an index".into(),
            });
        }
        let index: OciImageIndex =
            serde_json::from_slice(&bytes).map_err(|e| OciError::BadImage {
                what: "image index".into(),
                detail: e.to_string(),
            })?;
        let entry = pick_platform(&index.manifests)?;
        return resolve_manifest(dir, &entry.media_type, &entry.digest, limits, depth + 1);
    }
    parse_manifest(&bytes)
}

/// Whether a media type is a multi-platform index.
pub fn is_index(media_type: &str) -> bool {
    media_type == oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE
        || media_type == oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE
}

/// Parses an image manifest.
pub fn parse_manifest(bytes: &[u8]) -> Result<OciImageManifest, OciError> {
    serde_json::from_slice(bytes).map_err(|e| OciError::BadImage {
        what: "manifest".into(),
        detail: e.to_string(),
    })
}

/// The linux/amd64 entry of an index.
pub fn pick_platform(entries: &[ImageIndexEntry]) -> Result<&ImageIndexEntry, OciError> {
    entries
        .iter()
        .find(|e| {
            e.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
        })
        .ok_or_else(|| OciError::NoPlatform {
            available: entries
                .iter()
                .filter_map(|e| e.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Refuses layer descriptors we cannot build from: foreign layers (fetched from URLs the
/// image names), non-layer blobs, declared sizes past the limit.
pub fn check_layer_descriptor(l: &OciDescriptor, limits: &ImageLimits) -> Result<(), OciError> {
    let mt = l.media_type.as_str();
    let layer = mt.starts_with("application/vnd.oci.image.layer.")
        || mt.starts_with("application/vnd.docker.image.rootfs.diff.tar");
    if !layer || mt.contains("foreign") || l.urls.as_ref().is_some_and(|u| !u.is_empty()) {
        return Err(OciError::BadImage {
            what: format!("layer {}", l.digest),
            detail: format!("media type {mt:?} is not a layer SPACE can apply"),
        });
    }
    if l.size < 0 || l.size as u64 > limits.max_layer_bytes {
        return Err(OciError::TooLarge {
            what: format!("layer {}", l.digest),
            detail: format!(
                "declared size {} (at most {})",
                l.size, limits.max_layer_bytes
            ),
        });
    }
    Ok(())
}

fn layout_blob(dir: &Path, digest: &str) -> Result<PathBuf, OciError> {
    blob_path(&dir.join("blobs"), digest)
}

/// Reads a `docker save` archive or a tarred OCI layout: its files are extracted (bounded,
/// plain relative names only) into `work`, then read as a layout, or as a legacy save
/// (`manifest.json` naming the config and the layer tars).
pub fn read_archive(
    file: &Path,
    work: &Path,
    blobs: &Path,
    limits: &ImageLimits,
    source: &str,
) -> Result<PulledImage, OciError> {
    let f = std::fs::File::open(file).map_err(|e| layout_err(file, format!("cannot open: {e}")))?;
    extract_plain_files(f, work, limits).map_err(|detail| layout_err(file, detail))?;
    if work.join("oci-layout").is_file() {
        return read_layout(work, None, blobs, limits, source);
    }
    read_legacy_save(file, work, blobs, limits, source)
}

/// The legacy `docker save` format.
fn read_legacy_save(
    file: &Path,
    work: &Path,
    blobs: &Path,
    limits: &ImageLimits,
    source: &str,
) -> Result<PulledImage, OciError> {
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(rename = "Config")]
        config: String,
        #[serde(rename = "RepoTags", default)]
        repo_tags: Option<Vec<String>>,
        #[serde(rename = "Layers")]
        layers: Vec<String>,
    }
    let bytes = read_json_file(
        &work.join("manifest.json"),
        limits.max_json_bytes,
        "manifest.json",
    )
    .map_err(|_| {
        layout_err(
            file,
            "neither a docker save archive (manifest.json) nor an OCI layout",
        )
    })?;
    let entries: Vec<Entry> = serde_json::from_slice(&bytes)
        .map_err(|e| layout_err(file, format!("manifest.json: {e}")))?;
    let entry = match entries.as_slice() {
        [one] => one,
        [] => return Err(layout_err(file, "manifest.json names no image")),
        many => {
            return Err(layout_err(
                file,
                format!(
                    "the archive holds {} images ({}); save one image per archive",
                    many.len(),
                    many.iter()
                        .flat_map(|e| e.repo_tags.clone().unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))
        }
    };
    let config_path = archive_member(work, &entry.config).map_err(|d| layout_err(file, d))?;
    let config_bytes = read_json_file(&config_path, limits.max_json_bytes, "image config")?;
    let config_digest = digest_of(&config_bytes);
    let config = ImageConfig::parse(&config_bytes)?;
    check_shape(&config, entry.layers.len(), limits)?;
    let mut layers = Vec::with_capacity(entry.layers.len());
    for (i, name) in entry.layers.iter().enumerate() {
        let from = archive_member(work, name).map_err(|d| layout_err(file, d))?;
        let f = std::fs::File::open(&from)
            .map_err(|e| layout_err(file, format!("layer {name}: {e}")))?;
        // Named by path, not digest: it is hashed here and its uncompressed content is
        // checked against the config's diff_id when it is applied.
        let tmp = blobs.join(format!("incoming-{i}"));
        let (digest, size) = copy_verified(
            f,
            &tmp,
            None,
            limits.max_layer_bytes,
            &format!("layer {name}"),
        )?;
        let to = blob_path(blobs, &digest)?;
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| layout_err(parent, format!("cannot store layer: {e}")))?;
        }
        std::fs::rename(&tmp, &to)
            .map_err(|e| layout_err(&to, format!("cannot store layer: {e}")))?;
        layers.push(LayerBlob {
            path: to,
            digest,
            size,
        });
    }
    Ok(PulledImage {
        source: source.to_owned(),
        config_digest,
        config_bytes,
        config,
        layers,
    })
}

/// `name` inside extracted archive `work`: a plain relative path.
fn archive_member(work: &Path, name: &str) -> Result<PathBuf, String> {
    let p = Path::new(name);
    if name.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(format!(
            "manifest.json names {name:?}, not a file in the archive"
        ));
    }
    Ok(work.join(p))
}

/// Extracts the regular files and directories of a tar (no links, no devices: an image
/// archive holds neither that matters) under `work`, refusing names that are not plain
/// relative paths, more than [`MAX_ARCHIVE_FILES`] files, or a file past the layer limit.
fn extract_plain_files(f: std::fs::File, work: &Path, limits: &ImageLimits) -> Result<(), String> {
    let mut archive = tar::Archive::new(std::io::BufReader::new(f));
    let mut files = 0usize;
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    for entry in archive
        .entries()
        .map_err(|e| format!("not a tar archive: {e}"))?
    {
        let mut entry = entry.map_err(|e| format!("bad tar entry: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("bad entry name: {e}"))?
            .into_owned();
        let rel: PathBuf = path
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .collect();
        if rel.as_os_str().is_empty() {
            continue;
        }
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(format!(
                "entry {} is not a plain relative path",
                path.display()
            ));
        }
        let kind = entry.header().entry_type();
        let dest = work.join(&rel);
        if kind.is_dir() {
            std::fs::create_dir_all(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
            continue;
        }
        if !kind.is_file() {
            // Symlinks (Docker's legacy saves link identical layers) are not followed;
            // a manifest naming one finds no file and says so.
            continue;
        }
        files += 1;
        if files > MAX_ARCHIVE_FILES {
            return Err(format!("more than {MAX_ARCHIVE_FILES} files"));
        }
        if !seen.insert(rel.clone()) {
            return Err(format!("{} appears twice", rel.display()));
        }
        let size = entry
            .header()
            .size()
            .map_err(|e| format!("bad size: {e}"))?;
        if size > limits.max_layer_bytes.max(limits.max_json_bytes) {
            return Err(format!(
                "{} is {size} bytes (at most {})",
                rel.display(),
                limits.max_layer_bytes
            ));
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let mut out =
            std::fs::File::create(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        std::io::copy(&mut (&mut entry).take(size), &mut out)
            .map_err(|e| format!("{}: {e}", rel.display()))?;
    }
    Ok(())
}

use std::io::Read as _;

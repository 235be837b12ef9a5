//! Container images the template tests build from, written by hand so every byte is known:
//! layers (tars with whatever entries a test needs, hostile ones included), an OCI image
//! layout directory, a `docker save` archive, and the blobs to push to a registry.

use std::path::Path;

use sha2::{Digest, Sha256};

/// `sha256:<hex>` of some bytes.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// `len` incompressible bytes (xorshift from `seed`): a layer gzip cannot shrink, like real
/// binaries.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A layer under construction: an uncompressed tar.
pub struct Layer(tar::Builder<Vec<u8>>);

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    /// An empty layer.
    pub fn new() -> Self {
        Layer(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32, uid: u64, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_mtime(1_700_000_000);
        h.set_size(size);
        h
    }

    /// A directory (root's).
    pub fn dir(self, path: &str, mode: u32) -> Self {
        self.dir_owned(path, mode, 0)
    }

    /// A directory owned by `uid`:`uid`.
    pub fn dir_owned(mut self, path: &str, mode: u32, uid: u64) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, mode, uid, 0);
        self.0.append_data(&mut h, path, &[][..]).expect("dir");
        self
    }

    /// A regular file owned by `uid`:`uid`.
    pub fn file(mut self, path: &str, body: &[u8], mode: u32, uid: u64) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, mode, uid, body.len() as u64);
        self.0.append_data(&mut h, path, body).expect("file");
        self
    }

    /// A regular file with xattrs (PAX `SCHILY.xattr.*`).
    pub fn file_with_xattrs(
        self,
        path: &str,
        body: &[u8],
        mode: u32,
        xattrs: &[(&str, &[u8])],
    ) -> Self {
        let mut me = self;
        let recs: Vec<(String, &[u8])> = xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
            .collect();
        me.0.append_pax_extensions(recs.iter().map(|(k, v)| (k.as_str(), *v)))
            .expect("pax");
        me.file(path, body, mode, 0)
    }

    /// A symlink.
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0, 0);
        self.0.append_link(&mut h, path, target).expect("symlink");
        self
    }

    /// A hard link to `target` (a path in the image).
    pub fn hardlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Link, 0o644, 0, 0);
        self.0.append_link(&mut h, path, target).expect("hard link");
        self
    }

    /// An entry written as given, name and link target unchecked (the tar crate refuses
    /// `..`; a hostile layer does not): `size` is what the header declares, `body` what
    /// follows it.
    pub fn raw(
        mut self,
        kind: tar::EntryType,
        path: &str,
        target: &str,
        size: u64,
        body: &[u8],
    ) -> Self {
        let mut h = Self::header(kind, 0o644, 0, size);
        let old = h.as_old_mut();
        old.name[..path.len()].copy_from_slice(path.as_bytes());
        old.linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        let data = self.0.get_mut();
        data.extend_from_slice(h.as_bytes());
        data.extend_from_slice(body);
        let pad = (512 - body.len() % 512) % 512;
        data.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    /// The tar.
    pub fn finish(self) -> Vec<u8> {
        self.0.into_inner().expect("tar")
    }
}

/// The busybox userland of the suite's host (a static binary, no libc in the image: like
/// an Alpine image, it needs nothing the image does not carry), with `applets` linked in
/// `/bin`.
pub fn busybox_layer(applets: &[&str]) -> Layer {
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
    let mut l = Layer::new()
        .dir("bin", 0o755)
        .file("bin/busybox", &busybox, 0o755, 0);
    for a in applets {
        l = l.symlink(&format!("bin/{a}"), "busybox");
    }
    l
}

/// An image: layers (lowest first, uncompressed) and the `config` section of its config.
pub struct Image {
    /// Layer tars.
    pub layers: Vec<Vec<u8>>,
    /// `config` (Env, Cmd, …).
    pub config: serde_json::Value,
}

/// The blobs of an image as a registry or layout holds them.
pub struct ImageBlobs {
    /// The config document.
    pub config: Vec<u8>,
    /// The manifest.
    pub manifest: Vec<u8>,
    /// The gzip-compressed layers.
    pub layers: Vec<Vec<u8>>,
}

impl Image {
    /// The image's config document.
    pub fn config_json(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": self.config,
            "rootfs": {
                "type": "layers",
                "diff_ids": self.layers.iter().map(|l| digest(l)).collect::<Vec<_>>(),
            },
        }))
        .expect("json")
    }

    /// Its blobs, layers gzip-compressed.
    pub fn blobs(&self) -> ImageBlobs {
        use std::io::Write as _;
        let config = self.config_json();
        let layers: Vec<Vec<u8>> = self
            .layers
            .iter()
            .map(|l| {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(l).expect("gzip");
                gz.finish().expect("gzip")
            })
            .collect();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest(&config),
                "size": config.len(),
            },
            "layers": layers.iter().map(|l| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": digest(l),
                "size": l.len(),
            })).collect::<Vec<_>>(),
        }))
        .expect("json");
        ImageBlobs {
            config,
            manifest,
            layers,
        }
    }

    /// Writes an OCI image layout at `dir` holding this image tagged `tag`.
    pub fn write_layout(&self, dir: &Path, tag: &str) -> ImageBlobs {
        let b = self.blobs();
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).expect("layout dir");
        let put = |bytes: &[u8]| {
            let d = digest(bytes);
            std::fs::write(blobs.join(&d["sha256:".len()..]), bytes).expect("blob");
        };
        put(&b.config);
        put(&b.manifest);
        for l in &b.layers {
            put(l);
        }
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
            .expect("marker");
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest(&b.manifest),
                "size": b.manifest.len(),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }],
        });
        std::fs::write(
            dir.join("index.json"),
            serde_json::to_vec(&index).expect("json"),
        )
        .expect("index");
        b
    }

    /// Writes a legacy `docker save` archive of this image (uncompressed layers).
    pub fn write_docker_archive(&self, file: &Path, repo_tag: &str) {
        let config = self.config_json();
        let config_name = format!("{}.json", &digest(&config)["sha256:".len()..]);
        let mut b = tar::Builder::new(std::fs::File::create(file).expect("archive"));
        let mut add = |name: &str, bytes: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, name, bytes).expect("append");
        };
        let mut names = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let name = format!("layer{i}/layer.tar");
            add(&name, l);
            names.push(name);
        }
        add(&config_name, &config);
        let manifest = serde_json::json!([{
            "Config": config_name,
            "RepoTags": [repo_tag],
            "Layers": names,
        }]);
        add(
            "manifest.json",
            &serde_json::to_vec(&manifest).expect("json"),
        );
        b.finish().expect("archive");
    }
}

/// Runs the real `space template build NAME --from REF [extra…]` on `data_dir`, as an
/// operator would: (success, stdout and stderr).
pub fn build_template(data_dir: &Path, name: &str, from: &str, extra: &[&str]) -> (bool, String) {
    let data_dir = data_dir.to_str().expect("a UTF-8 data directory");
    let args = [
        &[
            "--data-dir",
            data_dir,
            "template",
            "build",
            name,
            "--from",
            from,
        ][..],
        extra,
    ]
    .concat();
    run_space(&args)
}

/// Runs the `space` binary with `args` (and this suite's `spaced` for kernel bundles):
/// (success, stdout and stderr).
pub fn run_space(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(crate::node_manager::space_binary())
        .args(args)
        .env("SPACE_SPACED_BIN", crate::spaced_binary())
        .output()
        .expect("run space");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

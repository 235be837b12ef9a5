//! Template recipes (pure data): what each template is made of, and its digest.
//!
//! The config files and package list live in `images/templates/<name>/` and are embedded
//! here, so they are reviewable as files and part of the digest.

use space_core::Resources;

use crate::digest::InputDigest;

/// A file a recipe writes into the root filesystem (owned by root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigFile {
    /// Path inside the root filesystem, without the leading `/`.
    pub path: &'static str,
    /// Permission bits.
    pub mode: u32,
    /// Contents.
    pub contents: &'static str,
}

/// A file a recipe copies from the host, at the same path (dereferenced, owned by root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFile {
    /// Path on the host and in the root filesystem, without the leading `/`.
    pub path: &'static str,
    /// A dynamically linked program: mode 0755, and the shared libraries it needs (as the
    /// host's `ldd` resolves them) and its dynamic loader are copied too, at the paths the
    /// host has them. Otherwise a data file, mode 0644.
    pub executable: bool,
}

/// A symbolic link a recipe creates (owned by root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Path of the link, without the leading `/`.
    pub path: &'static str,
    /// What it points to.
    pub target: &'static str,
}

/// A directory a recipe creates (owned by root), with any missing parents (mode 0755).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dir {
    /// Path, without the leading `/`.
    pub path: &'static str,
    /// Permission bits.
    pub mode: u32,
}

/// How the root filesystem is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecipeKind {
    /// A static busybox with its applets linked, a minimal /etc, and a few programs (with
    /// their libraries and glibc) copied from the host's Debian packages. Builds in seconds.
    Busybox {
        /// Files copied from the host (their sha256 are digest inputs).
        host_files: &'static [HostFile],
        /// Directories created.
        dirs: &'static [Dir],
        /// Symbolic links created.
        links: &'static [Link],
    },
    /// `debootstrap --variant=<variant> --include=<packages> <suite>`, then `apt-get
    /// install <apt_packages>` in the tree, then a `user` account.
    Debootstrap {
        /// Debian suite.
        suite: &'static str,
        /// debootstrap variant.
        variant: &'static str,
    },
}

/// One template recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecipe {
    /// Template name.
    pub name: &'static str,
    /// Bumped whenever the build steps change, so old images are not reused.
    pub version: u32,
    /// One line about it.
    pub description: &'static str,
    /// How it is built.
    pub kind: RecipeKind,
    /// Packages installed (debootstrap recipes).
    pub packages: Vec<String>,
    /// Packages installed with apt-get in the debootstrapped tree (debootstrap recipes):
    /// what debootstrap's `--include` cannot configure (npm's dependencies).
    pub apt_packages: Vec<String>,
    /// Files written into the root filesystem.
    pub files: &'static [ConfigFile],
    /// Fixed image size; `None`: used space + 30% + 64 MiB.
    pub image_size_mib: Option<u32>,
    /// Resources when a create request gives none.
    pub default_resources: Resources,
    /// The user commands run as by default.
    pub default_user: &'static str,
}

const BUSYBOX_FILES: &[ConfigFile] = &[
    ConfigFile {
        path: "etc/passwd",
        mode: 0o644,
        contents: include_str!("../../../../images/templates/busybox/etc/passwd"),
    },
    ConfigFile {
        path: "etc/group",
        mode: 0o644,
        contents: include_str!("../../../../images/templates/busybox/etc/group"),
    },
    ConfigFile {
        path: "etc/hostname",
        mode: 0o644,
        contents: include_str!("../../../../images/templates/busybox/etc/hostname"),
    },
    ConfigFile {
        path: "etc/hosts",
        mode: 0o644,
        contents: include_str!("../../../../images/templates/busybox/etc/hosts"),
    },
    ConfigFile {
        path: "etc/nsswitch.conf",
        mode: 0o644,
        contents: include_str!("../../../../images/templates/busybox/etc/nsswitch.conf"),
    },
    // The CA bundle curl and openssl use by default (Debian's path); empty: the node appends
    // the sandbox's CA (and puts the PEM in usr/local/share/ca-certificates).
    ConfigFile {
        path: "etc/ssl/certs/ca-certificates.crt",
        mode: 0o644,
        contents: include_str!(
            "../../../../images/templates/busybox/etc/ssl/certs/ca-certificates.crt"
        ),
    },
];

/// Programs for tests inside sandboxes, from the host's Debian packages (installed by
/// scripts/lib/common.sh): bash, which the E2B SDKs start every command and PTY with
/// (`/bin/bash -l -c …`, `/bin/bash -i -l`), and the network clients curl and openssl
/// (with libcurl4, libssl3 and their dependencies).
const BUSYBOX_HOST_FILES: &[HostFile] = &[
    // Replaces busybox's applet of that name if it has one: the SDKs need bash itself.
    HostFile {
        path: "bin/bash",
        executable: true,
    },
    HostFile {
        path: "usr/bin/curl",
        executable: true,
    },
    HostFile {
        path: "usr/bin/openssl",
        executable: true,
    },
    // `openssl req`, `ca` and friends need a config file.
    HostFile {
        path: "etc/ssl/openssl.cnf",
        executable: false,
    },
];

const BUSYBOX_DIRS: &[Dir] = &[
    Dir {
        path: "etc/ssl",
        mode: 0o755,
    },
    Dir {
        path: "etc/ssl/certs",
        mode: 0o755,
    },
    Dir {
        path: "etc/ssl/private",
        mode: 0o700,
    },
    // Where the node puts the sandbox's CA certificate (as Debian's update-ca-certificates
    // expects local CAs).
    Dir {
        path: "usr/local/share/ca-certificates",
        mode: 0o755,
    },
];

/// OpenSSL's directory (OPENSSLDIR), laid out as Debian's openssl package does: its default
/// CA file is the bundle in /etc/ssl/certs, as curl's is.
const BUSYBOX_LINKS: &[Link] = &[
    Link {
        path: "usr/lib/ssl/cert.pem",
        target: "/etc/ssl/certs/ca-certificates.crt",
    },
    Link {
        path: "usr/lib/ssl/certs",
        target: "/etc/ssl/certs",
    },
    Link {
        path: "usr/lib/ssl/openssl.cnf",
        target: "/etc/ssl/openssl.cnf",
    },
    Link {
        path: "usr/lib/ssl/private",
        target: "/etc/ssl/private",
    },
];

const BASE_FILES: &[ConfigFile] = &[
    ConfigFile {
        path: "etc/hostname",
        mode: 0o644,
        contents: include_str!("../../../../images/templates/base/etc/hostname"),
    },
    ConfigFile {
        path: "etc/hosts",
        mode: 0o644,
        contents: include_str!("../../../../images/templates/base/etc/hosts"),
    },
    ConfigFile {
        path: "etc/fstab",
        mode: 0o644,
        contents: include_str!("../../../../images/templates/base/etc/fstab"),
    },
    ConfigFile {
        path: "etc/sudoers.d/user",
        mode: 0o440,
        contents: include_str!("../../../../images/templates/base/etc/sudoers.d/user"),
    },
];

const BASE_PACKAGES: &str = include_str!("../../../../images/templates/base/packages");
const BASE_APT_PACKAGES: &str = include_str!("../../../../images/templates/base/apt-packages");

/// A package list file's packages (blank lines and `#` comments skipped).
fn package_list(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// The size of the busybox template's image (about 24 MiB of files).
pub const BUSYBOX_IMAGE_MIB: u32 = 64;

/// All recipes, by name.
pub fn recipes() -> Vec<TemplateRecipe> {
    vec![
        TemplateRecipe {
            name: "base",
            version: 1,
            description: "Debian 12 (bookworm) with Python 3 (pip, venv), Node.js (npm), git, curl, gcc/g++/make; user 'user' with passwordless sudo",
            kind: RecipeKind::Debootstrap { suite: "bookworm", variant: "minbase" },
            packages: package_list(BASE_PACKAGES),
            apt_packages: package_list(BASE_APT_PACKAGES),
            files: BASE_FILES,
            image_size_mib: None,
            default_resources: Resources { vcpus: 1, memory_mib: 512, disk_mib: 4096 },
            default_user: "user",
        },
        TemplateRecipe {
            name: "busybox",
            version: 3,
            description: "Static busybox, plus Debian's bash, curl and openssl; small and fast to build (for tests)",
            kind: RecipeKind::Busybox {
                host_files: BUSYBOX_HOST_FILES,
                dirs: BUSYBOX_DIRS,
                links: BUSYBOX_LINKS,
            },
            packages: Vec::new(),
            apt_packages: Vec::new(),
            files: BUSYBOX_FILES,
            image_size_mib: Some(BUSYBOX_IMAGE_MIB),
            default_resources: Resources { vcpus: 1, memory_mib: 256, disk_mib: 256 },
            default_user: "user",
        },
    ]
}

/// The recipe called `name`.
pub fn recipe(name: &str) -> Option<TemplateRecipe> {
    recipes().into_iter().find(|r| r.name == name)
}

impl TemplateRecipe {
    /// The template digest: name, version, how it is built, packages and config files, plus
    /// `extra` inputs that are part of the content (e.g. the sha256 of the busybox binary
    /// and of every file copied from the host). Not the mirror, nor the kernel it boots
    /// with, nor metadata like default resources.
    pub fn digest(&self, extra: &[(&str, &str)]) -> String {
        let mut d = InputDigest::new("space-template");
        d.field("name", self.name.as_bytes());
        d.field("version", &self.version.to_le_bytes());
        match self.kind {
            RecipeKind::Busybox {
                host_files,
                dirs,
                links,
            } => {
                d.field("kind", b"busybox");
                for f in host_files {
                    d.field("host_file", f.path.as_bytes())
                        .field("executable", &[u8::from(f.executable)]);
                }
                for dir in dirs {
                    d.field("dir", dir.path.as_bytes())
                        .field("mode", &dir.mode.to_le_bytes());
                }
                for l in links {
                    d.field("link", l.path.as_bytes())
                        .field("target", l.target.as_bytes());
                }
            }
            RecipeKind::Debootstrap { suite, variant } => {
                d.field("kind", b"debootstrap")
                    .field("suite", suite.as_bytes())
                    .field("variant", variant.as_bytes());
            }
        }
        for p in &self.apt_packages {
            d.field("apt_package", p.as_bytes());
        }
        for p in &self.packages {
            d.field("package", p.as_bytes());
        }
        for f in self.files {
            d.field("file", f.path.as_bytes())
                .field("mode", &f.mode.to_le_bytes())
                .field("contents", f.contents.as_bytes());
        }
        d.field(
            "image_size_mib",
            &self.image_size_mib.unwrap_or(0).to_le_bytes(),
        );
        for (k, v) in extra {
            d.field(k, v.as_bytes());
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_are_consistent() {
        let base = recipe("base").unwrap();
        assert_eq!(
            base.packages,
            [
                "python3",
                "ca-certificates",
                "coreutils",
                "bash",
                "git",
                "curl",
                "sudo",
                "procps",
                "iproute2"
            ]
        );
        for p in [
            "python3-pip",
            "python3-venv",
            "nodejs",
            "npm",
            "build-essential",
        ] {
            assert!(base.apt_packages.iter().any(|a| a == p), "{p}");
        }
        assert!(base
            .files
            .iter()
            .any(|f| f.path == "etc/sudoers.d/user" && f.mode == 0o440));
        let bb = recipe("busybox").unwrap();
        assert_eq!(
            bb.default_resources,
            Resources {
                vcpus: 1,
                memory_mib: 256,
                disk_mib: 256
            }
        );
        for r in recipes() {
            assert!(space_core::template::validate_template_name(r.name));
            assert!(r
                .default_resources
                .validate(r.image_size_mib.unwrap_or(1))
                .is_ok());
        }
        assert!(recipe("nope").is_none());
    }

    #[test]
    fn busybox_has_bash_network_clients_and_the_ca_bundle() {
        let bb = recipe("busybox").unwrap();
        let RecipeKind::Busybox {
            host_files,
            dirs,
            links,
        } = bb.kind
        else {
            panic!("busybox is not a busybox recipe");
        };
        for exe in ["bin/bash", "usr/bin/curl", "usr/bin/openssl"] {
            assert!(
                host_files.iter().any(|f| f.path == exe && f.executable),
                "{exe}"
            );
        }
        assert!(bb
            .files
            .iter()
            .any(|f| f.path == "etc/ssl/certs/ca-certificates.crt"));
        assert!(dirs
            .iter()
            .any(|d| d.path == "usr/local/share/ca-certificates"));
        assert!(links.iter().any(|l| l.path == "usr/lib/ssl/cert.pem"
            && l.target == "/etc/ssl/certs/ca-certificates.crt"));
        let paths = host_files
            .iter()
            .map(|f| f.path)
            .chain(dirs.iter().map(|d| d.path))
            .chain(links.iter().map(|l| l.path));
        for p in paths {
            assert!(!p.starts_with('/') && !p.contains(".."), "{p}");
        }
    }

    #[test]
    fn digest_depends_on_content_inputs_only() {
        let bb = recipe("busybox").unwrap();
        let d1 = bb.digest(&[("busybox", "aa")]);
        assert_eq!(d1, bb.digest(&[("busybox", "aa")]));
        assert_ne!(d1, bb.digest(&[("busybox", "bb")]));
        let mut bumped = bb.clone();
        bumped.version += 1;
        assert_ne!(d1, bumped.digest(&[("busybox", "aa")]));
        let mut other_defaults = bb.clone();
        other_defaults.default_resources.memory_mib = 1024;
        assert_eq!(d1, other_defaults.digest(&[("busybox", "aa")]));
        assert_ne!(recipe("base").unwrap().digest(&[]), d1);
        // Host files: their contents (extra inputs) and the recipe's lists.
        let with_curl = bb.digest(&[
            ("busybox", "aa"),
            ("host_file", "usr/bin/curl"),
            ("host_file_sha256", "11"),
        ]);
        assert_ne!(with_curl, d1);
        assert_ne!(
            with_curl,
            bb.digest(&[
                ("busybox", "aa"),
                ("host_file", "usr/bin/curl"),
                ("host_file_sha256", "22"),
            ])
        );
        let mut fewer = bb.clone();
        if let RecipeKind::Busybox { host_files, .. } = &mut fewer.kind {
            *host_files = &host_files[..1];
        }
        assert_ne!(d1, fewer.digest(&[("busybox", "aa")]));
        let mut no_links = bb.clone();
        if let RecipeKind::Busybox { links, .. } = &mut no_links.kind {
            *links = &[];
        }
        assert_ne!(d1, no_links.digest(&[("busybox", "aa")]));
    }
}

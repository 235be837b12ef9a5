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

/// How the root filesystem is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecipeKind {
    /// A static busybox with its applets linked, and a minimal /etc. Builds in seconds.
    Busybox,
    /// `debootstrap --variant=<variant> --include=<packages> <suite>`, then a `user` account.
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

/// The size of the busybox template's image.
pub const BUSYBOX_IMAGE_MIB: u32 = 48;

/// All recipes, by name.
pub fn recipes() -> Vec<TemplateRecipe> {
    vec![
        TemplateRecipe {
            name: "base",
            version: 1,
            description: "Debian 12 (bookworm) minbase with python3, git, curl, sudo; user 'user' with passwordless sudo",
            kind: RecipeKind::Debootstrap { suite: "bookworm", variant: "minbase" },
            packages: BASE_PACKAGES.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect(),
            files: BASE_FILES,
            image_size_mib: None,
            default_resources: Resources { vcpus: 1, memory_mib: 512, disk_mib: 4096 },
            default_user: "user",
        },
        TemplateRecipe {
            name: "busybox",
            version: 1,
            description: "Static busybox only; small and fast to build (for tests)",
            kind: RecipeKind::Busybox,
            packages: Vec::new(),
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
    /// `extra` inputs that are part of the content (e.g. the busybox binary's sha256). Not
    /// the mirror, nor the kernel it boots with, nor metadata like default resources.
    pub fn digest(&self, extra: &[(&str, &str)]) -> String {
        let mut d = InputDigest::new("space-template");
        d.field("name", self.name.as_bytes());
        d.field("version", &self.version.to_le_bytes());
        match self.kind {
            RecipeKind::Busybox => d.field("kind", b"busybox"),
            RecipeKind::Debootstrap { suite, variant } => d
                .field("kind", b"debootstrap")
                .field("suite", suite.as_bytes())
                .field("variant", variant.as_bytes()),
        };
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
    }
}

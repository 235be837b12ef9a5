//! The error type of image builds: each variant says which input or step failed.

use std::io;
use std::path::PathBuf;

/// Why building a kernel bundle or template failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The store failed (locking, staging, metadata).
    #[error(transparent)]
    Storage(#[from] space_storage::StorageError),
    /// A filesystem call failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What we were doing.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A build tool could not be started.
    #[error("cannot run {program}: {source} (is it installed?)")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        source: io::Error,
    },
    /// A build tool failed.
    #[error("`{command}` failed ({status}); last output:\n{output}")]
    Command {
        /// The command line.
        command: String,
        /// How it exited.
        status: String,
        /// Its last lines of output.
        output: String,
    },
    /// No kernel to bundle.
    #[error("no kernel found: {0}")]
    NoKernel(String),
    /// A required kernel module is not in modules.dep.
    #[error("kernel module {module} not found in {modules_dep}")]
    ModuleMissing {
        /// The module name.
        module: String,
        /// The modules.dep file searched.
        modules_dep: PathBuf,
    },
    /// modules.dep has a dependency cycle.
    #[error("dependency cycle in modules.dep involving {0}")]
    ModuleCycle(String),
    /// The kernel's modules are compressed; the initramfs loads them with busybox insmod,
    /// which is only given plain .ko files.
    #[error("kernel module {0} is compressed; only uncompressed .ko modules are supported (install a kernel with uncompressed modules or decompress them)")]
    CompressedModule(String),
    /// Two modules would have the same file name in the initramfs.
    #[error("two kernel modules share the file name {0}")]
    ModuleNameClash(String),
    /// No recipe of that name.
    #[error("unknown template {name:?}; known templates: {known}")]
    UnknownTemplate {
        /// The name asked for.
        name: String,
        /// The recipes there are.
        known: String,
    },
    /// The template's kernel bundle is not in the store.
    #[error("kernel bundle {0} is not in the store; build it first (build_kernel_bundle)")]
    KernelMissing(String),
    /// Building needs root (debootstrap, chroot, file ownership in the image).
    #[error("building {0} needs root")]
    NotRoot(String),
    /// A tool gave output we cannot use.
    #[error("unexpected output from {program}: {detail}")]
    BadOutput {
        /// The program.
        program: String,
        /// What was wrong.
        detail: String,
    },
    /// A file a template takes from the host is missing or unusable (e.g. a library of it
    /// is not found).
    #[error("host file {path}: {detail}")]
    HostFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A container image could not become a template.
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
    /// A file is too large for the cpio (newc) format.
    #[error("{0} is too large for an initramfs (4 GiB limit per file)")]
    TooLarge(PathBuf),
}

impl ImageError {
    /// Shorthand for [`ImageError::Io`].
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        ImageError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Attaches "what we were doing, to which path" to an `io::Result`.
pub(crate) trait IoContext<T> {
    /// Maps the error to [`ImageError::Io`].
    fn ctx(self, action: &'static str, path: &std::path::Path) -> Result<T, ImageError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, action: &'static str, path: &std::path::Path) -> Result<T, ImageError> {
        self.map_err(|e| ImageError::io(action, path, e))
    }
}

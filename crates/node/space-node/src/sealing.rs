//! A tenant's artifacts at rest, sealed under the tenant's artifact key (customer keys).
//!
//! A tenant with a customer key has one *artifact key*: a data key the control plane keeps
//! wrapped by the customer's key in its KMS. The control plane unwraps it and lends it to the
//! nodes for a short time ([`ArtifactKeys`]); it renews the loan while the customer key
//! stays usable and withdraws it when the key is revoked. A node restart drops every loan.
//!
//! Every artifact a node keeps at rest for a sandbox marked `seal_at_rest` (a checkpoint's
//! saved state and a snapshot's disk in the store, see [`crate::sealed_disks`]; a stored
//! snapshot's artifacts in object storage) is sealed
//! (`space_envelope`) under a key of its own, derived from the artifact key and the
//! artifact's id, which the sealed header also names: a sealed file moved to another
//! artifact's place does not open. Without its tenant's key, such a sandbox's operation
//! fails with `key_unavailable`; nothing is ever written for it in plaintext instead.
//!
//! Saved VM state moves through a pipe: QEMU writes into it and a thread seals what comes out
//! into the file ([`save_state`]); a restore opens the sealed file into a pipe QEMU reads
//! ([`feed_state`]). Plaintext state never touches the disk, and neither side holds more
//! than two chunks of it in memory.

use std::collections::HashMap;
use std::io::BufWriter;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use space_core::{SnapshotId, TenantId};
use space_envelope::{DataKey, EnvelopeError, DEFAULT_CHUNK};
use space_node_proto::snapshot::artifacts;
use space_vmm::{SaveOptions, SaveReport, Vm};

use crate::sandbox_manager::internal;
use crate::{NodeError, SandboxRecord};

/// Longest loan of an artifact key a node accepts.
pub const MAX_LOAN: Duration = Duration::from_secs(3600);
/// How long the node waits for the thread sealing or opening a state once QEMU is done with
/// its end of the pipe.
const PIPE_DRAIN: Duration = Duration::from_secs(30);

/// The artifact keys lent to this node, by tenant. Memory only.
#[derive(Default)]
pub(crate) struct ArtifactKeys {
    lent: Mutex<HashMap<TenantId, Loan>>,
    /// Tenants with snapshot disks left in plaintext (a crash between a snapshot's commit
    /// and its seal) that wait for the key to be sealed.
    awaited: Mutex<std::collections::HashSet<TenantId>>,
}

struct Loan {
    key: DataKey,
    until: Instant,
}

impl ArtifactKeys {
    /// Holds `tenant`'s artifact key for `valid_for` (at most [`MAX_LOAN`]); whether work
    /// was waiting for it ([`ArtifactKeys::await_key`]), which the caller now does.
    pub(crate) fn lend(
        &self,
        tenant: TenantId,
        key: DataKey,
        valid_for: Duration,
    ) -> Result<bool, NodeError> {
        if valid_for.is_zero() || valid_for > MAX_LOAN {
            return Err(NodeError::Invalid(format!(
                "an artifact key is lent for 1 ms to {} s",
                MAX_LOAN.as_secs()
            )));
        }
        let loan = Loan {
            key,
            until: Instant::now() + valid_for,
        };
        let awaited = self
            .awaited
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&tenant);
        self.held().insert(tenant, loan);
        Ok(awaited)
    }

    /// Notes that work waits for `tenant`'s key: the next [`ArtifactKeys::lend`] says so.
    pub(crate) fn await_key(&self, tenant: &TenantId) {
        self.awaited
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(tenant.clone());
    }

    /// Drops `tenant`'s artifact key; whether one was held.
    pub(crate) fn withdraw(&self, tenant: &TenantId) -> bool {
        self.held().remove(tenant).is_some()
    }

    /// The key of `tenant`'s artifact `artifact`.
    fn key_of(&self, tenant: &TenantId, artifact: &str) -> Result<DataKey, NodeError> {
        let mut held = self.held();
        match held.get(tenant) {
            Some(loan) if loan.until > Instant::now() => Ok(loan.key.derive(artifact)),
            Some(_) => {
                held.remove(tenant);
                Err(not_held(tenant, "its loan expired"))
            }
            None => Err(not_held(tenant, "none was lent to this node")),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, Loan>> {
        // A panic elsewhere while holding the lock leaves the map itself intact.
        self.lent.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn not_held(tenant: &TenantId, why: &str) -> NodeError {
    NodeError::KeyUnavailable(format!(
        "tenant {tenant}'s data at rest is sealed under its customer key, and this node does \
         not hold the key to it ({why}); the control plane lends it while the customer key is \
         usable"
    ))
}

/// A key and the id of the artifact it seals.
pub(crate) struct ArtifactSeal {
    pub key: DataKey,
    pub artifact: String,
}

/// The id a checkpoint's saved state is sealed as ([`StateForm::Raw`]).
pub(crate) fn state_artifact(snap: &SnapshotId) -> String {
    format!("snapshots/{snap}/{}", space_storage::SNAPSHOT_STATE_FILE)
}

/// The id a compressed saved state is sealed as: the stored snapshot's memory artifact,
/// which it is (a suspend uploads it as it is, a resume keeps it as it was downloaded).
pub(crate) fn compressed_state_artifact(snap: &SnapshotId) -> String {
    crate::stored::stored_artifact_id(snap, artifacts::MEMORY)
}

/// The form a snapshot's saved state is kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateForm {
    /// QEMU's stream as it is: a checkpoint's (its save is live, and the guest's pause must
    /// not wait on a compressor).
    Raw,
    /// zstd-compressed on the way: a suspend's (one pass from QEMU to the artifact object
    /// storage keeps), and a resumed snapshot's (kept as downloaded).
    Compressed,
}

/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

impl StateForm {
    /// The form of saved state `path`: a sealed one's says its artifact id (`open`, from
    /// [`ArtifactKeys::opener_of_state`]), a plain one's its first bytes.
    pub(crate) fn of(path: &Path, open: Option<&ArtifactSeal>) -> Result<StateForm, NodeError> {
        if let Some(open) = open {
            let compressed = open.artifact.ends_with(&format!("/{}", artifacts::MEMORY));
            return Ok(if compressed {
                Self::Compressed
            } else {
                Self::Raw
            });
        }
        let mut head = [0u8; ZSTD_MAGIC.len()];
        let read = std::fs::File::open(path)
            .and_then(|f| std::os::unix::fs::FileExt::read_at(&f, &mut head, 0));
        let n = read.map_err(|e| internal(&format!("read {}", path.display()), e))?;
        Ok(if n == head.len() && head == ZSTD_MAGIC {
            Self::Compressed
        } else {
            Self::Raw
        })
    }
}

impl ArtifactKeys {
    /// How sandbox `rec`'s new artifact `artifact` is to be written: sealed (with its key),
    /// or, for a sandbox not marked `seal_at_rest`, in plaintext (`None`).
    pub(crate) fn seal_for(
        &self,
        rec: &SandboxRecord,
        artifact: String,
    ) -> Result<Option<ArtifactSeal>, NodeError> {
        if !rec.seal_at_rest {
            return Ok(None);
        }
        let tenant = rec.tenant.as_ref().ok_or_else(|| {
            NodeError::Internal(format!(
                "sandbox {} is sealed at rest but has no tenant",
                rec.id
            ))
        })?;
        self.seal_of(tenant, artifact).map(Some)
    }

    /// How to open saved state `path` of a snapshot of `tenant`: a sealed file needs the
    /// tenant's key and the artifact id its place names; a plain one nothing.
    pub(crate) fn opener_of_state(
        &self,
        tenant: Option<&TenantId>,
        path: &Path,
    ) -> Result<Option<ArtifactSeal>, NodeError> {
        let sealed = space_envelope::is_sealed_file(path)
            .map_err(|e| internal(&format!("read {}", path.display()), e))?;
        if !sealed {
            return Ok(None);
        }
        // Committed snapshots live in a directory named after their id.
        let snap = path
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<SnapshotId>().ok())
            .ok_or_else(|| {
                NodeError::SnapshotCorrupt(format!(
                    "sealed state {} is not inside a snapshot",
                    path.display()
                ))
            })?;
        // Raw or compressed (the stored snapshot's memory artifact, moved as it is): the
        // header says which, and only these two of this very snapshot are accepted.
        let named = space_envelope::sealed_artifact_id(path)
            .map_err(|e| envelope_error("its saved state", e))?;
        let artifact = [state_artifact(&snap), compressed_state_artifact(&snap)]
            .into_iter()
            .find(|a| named.as_deref() == Some(a.as_str()))
            .ok_or_else(|| {
                NodeError::SnapshotCorrupt(format!(
                    "its saved state is sealed as another artifact ({})",
                    named.unwrap_or_default()
                ))
            })?;
        self.opener(tenant, artifact, "a sealed state").map(Some)
    }

    /// The key that opens `what`, sealed as `artifact`, of a snapshot of `tenant`: a sealed
    /// artifact of a snapshot that names no tenant is damaged.
    pub(crate) fn opener(
        &self,
        tenant: Option<&TenantId>,
        artifact: String,
        what: &str,
    ) -> Result<ArtifactSeal, NodeError> {
        let tenant = tenant.ok_or_else(|| {
            NodeError::SnapshotCorrupt(format!("{what} of a snapshot without a tenant"))
        })?;
        self.seal_of(tenant, artifact)
    }

    /// `tenant`'s artifact `artifact` with its key, to seal or open it.
    pub(crate) fn seal_of(
        &self,
        tenant: &TenantId,
        artifact: String,
    ) -> Result<ArtifactSeal, NodeError> {
        let key = self.key_of(tenant, &artifact)?;
        Ok(ArtifactSeal { key, artifact })
    }
}

/// Saves `vm`'s state into a new file `path` in `form`, sealed when `seal` says so (see the
/// module docs; `seal` names the artifact of that form). As [`Vm::save_state`]: on success
/// the VM is paused; on failure it runs on. A sealed or compressed save may still be writing
/// the file when this returns (the tail of QEMU's stream goes through this process): the
/// caller resumes the VM first, so sealing never lengthens the guest's pause, then calls
/// [`StateSaved::finish`].
pub(crate) async fn save_state(
    vm: &Vm,
    path: &Path,
    seal: Option<ArtifactSeal>,
    form: StateForm,
    opts: SaveOptions,
) -> Result<StateSaved, NodeError> {
    let file = std::fs::File::create(path)
        .map_err(|e| internal(&format!("create {}", path.display()), e))?;
    if seal.is_none() && form == StateForm::Raw {
        let mut report = vm.save_state(file.as_fd(), opts).await?;
        report.bytes = file
            .metadata()
            .map_err(|e| internal(&format!("stat {}", path.display()), e))?
            .len();
        return Ok(StateSaved {
            report,
            writer: None,
        });
    }
    let (reader, writer) = chunk_pipe()?;
    let written = tokio::task::spawn_blocking(move || match (seal, form) {
        (Some(seal), StateForm::Raw) => {
            let mut out = BufWriter::with_capacity(DEFAULT_CHUNK as usize, file);
            let n =
                space_envelope::seal(&seal.key, &seal.artifact, DEFAULT_CHUNK, reader, &mut out)
                    .map_err(|e| envelope_error("sealing the saved state", e))?;
            out.into_inner()
                .map_err(|e| internal("write the saved state", e.into_error()))?;
            Ok(n)
        }
        // The bytes of QEMU's stream, as for the other forms.
        (seal, _) => {
            let mut reader = reader;
            write_sealed(seal.as_ref(), file, |w| {
                crate::packing::compress(&mut reader, w)
            })
        }
    });
    let saved = vm.save_state(writer.as_fd(), opts).await;
    // QEMU closes its copy when the migration ends; with ours gone the writer sees the end.
    drop(writer);
    match saved {
        Ok(report) => Ok(StateSaved {
            report,
            writer: Some((written, path.to_owned())),
        }),
        Err(e) => {
            let _ = drain(written, "writing the saved state").await;
            let _ = std::fs::remove_file(path);
            Err(e.into())
        }
    }
}

/// A save QEMU has completed; a sealed one may still be on its way into its file.
pub(crate) struct StateSaved {
    report: SaveReport,
    /// The thread writing the file, and the file.
    writer: Option<(
        tokio::task::JoinHandle<Result<u64, NodeError>>,
        std::path::PathBuf,
    )>,
}

impl StateSaved {
    /// Waits until the state is whole in its file; on a failure the file is removed (the
    /// VM is as the caller left it).
    pub(crate) async fn finish(self) -> Result<SaveReport, NodeError> {
        let Some((writer, path)) = self.writer else {
            return Ok(self.report);
        };
        match drain(writer, "writing the saved state").await {
            Ok(n) => Ok(SaveReport {
                bytes: n,
                ..self.report
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }
}

/// Feeds saved state `path` into `vm` (launched to restore), opening it first when it is
/// sealed (`open`, from [`ArtifactKeys::opener_of_state`]) and decompressing it when it is
/// kept compressed ([`StateForm`]). The VM is left paused; a state that does not open whole
/// (a changed, swapped, dropped or cut chunk) or does not decompress is refused with
/// [`NodeError::SnapshotCorrupt`], and the caller discards the VM.
pub(crate) async fn feed_state(
    vm: &Vm,
    path: &Path,
    ignore_shared: bool,
    open: Option<ArtifactSeal>,
    timeout: Duration,
) -> Result<(), NodeError> {
    let form = StateForm::of(path, open.as_ref())?;
    let file =
        std::fs::File::open(path).map_err(|e| internal(&format!("open {}", path.display()), e))?;
    if open.is_none() && form == StateForm::Raw {
        return Ok(vm.load_state(file.as_fd(), ignore_shared, timeout).await?);
    }
    let (reader, writer) = chunk_pipe()?;
    let feeder = tokio::task::spawn_blocking(move || match (open, form) {
        (Some(open), StateForm::Raw) => {
            let input = std::io::BufReader::with_capacity(DEFAULT_CHUNK as usize, file);
            space_envelope::open(&open.key, &open.artifact, input, writer)
                .map_err(|e| envelope_error("its saved state", e))
        }
        (open, _) => read_opened(open.as_ref(), file, |compressed| {
            let mut writer = writer;
            let mut dec = zstd::Decoder::new(compressed).map_err(|e| {
                NodeError::SnapshotCorrupt(format!("its saved state does not decompress: {e}"))
            })?;
            match std::io::copy(&mut dec, &mut writer) {
                Ok(n) => Ok(n),
                // QEMU gave up reading: its own error says why.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
                Err(e) => Err(NodeError::SnapshotCorrupt(format!(
                    "its saved state does not decompress: {e}"
                ))),
            }
        }),
    });
    let loaded = vm.load_state(reader.as_fd(), ignore_shared, timeout).await;
    drop(reader);
    let fed = drain(feeder, "feeding the saved state").await;
    match (loaded, fed) {
        (_, Err(NodeError::SnapshotCorrupt(m))) => Err(NodeError::SnapshotCorrupt(m)),
        (Err(e), _) => Err(e.into()),
        (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(_)) => Ok(()),
    }
}

/// Opens sealed file `path` (the snapshot's `what`) whole without keeping its plaintext:
/// whether it is intact.
pub(crate) fn verify(open: &ArtifactSeal, path: &Path, what: &str) -> Result<(), NodeError> {
    let file =
        std::fs::File::open(path).map_err(|e| internal(&format!("open {}", path.display()), e))?;
    let input = std::io::BufReader::with_capacity(DEFAULT_CHUNK as usize, file);
    space_envelope::open(&open.key, &open.artifact, input, std::io::sink())
        .map(drop)
        .map_err(|e| envelope_error(what, e))
}

/// A pipe that holds a whole chunk. Linux's default (64 KiB) makes the two ends take turns
/// sixteen times per chunk; with QEMU, compression and the sealer on two busy cores each turn
/// waits for the scheduler, which measured ~1.4 s on a 186 MiB state. Sized as far as the
/// system allows (`/proc/sys/fs/pipe-max-size`, 1 MiB by default); the default otherwise.
fn chunk_pipe() -> Result<(std::io::PipeReader, std::io::PipeWriter), NodeError> {
    let (reader, writer) = std::io::pipe().map_err(|e| internal("pipe", e))?;
    let size = DEFAULT_CHUNK as i32;
    let sized = nix::fcntl::fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&writer),
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(size),
    );
    if let Err(e) = sized {
        tracing::debug!(error = %e, "pipe left at its default size");
    }
    Ok((reader, writer))
}

/// Waits (bounded) for the thread on the far end of a state pipe.
async fn drain(
    task: tokio::task::JoinHandle<Result<u64, NodeError>>,
    what: &str,
) -> Result<u64, NodeError> {
    match tokio::time::timeout(PIPE_DRAIN, task).await {
        Err(_) => Err(NodeError::Internal(format!("{what} did not finish"))),
        Ok(Err(e)) => Err(internal(what, e)),
        Ok(Ok(result)) => result,
    }
}

/// A sealed artifact that does not open is damaged; anything else is the node's failure.
pub(crate) fn envelope_error(what: &str, e: EnvelopeError) -> NodeError {
    match e {
        EnvelopeError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            NodeError::SnapshotCorrupt(format!("{what}: the sealed artifact is cut short"))
        }
        EnvelopeError::Io(io) => internal(what, io),
        other => NodeError::SnapshotCorrupt(format!("{what}: {other}")),
    }
}

/// Runs `produce` writing into `out`, sealed on the way when `seal` says so: `produce` runs
/// on a thread of its own writing into a pipe, and this thread seals what comes out of it.
/// Returns what `produce` returned. For streams too large to hold (compressed RAM, a disk
/// delta); only two chunks of plaintext are ever in memory.
pub(crate) fn write_sealed<T: Send>(
    seal: Option<&ArtifactSeal>,
    out: std::fs::File,
    produce: impl FnOnce(&mut (dyn std::io::Write + Send)) -> std::io::Result<T> + Send,
) -> Result<T, NodeError> {
    let mut out = BufWriter::with_capacity(DEFAULT_CHUNK as usize, out);
    let Some(seal) = seal else {
        let produced = produce(&mut out).map_err(|e| internal("write", e))?;
        finish(out)?;
        return Ok(produced);
    };
    let (reader, writer) = chunk_pipe()?;
    let (produced, sealed) = std::thread::scope(|scope| {
        let producer = scope.spawn(move || {
            let mut writer = BufWriter::with_capacity(DEFAULT_CHUNK as usize, writer);
            let produced = produce(&mut writer)?;
            std::io::Write::flush(&mut writer)?;
            Ok::<_, std::io::Error>(produced)
        });
        let sealed =
            space_envelope::seal(&seal.key, &seal.artifact, DEFAULT_CHUNK, reader, &mut out);
        (producer.join(), sealed)
    });
    let produced = produced
        .map_err(|_| NodeError::Internal("the writer of a sealed artifact panicked".into()))?
        .map_err(|e| internal("write", e))?;
    sealed.map_err(|e| envelope_error("sealing", e))?;
    finish(out)?;
    Ok(produced)
}

/// Runs `consume` reading `input`, opened on the way when `open` says so (the mirror of
/// [`write_sealed`]). A sealed input that does not open whole fails with
/// [`NodeError::SnapshotCorrupt`] even where `consume` saw nothing wrong (a cut at a chunk
/// boundary looks like a clean end to it).
pub(crate) fn read_opened<T: Send>(
    open: Option<&ArtifactSeal>,
    input: std::fs::File,
    consume: impl FnOnce(&mut (dyn std::io::Read + Send)) -> Result<T, NodeError> + Send,
) -> Result<T, NodeError> {
    let mut input = std::io::BufReader::with_capacity(DEFAULT_CHUNK as usize, input);
    let Some(open) = open else {
        return consume(&mut input);
    };
    let (reader, writer) = chunk_pipe()?;
    let (consumed, opened) = std::thread::scope(|scope| {
        let opener =
            scope.spawn(move || space_envelope::open(&open.key, &open.artifact, input, writer));
        let mut reader = reader;
        let consumed = consume(&mut reader);
        if consumed.is_ok() {
            // What the consumer left unread (a stream's trailer) still has to open: the
            // last chunk proves the artifact whole.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        }
        // On a failure the opener may still be writing: without a reader it stops (EPIPE).
        drop(reader);
        (consumed, opener.join())
    });
    let opened = opened
        .map_err(|_| NodeError::Internal("the opener of a sealed artifact panicked".into()))?;
    match (consumed, opened) {
        (
            _,
            Err(
                e @ (EnvelopeError::Tampered { .. }
                | EnvelopeError::NotSealed
                | EnvelopeError::BadHeader(_)
                | EnvelopeError::WrongArtifact { .. }),
            ),
        ) => Err(envelope_error("opening", e)),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(envelope_error("opening", e)),
        (Ok(v), Ok(_)) => Ok(v),
    }
}

fn finish(out: BufWriter<std::fs::File>) -> Result<(), NodeError> {
    let file = out
        .into_inner()
        .map_err(|e| internal("write", e.into_error()))?;
    file.sync_all().map_err(|e| internal("sync", e))
}

/// `bytes` sealed as `seal.artifact` (small artifacts: a source, a description).
pub(crate) fn seal_bytes(seal: &ArtifactSeal, bytes: &[u8]) -> Result<Vec<u8>, NodeError> {
    let mut out = Vec::with_capacity(bytes.len() + 256);
    space_envelope::seal(&seal.key, &seal.artifact, DEFAULT_CHUNK, bytes, &mut out)
        .map_err(|e| envelope_error("sealing", e))?;
    Ok(out)
}

/// The plaintext of small artifact `sealed` (see [`seal_bytes`]).
pub(crate) fn open_bytes(open: &ArtifactSeal, sealed: &[u8]) -> Result<Vec<u8>, NodeError> {
    let mut out = Vec::with_capacity(sealed.len());
    space_envelope::open(&open.key, &open.artifact, sealed, &mut out)
        .map_err(|e| envelope_error("opening", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_says_its_form() {
        let dir = tempfile::tempdir().unwrap();
        let (raw, compressed) = (dir.path().join("raw"), dir.path().join("compressed"));
        std::fs::write(&raw, b"QEVM\0\0\0\x03 the rest of a migration stream").unwrap();
        std::fs::write(&compressed, zstd::encode_all(&b"QEVM"[..], 3).unwrap()).unwrap();
        assert_eq!(StateForm::of(&raw, None).unwrap(), StateForm::Raw);
        assert_eq!(
            StateForm::of(&compressed, None).unwrap(),
            StateForm::Compressed
        );
        // A sealed one's form is the artifact it is sealed as.
        let snap = SnapshotId::generate();
        let seal = |artifact: String| ArtifactSeal {
            key: DataKey::generate(),
            artifact,
        };
        assert_eq!(
            StateForm::of(&raw, Some(&seal(state_artifact(&snap)))).unwrap(),
            StateForm::Raw
        );
        assert_eq!(
            StateForm::of(&raw, Some(&seal(compressed_state_artifact(&snap)))).unwrap(),
            StateForm::Compressed
        );
    }
}

//! The sealed format of one artifact.
//!
//! ```text
//! magic      8 bytes   "SPCSEAL1"
//! chunk      4 bytes   plaintext bytes per chunk, big-endian ([MIN_CHUNK, MAX_CHUNK])
//! prefix    19 bytes   random: the STREAM nonce prefix of this artifact
//! id_len     2 bytes   big-endian, at most MAX_ID
//! id                   the artifact's id (UTF-8), e.g. "snp-…/memory.zst"
//! chunks               each `chunk` plaintext bytes (the last one fewer, or as many) sealed:
//!                      ciphertext ‖ 16-byte tag
//! ```
//!
//! Each chunk is sealed with XChaCha20-Poly1305 under the STREAM construction (`aead::stream`,
//! big-endian 32-bit counter): its nonce is the prefix, its position and whether it is the
//! last, and its associated data the SHA-256 of the header. So a chunk opens only at its own
//! position, in its own artifact, with the right ending: a changed byte, a reordered,
//! dropped, repeated or appended chunk, a cut at any point (a chunk boundary included) and a
//! header edited or moved to another artifact's id all fail to open. A fresh data key and
//! a random prefix per artifact mean no nonce is ever used twice under one key.
//!
//! Sealing and opening hold two chunks in memory, whatever the artifact's size. What
//! [`open`] wrote before it found a bad chunk is not to be used: [`open_file`] writes a
//! hidden sibling and renames it into place only once every chunk opened.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::stream::{NewStream, StreamBE32, StreamPrimitive};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::DataKey;

const MAGIC: &[u8; 8] = b"SPCSEAL1";
/// Length of the STREAM nonce prefix (XChaCha20's 24-byte nonce less the 5 STREAM uses).
const PREFIX_LEN: usize = 19;
/// Length of a chunk's tag.
const TAG_LEN: usize = 16;
/// Smallest chunk.
pub const MIN_CHUNK: u32 = 4 * 1024;
/// Largest chunk (what opening holds in memory, twice).
pub const MAX_CHUNK: u32 = 16 << 20;
/// The chunk [`seal`] is usually given: 1 MiB.
pub const DEFAULT_CHUNK: u32 = 1 << 20;
/// Longest artifact id.
pub const MAX_ID: usize = 512;

/// Why an artifact cannot be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Not a sealed artifact (no header of this format).
    #[error("not a sealed artifact")]
    NotSealed,
    /// The header is malformed.
    #[error("the sealed artifact's header is malformed: {0}")]
    BadHeader(&'static str),
    /// Sealed as another artifact than the one asked for.
    #[error("the sealed artifact is {found:?}, not {expected:?}")]
    WrongArtifact {
        /// The id asked for.
        expected: String,
        /// The id in the header.
        found: String,
    },
    /// A chunk does not open: the data was changed, reordered, cut or sealed under another
    /// key.
    #[error(
        "the sealed artifact is damaged or not sealed under this key (chunk {chunk} does not open)"
    )]
    Tampered {
        /// The first chunk that does not open (0-based).
        chunk: u32,
    },
    /// More chunks than the format counts (4 Gi chunks).
    #[error("the artifact is too long for its chunk size")]
    TooLong,
    /// A chunk size or id out of bounds.
    #[error("{0}")]
    Invalid(String),
}

/// The header of an artifact: its bytes, and the associated data of its chunks.
struct Header {
    bytes: Vec<u8>,
    chunk: u32,
    prefix: [u8; PREFIX_LEN],
}

impl Header {
    fn new(artifact: &str, chunk: u32, prefix: [u8; PREFIX_LEN]) -> Header {
        let mut bytes = Vec::with_capacity(8 + 4 + PREFIX_LEN + 2 + artifact.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&chunk.to_be_bytes());
        bytes.extend_from_slice(&prefix);
        // Checked by the callers: at most MAX_ID.
        bytes.extend_from_slice(&(artifact.len() as u16).to_be_bytes());
        bytes.extend_from_slice(artifact.as_bytes());
        Header {
            bytes,
            chunk,
            prefix,
        }
    }

    fn aad(&self) -> [u8; 32] {
        Sha256::digest(&self.bytes).into()
    }

    fn stream(&self, key: &DataKey) -> StreamBE32<XChaCha20Poly1305> {
        let aead = XChaCha20Poly1305::new(key.expose().into());
        StreamBE32::from_aead(aead, (&self.prefix).into())
    }

    /// Reads a header, checking it names `artifact`.
    fn read(reader: &mut impl Read, artifact: &str) -> Result<Header, EnvelopeError> {
        let mut fixed = [0u8; 8 + 4 + PREFIX_LEN + 2];
        match read_full(reader, &mut fixed)? {
            n if n < 8 || &fixed[..8] != MAGIC => return Err(EnvelopeError::NotSealed),
            n if n < fixed.len() => return Err(EnvelopeError::BadHeader("cut short")),
            _ => {}
        }
        let chunk = u32::from_be_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]);
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return Err(EnvelopeError::BadHeader("chunk size out of bounds"));
        }
        let mut prefix = [0u8; PREFIX_LEN];
        prefix.copy_from_slice(&fixed[12..12 + PREFIX_LEN]);
        let id_len = usize::from(u16::from_be_bytes([
            fixed[12 + PREFIX_LEN],
            fixed[13 + PREFIX_LEN],
        ]));
        if id_len > MAX_ID {
            return Err(EnvelopeError::BadHeader("artifact id too long"));
        }
        let mut id = vec![0u8; id_len];
        if read_full(reader, &mut id)? < id_len {
            return Err(EnvelopeError::BadHeader("cut short"));
        }
        let found = String::from_utf8(id).map_err(|_| EnvelopeError::BadHeader("artifact id"))?;
        if found != artifact {
            return Err(EnvelopeError::WrongArtifact {
                expected: artifact.to_owned(),
                found,
            });
        }
        Ok(Header::new(artifact, chunk, prefix))
    }
}

fn check_artifact(artifact: &str) -> Result<(), EnvelopeError> {
    if artifact.is_empty() || artifact.len() > MAX_ID {
        return Err(EnvelopeError::Invalid(format!(
            "an artifact id is 1 to {MAX_ID} bytes"
        )));
    }
    Ok(())
}

/// Seals what `reader` yields as artifact `artifact` under `key`, in chunks of `chunk`
/// bytes, to `writer`; returns how many plaintext bytes it sealed.
pub fn seal(
    key: &DataKey,
    artifact: &str,
    chunk: u32,
    mut reader: impl Read,
    mut writer: impl Write,
) -> Result<u64, EnvelopeError> {
    check_artifact(artifact)?;
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
        return Err(EnvelopeError::Invalid(format!(
            "a chunk is {MIN_CHUNK} to {MAX_CHUNK} bytes"
        )));
    }
    let mut prefix = [0u8; PREFIX_LEN];
    rand::rngs::OsRng.fill_bytes(&mut prefix);
    let header = Header::new(artifact, chunk, prefix);
    writer.write_all(&header.bytes)?;
    let (aad, stream) = (header.aad(), header.stream(key));
    let mut total = 0u64;
    each_block(&mut reader, chunk as usize, |position, last, block| {
        total += block.len() as u64;
        stream
            .encrypt_in_place(position, last, &aad, block)
            .map_err(|_| EnvelopeError::TooLong)?;
        writer.write_all(block)?;
        Ok(())
    })?;
    writer.flush()?;
    Ok(total)
}

/// Opens artifact `artifact` sealed under `key` from `reader`, writing its plaintext to
/// `writer`; returns how many bytes that is. On an error, what was written is not to be
/// used (see [`open_file`]).
pub fn open(
    key: &DataKey,
    artifact: &str,
    mut reader: impl Read,
    mut writer: impl Write,
) -> Result<u64, EnvelopeError> {
    check_artifact(artifact)?;
    let header = Header::read(&mut reader, artifact)?;
    let (aad, stream) = (header.aad(), header.stream(key));
    let mut total = 0u64;
    each_block(
        &mut reader,
        header.chunk as usize + TAG_LEN,
        |position, last, block| {
            stream
                .decrypt_in_place(position, last, &aad, block)
                .map_err(|_| EnvelopeError::Tampered { chunk: position })?;
            total += block.len() as u64;
            writer.write_all(block)?;
            Ok(())
        },
    )?;
    writer.flush()?;
    Ok(total)
}

/// Reads `reader` in blocks of `size` bytes (the last one shorter, or as long, or empty)
/// and hands each to `f` with its position and whether it is the last: a full block is the
/// last only if nothing follows it, so one block is read ahead. Each block's buffer has room
/// for a tag to grow into.
fn each_block(
    reader: &mut impl Read,
    size: usize,
    mut f: impl FnMut(u32, bool, &mut Vec<u8>) -> Result<(), EnvelopeError>,
) -> Result<(), EnvelopeError> {
    let mut current = Vec::with_capacity(size + TAG_LEN);
    let mut next = Vec::with_capacity(size + TAG_LEN);
    fill(reader, &mut current, size)?;
    for position in 0..=u32::MAX {
        let last = current.len() < size || {
            fill(reader, &mut next, size)?;
            next.is_empty()
        };
        f(position, last, &mut current)?;
        if last {
            return Ok(());
        }
        std::mem::swap(&mut current, &mut next);
    }
    Err(EnvelopeError::TooLong)
}

/// The length of an artifact of `plain` bytes sealed in chunks of `chunk` with an id of
/// `id_len` bytes.
pub fn sealed_len(plain: u64, chunk: u32, id_len: usize) -> u64 {
    let chunks = plain.div_ceil(u64::from(chunk)).max(1);
    (8 + 4 + PREFIX_LEN + 2 + id_len) as u64 + plain + chunks * TAG_LEN as u64
}

/// [`seal`] from file `src` to file `dst`, which appears only once whole (and synced).
pub fn seal_file(
    key: &DataKey,
    artifact: &str,
    src: &Path,
    dst: &Path,
) -> Result<u64, EnvelopeError> {
    let input = io::BufReader::new(std::fs::File::open(src)?);
    write_whole(dst, |out| seal(key, artifact, DEFAULT_CHUNK, input, out))
}

/// [`open`] from file `src` to file `dst`, which appears only once every chunk opened: a
/// damaged artifact leaves nothing behind.
pub fn open_file(
    key: &DataKey,
    artifact: &str,
    src: &Path,
    dst: &Path,
) -> Result<u64, EnvelopeError> {
    let input = io::BufReader::new(std::fs::File::open(src)?);
    write_whole(dst, |out| open(key, artifact, input, out))
}

/// Runs `write` into a hidden sibling of `dst`, then renames it into place; removes it on
/// an error.
fn write_whole(
    dst: &Path,
    write: impl FnOnce(&mut io::BufWriter<std::fs::File>) -> Result<u64, EnvelopeError>,
) -> Result<u64, EnvelopeError> {
    let partial = partial_path(dst);
    let result = (|| {
        let mut out = io::BufWriter::new(std::fs::File::create(&partial)?);
        let n = write(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&partial, dst)?;
        Ok(n)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

fn partial_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.sealing"))
}

/// Reads into `buf` (emptied first) until it holds `limit` bytes or the reader ends.
fn fill(reader: &mut impl Read, buf: &mut Vec<u8>, limit: usize) -> io::Result<()> {
    buf.clear();
    let n = reader.take(limit as u64).read_to_end(buf)?;
    debug_assert!(n <= limit);
    Ok(())
}

/// Reads until `buf` is full or the reader ends; returns how much it read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match reader.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "snp-0123456789abcdefghij/memory";

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn sealed(key: &DataKey, plain: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        seal(key, ID, MIN_CHUNK, plain, &mut out).unwrap();
        out
    }

    fn opened(key: &DataKey, artifact: &str, sealed: &[u8]) -> Result<Vec<u8>, EnvelopeError> {
        let mut out = Vec::new();
        open(key, artifact, sealed, &mut out).map(|_| out)
    }

    #[test]
    fn every_length_round_trips_and_has_its_predicted_size() {
        let key = DataKey::generate();
        let c = MIN_CHUNK as usize;
        for len in [0, 1, c - 1, c, c + 1, 3 * c, 3 * c + 7] {
            let plain = data(len);
            let s = sealed(&key, &plain);
            assert_eq!(
                s.len() as u64,
                sealed_len(len as u64, MIN_CHUNK, ID.len()),
                "{len}"
            );
            assert_eq!(opened(&key, ID, &s).unwrap(), plain, "{len}");
            // No run of the plaintext shows through.
            if len >= 64 {
                assert!(!s.windows(32).any(|w| w == &plain[..32]), "{len}");
            }
        }
    }

    #[test]
    fn a_changed_moved_or_cut_artifact_does_not_open() {
        let key = DataKey::generate();
        let c = MIN_CHUNK as usize;
        let plain = data(3 * c + 100);
        let s = sealed(&key, &plain);
        let header = 8 + 4 + PREFIX_LEN + 2 + ID.len();
        let block = c + TAG_LEN;
        let chunk = |i: usize| header + i * block..(header + (i + 1) * block).min(s.len());
        let tampered =
            |e: Result<Vec<u8>, EnvelopeError>| matches!(e, Err(EnvelopeError::Tampered { .. }));

        let mut flipped = s.clone();
        flipped[header + block + 5] ^= 1;
        assert!(matches!(
            opened(&key, ID, &flipped),
            Err(EnvelopeError::Tampered { chunk: 1 })
        ));
        let mut swapped = s[..header].to_vec();
        swapped.extend_from_slice(&s[chunk(1)]);
        swapped.extend_from_slice(&s[chunk(0)]);
        swapped.extend_from_slice(&s[chunk(2).start..]);
        assert!(tampered(opened(&key, ID, &swapped)));
        let mut dropped = s[..header].to_vec();
        dropped.extend_from_slice(&s[chunk(0)]);
        dropped.extend_from_slice(&s[chunk(2).start..]);
        assert!(tampered(opened(&key, ID, &dropped)));
        let mut repeated = s.clone();
        repeated.extend_from_slice(&s[chunk(3)]);
        assert!(tampered(opened(&key, ID, &repeated)));
        // Cut at a chunk boundary, inside a chunk, inside a tag, to the header alone.
        for cut in [header + 2 * block, header + block + 10, s.len() - 3, header] {
            assert!(tampered(opened(&key, ID, &s[..cut])), "cut at {cut}");
        }
        assert!(matches!(
            opened(&key, ID, &s[..header - 3]),
            Err(EnvelopeError::BadHeader(_))
        ));
        assert!(matches!(
            opened(&key, ID, b"plain text, never sealed"),
            Err(EnvelopeError::NotSealed)
        ));
        // Another artifact's name, or its header edited to claim it, or another key.
        assert!(matches!(
            opened(&key, "snp-other/memory", &s),
            Err(EnvelopeError::WrongArtifact { .. })
        ));
        let other = "snp-0123456789abcdefghij/memorx";
        let mut renamed = s.clone();
        renamed[header - 1] = b'x';
        assert!(tampered(opened(&key, other, &renamed)));
        let mut rechunked = s.clone();
        rechunked[11] ^= 1;
        assert!(opened(&key, ID, &rechunked).is_err());
        assert!(tampered(opened(&DataKey::generate(), ID, &s)));
    }

    #[test]
    fn a_file_opens_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let key = DataKey::generate();
        let plain = data(5 * DEFAULT_CHUNK as usize / 2);
        let (src, sealed_path, out) = (
            dir.path().join("memory"),
            dir.path().join("memory.sealed"),
            dir.path().join("memory.opened"),
        );
        std::fs::write(&src, &plain).unwrap();
        seal_file(&key, ID, &src, &sealed_path).unwrap();
        open_file(&key, ID, &sealed_path, &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), plain);
        std::fs::remove_file(&out).unwrap();
        // The last chunk damaged: the first two opened, yet nothing is left behind.
        let mut bytes = std::fs::read(&sealed_path).unwrap();
        let end = bytes.len() - 1;
        bytes[end] ^= 0x80;
        std::fs::write(&sealed_path, &bytes).unwrap();
        assert!(matches!(
            open_file(&key, ID, &sealed_path, &out),
            Err(EnvelopeError::Tampered { chunk: 2 })
        ));
        assert!(!out.exists() && !partial_path(&out).exists());
    }
}

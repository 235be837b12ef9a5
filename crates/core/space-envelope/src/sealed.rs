//! The sealed format of one artifact.
//!
//! ```text
//! magic      8 bytes   "SPCSEAL2"
//! chunk      4 bytes   plaintext bytes per chunk, big-endian ([MIN_CHUNK, MAX_CHUNK])
//! salt      32 bytes   random: this sealing's chunk key is HKDF-SHA256(data key, salt)
//! prefix     7 bytes   random: the nonce prefix of its chunks
//! id_len     2 bytes   big-endian, at most MAX_ID
//! id                   the artifact's id (UTF-8), e.g. "snapshots/snp-…/memory.zst"
//! chunks               each `chunk` plaintext bytes (the last one fewer, or as many) sealed:
//!                      ciphertext ‖ 16-byte tag
//! ```
//!
//! Each chunk is sealed with AES-256-GCM under the STREAM construction (Hoang, Reyhanitabar,
//! Rogaway, Vizár, "Online authenticated-encryption and its nonce-reuse misuse-resistance"):
//! its nonce is the prefix, its position (big-endian 32 bits) and whether it is the last
//! (one byte), and its associated data the SHA-256 of the header. So a chunk opens only at
//! its own position, in its own artifact, with the right ending: a changed byte, a
//! reordered, dropped, repeated or appended chunk, a cut at any point (a chunk boundary
//! included) and a header edited or moved to another artifact's id all fail to open.
//!
//! Every sealing draws a fresh salt, so its chunk key is its own even when one data key
//! seals an artifact twice (a snapshot downloaded again): no (key, nonce) pair is ever used
//! twice, without relying on a 56-bit random prefix. AES-GCM because this is the cipher with
//! hardware support on the machines SPACE runs on (AES-NI, carry-less multiply; ring's
//! assembly, ~5 GiB/s on one core, against ~1.2 GiB/s for XChaCha20-Poly1305 in software):
//! a checkpoint seals the guest's whole RAM on the way to disk. `ring` has no STREAM, so
//! the nonce layout is built here (the one construction this module owns).
//!
//! Sealing and opening hold two chunks in memory, whatever the artifact's size. What
//! [`open`] wrote before it found a bad chunk is not to be used: [`open_file`] writes a
//! hidden sibling and renames it into place only once every chunk opened.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use rand::RngCore;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::data_key::DATA_KEY_LEN;
use crate::DataKey;

const MAGIC: &[u8; 8] = b"SPCSEAL2";
/// Length of the salt a sealing's chunk key is derived with.
const SALT_LEN: usize = 32;
/// Length of the nonce prefix (AES-GCM's 12-byte nonce less STREAM's counter and flag).
const PREFIX_LEN: usize = NONCE_LEN - 5;
/// Length of the header before the artifact's id.
const FIXED_LEN: usize = 8 + 4 + SALT_LEN + PREFIX_LEN + 2;
/// Domain separation of the chunk key.
const CHUNK_KEY_INFO: &[u8] = b"space/sealed-chunks/v2";
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
    salt: [u8; SALT_LEN],
    prefix: [u8; PREFIX_LEN],
}

impl Header {
    fn new(artifact: &str, chunk: u32, salt: [u8; SALT_LEN], prefix: [u8; PREFIX_LEN]) -> Header {
        let mut bytes = Vec::with_capacity(FIXED_LEN + artifact.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&chunk.to_be_bytes());
        bytes.extend_from_slice(&salt);
        bytes.extend_from_slice(&prefix);
        // Checked by the callers: at most MAX_ID.
        bytes.extend_from_slice(&(artifact.len() as u16).to_be_bytes());
        bytes.extend_from_slice(artifact.as_bytes());
        Header {
            bytes,
            chunk,
            salt,
            prefix,
        }
    }

    /// A new header with a fresh salt and prefix.
    fn fresh(artifact: &str, chunk: u32) -> Header {
        let mut salt = [0u8; SALT_LEN];
        let mut prefix = [0u8; PREFIX_LEN];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        rand::rngs::OsRng.fill_bytes(&mut prefix);
        Header::new(artifact, chunk, salt, prefix)
    }

    /// The cipher of this sealing's chunks under data key `key`.
    fn chunks(&self, key: &DataKey) -> Result<ChunkCipher, EnvelopeError> {
        let mut chunk_key = Zeroizing::new([0u8; DATA_KEY_LEN]);
        hkdf::Hkdf::<Sha256>::new(Some(&self.salt), key.expose())
            .expand(CHUNK_KEY_INFO, chunk_key.as_mut())
            .map_err(|_| EnvelopeError::Invalid("cannot derive a chunk key".into()))?;
        let key = UnboundKey::new(&AES_256_GCM, chunk_key.as_ref())
            .map_err(|_| EnvelopeError::Invalid("AES-256-GCM refused a 256-bit key".into()))?;
        Ok(ChunkCipher {
            key: LessSafeKey::new(key),
            prefix: self.prefix,
            aad: Sha256::digest(&self.bytes).into(),
        })
    }

    /// Reads a header, checking it names `artifact`.
    fn read(reader: &mut impl Read, artifact: &str) -> Result<Header, EnvelopeError> {
        let (header, found) = Header::read_any(reader)?;
        if found != artifact {
            return Err(EnvelopeError::WrongArtifact {
                expected: artifact.to_owned(),
                found,
            });
        }
        Ok(header)
    }

    /// Reads a header, whatever artifact it names; with that artifact's id.
    fn read_any(reader: &mut impl Read) -> Result<(Header, String), EnvelopeError> {
        let mut fixed = [0u8; FIXED_LEN];
        match read_full(reader, &mut fixed)? {
            n if n < 8 || &fixed[..8] != MAGIC => return Err(EnvelopeError::NotSealed),
            n if n < fixed.len() => return Err(EnvelopeError::BadHeader("cut short")),
            _ => {}
        }
        let (_, rest) = fixed.split_at(8);
        let (chunk, rest) = rest.split_at(4);
        let (salt, rest) = rest.split_at(SALT_LEN);
        let (prefix, id_len) = rest.split_at(PREFIX_LEN);
        let chunk = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return Err(EnvelopeError::BadHeader("chunk size out of bounds"));
        }
        let id_len = usize::from(u16::from_be_bytes([id_len[0], id_len[1]]));
        if id_len > MAX_ID {
            return Err(EnvelopeError::BadHeader("artifact id too long"));
        }
        let mut id = vec![0u8; id_len];
        if read_full(reader, &mut id)? < id_len {
            return Err(EnvelopeError::BadHeader("cut short"));
        }
        let found = String::from_utf8(id).map_err(|_| EnvelopeError::BadHeader("artifact id"))?;
        let mut salt_bytes = [0u8; SALT_LEN];
        salt_bytes.copy_from_slice(salt);
        let mut prefix_bytes = [0u8; PREFIX_LEN];
        prefix_bytes.copy_from_slice(prefix);
        let header = Header::new(&found, chunk, salt_bytes, prefix_bytes);
        Ok((header, found))
    }
}

/// AES-256-GCM under one sealing's chunk key, STREAM nonces.
struct ChunkCipher {
    key: LessSafeKey,
    prefix: [u8; PREFIX_LEN],
    /// The SHA-256 of the header: every chunk's associated data.
    aad: [u8; 32],
}

impl ChunkCipher {
    /// The nonce of the chunk at `position`: prefix ‖ position ‖ last.
    fn nonce(&self, position: u32, last: bool) -> Nonce {
        let mut nonce = [0u8; NONCE_LEN];
        nonce[..PREFIX_LEN].copy_from_slice(&self.prefix);
        nonce[PREFIX_LEN..NONCE_LEN - 1].copy_from_slice(&position.to_be_bytes());
        nonce[NONCE_LEN - 1] = u8::from(last);
        Nonce::assume_unique_for_key(nonce)
    }

    /// Seals `block` in place, appending its tag.
    fn seal(&self, position: u32, last: bool, block: &mut Vec<u8>) -> Result<(), EnvelopeError> {
        self.key
            .seal_in_place_append_tag(self.nonce(position, last), Aad::from(self.aad), block)
            .map_err(|_| EnvelopeError::TooLong)
    }

    /// Opens `block` (ciphertext ‖ tag) in place, leaving its plaintext.
    fn open(&self, position: u32, last: bool, block: &mut Vec<u8>) -> Result<(), EnvelopeError> {
        let plain = self
            .key
            .open_in_place(self.nonce(position, last), Aad::from(self.aad), block)
            .map_err(|_| EnvelopeError::Tampered { chunk: position })?
            .len();
        block.truncate(plain);
        Ok(())
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
    seal_stream(key, artifact, chunk, &mut reader, &mut writer)
}

/// [`seal`], compiled once here (with this crate's optimisation) rather than in every
/// caller: the cipher is most of the work.
fn seal_stream(
    key: &DataKey,
    artifact: &str,
    chunk: u32,
    mut reader: &mut dyn Read,
    writer: &mut dyn Write,
) -> Result<u64, EnvelopeError> {
    check_artifact(artifact)?;
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
        return Err(EnvelopeError::Invalid(format!(
            "a chunk is {MIN_CHUNK} to {MAX_CHUNK} bytes"
        )));
    }
    let header = Header::fresh(artifact, chunk);
    let cipher = header.chunks(key)?;
    writer.write_all(&header.bytes)?;
    let mut total = 0u64;
    each_block(&mut reader, chunk as usize, |position, last, block| {
        total += block.len() as u64;
        cipher.seal(position, last, block)?;
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
    open_stream(key, artifact, &mut reader, &mut writer)
}

/// [`open`], compiled once here (see [`seal_stream`]).
fn open_stream(
    key: &DataKey,
    artifact: &str,
    mut reader: &mut dyn Read,
    writer: &mut dyn Write,
) -> Result<u64, EnvelopeError> {
    check_artifact(artifact)?;
    let header = Header::read(&mut reader, artifact)?;
    let cipher = header.chunks(key)?;
    let mut total = 0u64;
    each_block(
        &mut reader,
        header.chunk as usize + TAG_LEN,
        |position, last, block| {
            cipher.open(position, last, block)?;
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

/// Whether the file at `path` starts like a sealed artifact (its magic; nothing is checked
/// beyond it: [`open`] checks the rest).
pub fn is_sealed_file(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; MAGIC.len()];
    let mut file = std::fs::File::open(path)?;
    match file.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == MAGIC),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// The artifact id the sealed file at `path` names in its header (not authenticated here:
/// [`open`] with the key of that id checks it), or `None` for a file that is not sealed.
pub fn sealed_artifact_id(path: &Path) -> Result<Option<String>, EnvelopeError> {
    let mut file = io::BufReader::new(std::fs::File::open(path)?);
    match Header::read_any(&mut file) {
        Ok((_, id)) => Ok(Some(id)),
        Err(EnvelopeError::NotSealed) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The length of an artifact of `plain` bytes sealed in chunks of `chunk` with an id of
/// `id_len` bytes.
pub fn sealed_len(plain: u64, chunk: u32, id_len: usize) -> u64 {
    let chunks = plain.div_ceil(u64::from(chunk)).max(1);
    (FIXED_LEN + id_len) as u64 + plain + chunks * TAG_LEN as u64
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
    fn a_sealed_file_names_its_artifact_and_a_plain_one_none() {
        let dir = tempfile::tempdir().unwrap();
        let (sealed_path, plain, cut) = (
            dir.path().join("sealed"),
            dir.path().join("plain"),
            dir.path().join("cut"),
        );
        let bytes = sealed(&DataKey::generate(), &data(100));
        std::fs::write(&sealed_path, &bytes).unwrap();
        std::fs::write(&plain, b"QEVM and more").unwrap();
        std::fs::write(&cut, &bytes[..FIXED_LEN + 3]).unwrap();
        assert_eq!(
            sealed_artifact_id(&sealed_path).unwrap().as_deref(),
            Some(ID)
        );
        assert_eq!(sealed_artifact_id(&plain).unwrap(), None);
        assert!(matches!(
            sealed_artifact_id(&cut),
            Err(EnvelopeError::BadHeader(_))
        ));
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
        let header = FIXED_LEN + ID.len();
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
        // The salt (the chunk key) and the nonce prefix are bound too.
        for at in [12, 12 + SALT_LEN - 1, 12 + SALT_LEN, FIXED_LEN - 3] {
            let mut edited = s.clone();
            edited[at] ^= 1;
            assert!(tampered(opened(&key, ID, &edited)), "byte {at}");
        }
        assert!(tampered(opened(&DataKey::generate(), ID, &s)));
    }

    #[test]
    fn each_sealing_has_a_chunk_key_of_its_own() {
        // One data key sealing the same artifact twice (a snapshot downloaded again) must
        // not reuse a (key, nonce) pair: the ciphertexts share nothing.
        let key = DataKey::generate();
        let plain = data(2 * MIN_CHUNK as usize);
        let (a, b) = (sealed(&key, &plain), sealed(&key, &plain));
        let body = FIXED_LEN + ID.len();
        assert_ne!(a[12..body], b[12..body]);
        assert!(!a[body..]
            .chunks(16)
            .zip(b[body..].chunks(16))
            .any(|(x, y)| x == y));
        assert_eq!(opened(&key, ID, &b).unwrap(), plain);
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

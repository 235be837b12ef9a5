//! Files as they travel through the object store: zstd-compressed on the way up, and on the
//! way down decompressed with a bound (a hostile or damaged object cannot fill the disk) and
//! written sparse (the zeros of a disk image become holes again, not allocated blocks).
//! Blocking: call from `spawn_blocking`.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// zstd level: fast; what we pack is mostly zero pages, code and file-system blocks.
pub(crate) const ZSTD_LEVEL: i32 = 3;
/// A run of zeros at least this long, aligned to it, becomes a hole.
const SPARSE_BLOCK: usize = 64 * 1024;

/// Why unpacking failed: the object's fault, or ours.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnpackError {
    /// Not a zstd stream, truncated, or larger than allowed.
    #[error("{0}")]
    Malformed(String),
    /// Reading or writing local files failed.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: io::Error,
    },
}

fn io_at(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> UnpackError {
    let path = path.display().to_string();
    move |source| UnpackError::Io { what, path, source }
}

/// Compresses `src` into a new file `dst`; returns the bytes read.
pub(crate) fn compress_file(src: &Path, dst: &Path) -> io::Result<u64> {
    let mut input = BufReader::with_capacity(1 << 20, File::open(src)?);
    let mut out = io::BufWriter::new(File::create(dst)?);
    let n = compress(&mut input, &mut out)?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(n)
}

/// Compresses what `input` yields into `out`; returns the bytes read.
pub(crate) fn compress(input: &mut dyn Read, out: &mut dyn Write) -> io::Result<u64> {
    let mut enc = zstd::Encoder::new(out, ZSTD_LEVEL)?;
    let n = io::copy(input, &mut enc)?;
    enc.finish()?.flush()?;
    Ok(n)
}

/// Decompresses `src` into a new file `dst`, at most `max` bytes, zero blocks left as holes;
/// with `exact`, the result must be exactly `max` bytes. Returns its length.
pub(crate) fn decompress_sparse(
    src: &Path,
    dst: &Path,
    max: u64,
    exact: bool,
) -> Result<u64, UnpackError> {
    let mut input = File::open(src).map_err(io_at("open", src))?;
    decompress_sparse_from(&mut input, dst, max, exact)
}

/// [`decompress_sparse`] of what `input` yields.
pub(crate) fn decompress_sparse_from(
    input: &mut dyn Read,
    dst: &Path,
    max: u64,
    exact: bool,
) -> Result<u64, UnpackError> {
    let mut dec = zstd::Decoder::new(input)
        .map_err(|e| UnpackError::Malformed(format!("not a zstd stream: {e}")))?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(io_at("create", dst))?;
    let mut block = vec![0u8; SPARSE_BLOCK];
    let mut len: u64 = 0;
    loop {
        let n = next_block(&mut dec, &mut block, len, max)?;
        if n == 0 {
            break;
        }
        if block[..n].iter().all(|&b| b == 0) {
            out.seek(SeekFrom::Current(n as i64))
                .map_err(io_at("seek in", dst))?;
        } else {
            out.write_all(&block[..n]).map_err(io_at("write", dst))?;
        }
        len += n as u64;
    }
    if exact && len != max {
        return Err(UnpackError::Malformed(format!(
            "it unpacks to {len} bytes, not the {max} recorded"
        )));
    }
    // A trailing hole is not written: the length makes it.
    out.set_len(len).map_err(io_at("set the size of", dst))?;
    out.sync_all().map_err(io_at("sync", dst))?;
    Ok(len)
}

/// The next block of a decompressing stream that has yielded `len` bytes so far, refused
/// past `max`.
fn next_block(
    dec: &mut impl Read,
    block: &mut [u8],
    len: u64,
    max: u64,
) -> Result<usize, UnpackError> {
    let n = read_full(dec, block)
        .map_err(|e| UnpackError::Malformed(format!("damaged stream: {e}")))?;
    if len + n as u64 > max {
        return Err(UnpackError::Malformed(format!(
            "it unpacks to more than the {max} bytes allowed"
        )));
    }
    Ok(n)
}

/// Fills `buf` unless the stream ends first; returns how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        match r.read(&mut buf[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_file_round_trips_and_stays_sparse() {
        let dir = tempfile::tempdir().unwrap();
        let (src, packed, out) = (
            dir.path().join("src"),
            dir.path().join("src.zst"),
            dir.path().join("out"),
        );
        let mut f = File::create(&src).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start(8 << 20)).unwrap();
        f.write_all(b"tail").unwrap();
        f.set_len(16 << 20).unwrap();
        drop(f);
        assert_eq!(compress_file(&src, &packed).unwrap(), 16 << 20);
        assert!(std::fs::metadata(&packed).unwrap().len() < 64 * 1024);
        assert_eq!(
            decompress_sparse(&packed, &out, 16 << 20, true).unwrap(),
            16 << 20
        );
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&out).unwrap());
        // Two 64 KiB blocks of data, the rest holes.
        assert!(std::fs::metadata(&out).unwrap().blocks() * 512 <= 256 * 1024);
    }

    #[test]
    fn too_large_truncated_and_garbage_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (src, packed) = (dir.path().join("src"), dir.path().join("src.zst"));
        std::fs::write(&src, vec![7u8; 1 << 20]).unwrap();
        compress_file(&src, &packed).unwrap();
        let out = |n: &str| dir.path().join(n);
        assert!(matches!(
            decompress_sparse(&packed, &out("a"), (1 << 20) - 1, false),
            Err(UnpackError::Malformed(_))
        ));
        assert!(matches!(
            decompress_sparse(&packed, &out("b"), 2 << 20, true),
            Err(UnpackError::Malformed(_))
        ));
        let bytes = std::fs::read(&packed).unwrap();
        std::fs::write(&packed, &bytes[..bytes.len() / 2]).unwrap();
        assert!(matches!(
            decompress_sparse(&packed, &out("c"), 2 << 20, false),
            Err(UnpackError::Malformed(_))
        ));
        std::fs::write(&packed, b"not zstd at all").unwrap();
        assert!(matches!(
            decompress_sparse(&packed, &out("d"), 2 << 20, false),
            Err(UnpackError::Malformed(_))
        ));
        assert!(
            decompress_sparse(&packed, &out("a"), 1, false).is_err(),
            "an existing file is never overwritten"
        );
    }
}

//! The guest serial console: a task copies QEMU's console socket into console.log, rotating
//! to console.log.1 at a size bound so a guest spamming its console cannot fill the disk.

use std::ffi::OsString;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use tokio::fs::{File, OpenOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// console.log is rotated once it reaches this size; at most twice this is kept on disk.
pub const CONSOLE_LOG_MAX_BYTES: u64 = 1024 * 1024;

/// Read size of the copier; the console is slow (emulated 16550), so this is plenty.
const COPY_CHUNK: usize = 8 * 1024;

/// `path` with `.1` appended: where the previous generation of a rotated log lives.
pub(crate) fn rotated_path(path: &Path) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(".1");
    PathBuf::from(s)
}

/// An append-only log file that keeps at most `max` bytes before moving itself to `<path>.1`.
pub(crate) struct RotatingLog {
    path: PathBuf,
    max: u64,
    file: File,
    len: u64,
}

impl RotatingLog {
    /// Opens (appending to) `path`, creating it if needed.
    pub(crate) async fn open(path: &Path, max: u64) -> io::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await?;
        let len = file.metadata().await?.len();
        Ok(RotatingLog {
            path: path.to_path_buf(),
            max: max.max(1),
            file,
            len,
        })
    }

    /// Appends `data`, rotating whenever the current file is full.
    pub(crate) async fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            if self.len >= self.max {
                self.rotate().await?;
            }
            let room = usize::try_from(self.max - self.len).unwrap_or(usize::MAX);
            let (now, rest) = data.split_at(room.min(data.len()));
            self.file.write_all(now).await?;
            self.len += now.len() as u64;
            data = rest;
        }
        // tokio's File writes in the background; flush so readers see the bytes promptly.
        self.file.flush().await
    }

    async fn rotate(&mut self) -> io::Result<()> {
        self.file.flush().await?;
        tokio::fs::rename(&self.path, rotated_path(&self.path)).await?;
        self.file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)
            .await?;
        self.len = 0;
        Ok(())
    }
}

/// Copies the console socket into the log until QEMU closes it (VM exit). `_drained` is
/// dropped when the copier ends, which is how the exit monitor knows the log is complete.
pub(crate) async fn copy_console(
    vm: String,
    mut stream: UnixStream,
    mut log: RotatingLog,
    _drained: tokio::sync::oneshot::Sender<()>,
) {
    let mut buf = vec![0u8; COPY_CHUNK];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => {
                tracing::debug!(vm = %vm, "console closed");
                return;
            }
            Ok(n) => {
                if let Err(e) = log.write(&buf[..n]).await {
                    // Keep draining so the guest's serial port never backs up; output is lost.
                    tracing::warn!(vm = %vm, error = %e, "cannot write console log");
                }
            }
            Err(e) => {
                tracing::warn!(vm = %vm, error = %e, "console socket read failed");
                return;
            }
        }
    }
}

/// Last `max_bytes` of the console log (older output taken from `<path>.1` when the current
/// file is shorter), as lossy UTF-8. Fails only if neither file exists or on I/O errors.
pub fn console_tail(path: &Path, max_bytes: usize) -> io::Result<String> {
    let current = tail_of(path, max_bytes);
    let current = match current {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let have = current.as_ref().map_or(0, Vec::len);
    let mut out = Vec::new();
    if have < max_bytes {
        match tail_of(&rotated_path(path), max_bytes - have) {
            Ok(older) => out = older,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if current.is_none() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    out.extend(current.unwrap_or_default());
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The last `max` bytes of one file.
pub(crate) fn tail_of(path: &Path, max: usize) -> io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let max = max as u64;
    f.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rotates_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let mut log = RotatingLog::open(&path, 10).await.unwrap();
        log.write(b"0123456").await.unwrap();
        log.write(b"789abcdef").await.unwrap();
        assert_eq!(std::fs::read(rotated_path(&path)).unwrap(), b"0123456789");
        assert_eq!(std::fs::read(&path).unwrap(), b"abcdef");
        // 25 more bytes: two further rotations; only the newest two generations remain.
        log.write(b"ghijklmnopqrstuvwxyzABCDE").await.unwrap();
        assert_eq!(std::fs::read(rotated_path(&path)).unwrap(), b"uvwxyzABCD");
        assert_eq!(std::fs::read(&path).unwrap(), b"E");
        drop(log);

        // Reopening appends and keeps counting from the existing size.
        let mut log = RotatingLog::open(&path, 10).await.unwrap();
        log.write(b"FGHIJKLMNOP").await.unwrap();
        assert_eq!(std::fs::read(rotated_path(&path)).unwrap(), b"EFGHIJKLMN");
        assert_eq!(std::fs::read(&path).unwrap(), b"OP");
    }

    #[test]
    fn tail_spans_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        assert_eq!(
            console_tail(&path, 10).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        std::fs::write(&path, b"hello").unwrap();
        assert_eq!(console_tail(&path, 3).unwrap(), "llo");
        assert_eq!(console_tail(&path, 100).unwrap(), "hello");
        std::fs::write(rotated_path(&path), b"older ").unwrap();
        assert_eq!(console_tail(&path, 8).unwrap(), "er hello");
        assert_eq!(console_tail(&path, 100).unwrap(), "older hello");
        std::fs::write(&path, [0xff, b'x']).unwrap();
        assert_eq!(console_tail(&path, 2).unwrap(), "\u{fffd}x");
    }
}

//! The file routes: read, write, remove, stat, list, mkdir, rename, watch. Each operation
//! runs on a blocking thread acting as the user (see `fsuser`); a watch on a thread of its own
//! (see `files::watch`).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::Deserialize;
use space_core::files::watch::WatchRequest;
use space_core::files::{FileList, FileStat, MkdirRequest, RenameRequest, MAX_LIST_DEPTH};
use space_core::ErrorCode;
use space_guest_proto::limits::MAX_WATCH_STREAMS;
use space_guest_proto::routes::{FILE_SIZE_HEADER, NDJSON};
use tokio::sync::mpsc;

use super::{ApiJson, ApiQuery, St};
use crate::error::ApiError;
use crate::files::ops::{self, AtomicWriter};
use crate::files::watch::{self, WatchSpec};
use crate::fsuser::FsUserGuard;
use crate::users::UserInfo;

/// Chunk size of streamed reads.
const READ_CHUNK: usize = 64 * 1024;
/// Chunks in flight between the body and the file thread (bounds memory per transfer).
const CHANNEL_CHUNKS: usize = 4;
/// Mode of written files when none is given.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of created directories when none is given.
const DEFAULT_DIR_MODE: u32 = 0o755;
/// Watch events per chunk of a watch stream.
const WATCH_EVENTS_PER_CHUNK: usize = 32;

#[derive(Debug, Deserialize)]
pub(super) struct FileQuery {
    path: String,
    user: Option<String>,
    mode: Option<String>,
    #[serde(default)]
    recursive: bool,
    depth: Option<u32>,
    /// A written file's metadata: a JSON object of strings.
    metadata: Option<String>,
}

/// Runs `f` on a blocking thread acting as `user`.
async fn as_user<T: Send + 'static>(
    user: UserInfo,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || {
        let _guard = FsUserGuard::act_as(&user)
            .map_err(|e| ApiError::internal(format!("act as {}: {e}", user.name)))?;
        f()
    })
    .await?
}

fn target(st: &St, path: &str, user: Option<&str>) -> Result<(UserInfo, PathBuf), ApiError> {
    let user = st.user(user)?;
    let path = st.path_for(&user, path)?;
    Ok((user, path))
}

fn parse_mode(mode: Option<&str>) -> Result<Option<u32>, ApiError> {
    match mode {
        None => Ok(None),
        Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "mode must be octal permission bits (e.g. 644), got '{}'",
                    m.escape_debug()
                ))
            }),
    }
}

pub(super) async fn read(st: St, ApiQuery(q): ApiQuery<FileQuery>) -> Result<Response, ApiError> {
    let (user, path) = target(&st, &q.path, q.user.as_deref())?;
    let p = path.clone();
    let (mut file, size) = as_user(user, move || ops::open_read(&p)).await?;
    let (tx, mut rx) = mpsc::channel::<std::io::Result<Bytes>>(CHANNEL_CHUNKS);
    // The file is open (permission checked); reading it needs no identity.
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            let msg = match ops::read_chunk(&mut file, &mut buf) {
                Ok(0) => return,
                Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                Err(e) => Err(e),
            };
            let failed = msg.is_err();
            // A closed channel means the reader went away: stop.
            if tx.blocking_send(msg).is_err() || failed {
                return;
            }
        }
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::HeaderName::from_static(FILE_SIZE_HEADER),
                size.to_string(),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

enum WriteMsg {
    Data(Bytes),
    End,
}

pub(super) async fn write(
    st: St,
    ApiQuery(q): ApiQuery<FileQuery>,
    body: Body,
) -> Result<Json<FileStat>, ApiError> {
    let (user, path) = target(&st, &q.path, q.user.as_deref())?;
    let mode = parse_mode(q.mode.as_deref())?;
    let metadata: std::collections::BTreeMap<String, String> = match q.metadata.as_deref() {
        None => Default::default(),
        Some(json) => serde_json::from_str(json).map_err(|e| {
            ApiError::invalid(format!("metadata must be a JSON object of strings: {e}"))
        })?,
    };
    space_core::files::validate_file_metadata(&metadata)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let (tx, mut rx) = mpsc::channel::<WriteMsg>(CHANNEL_CHUNKS);
    // One blocking thread owns the temporary file for the whole upload; dropped without
    // `End` (the body failed) the writer removes it.
    let writer = as_user(user, move || {
        // As an in-place write would: through a symlink at the path, and a file that is
        // there keeps its mode (unless one is asked for) and, where the user may, its owner.
        let (at, existing) = ops::write_target(&path)?;
        let existing = existing.filter(|md| md.is_file());
        let mode = mode
            .or_else(|| existing.as_ref().map(|md| md.mode() & 0o7777))
            .unwrap_or(DEFAULT_FILE_MODE);
        let mut w = AtomicWriter::create(&at, mode)?;
        if let Some(md) = &existing {
            w.keep_owner(md, mode)?;
        }
        w.set_metadata(&metadata)?;
        loop {
            match rx.blocking_recv() {
                Some(WriteMsg::Data(d)) => w.write(&d)?,
                // The file written, named as the caller named it.
                Some(WriteMsg::End) => return w.commit().map(|stat| ops::named_as(stat, &path)),
                None => {
                    return Err(ApiError::invalid(
                        "request body ended early; file not written",
                    ))
                }
            }
        }
    });
    let (written, fed) = tokio::join!(writer, feed(body, tx));
    let stat = written?;
    fed?;
    Ok(Json(stat))
}

/// Sends a request body's chunks to the blocking thread that consumes them, then `End`.
async fn feed(mut body: Body, tx: mpsc::Sender<WriteMsg>) -> Result<(), ApiError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid(format!("reading request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            // A send error means the consumer failed; its error is the one to report.
            if tx.send(WriteMsg::Data(data)).await.is_err() {
                return Ok(());
            }
        }
    }
    let _ = tx.send(WriteMsg::End).await;
    Ok(())
}

/// `PUT /v1/files/archive`: the body, a tar archive, unpacked under `path` as the user.
pub(super) async fn unpack_archive(
    st: St,
    ApiQuery(q): ApiQuery<FileQuery>,
    body: Body,
) -> Result<Json<space_core::files::UnpackedArchive>, ApiError> {
    let (user, path) = target(&st, &q.path, q.user.as_deref())?;
    let (tx, rx) = mpsc::channel::<WriteMsg>(CHANNEL_CHUNKS);
    let unpacker = as_user(user, move || {
        crate::files::archive::unpack(ChannelReader::new(rx), &path)
    });
    let (unpacked, fed) = tokio::join!(unpacker, feed(body, tx));
    let unpacked = unpacked?;
    fed?;
    Ok(Json(unpacked))
}

/// A blocking reader over the chunks a request body's feeder sends; a body that ends
/// without `End` (it failed) is an error, not the end of the archive.
struct ChannelReader {
    rx: mpsc::Receiver<WriteMsg>,
    chunk: Bytes,
    ended: bool,
}

impl ChannelReader {
    fn new(rx: mpsc::Receiver<WriteMsg>) -> Self {
        ChannelReader {
            rx,
            chunk: Bytes::new(),
            ended: false,
        }
    }
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(WriteMsg::Data(d)) => self.chunk = d,
                Some(WriteMsg::End) => self.ended = true,
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "request body ended early",
                    ))
                }
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

pub(super) async fn remove(
    st: St,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> Result<StatusCode, ApiError> {
    let (user, path) = target(&st, &q.path, q.user.as_deref())?;
    let recursive = q.recursive;
    as_user(user, move || ops::remove(&path, recursive)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn stat(
    st: St,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> Result<Json<FileStat>, ApiError> {
    let (user, path) = target(&st, &q.path, q.user.as_deref())?;
    as_user(user, move || ops::stat(&path)).await.map(Json)
}

pub(super) async fn list(
    st: St,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> Result<Json<FileList>, ApiError> {
    let (user, path) = target(&st, &q.path, q.user.as_deref())?;
    let depth = q.depth.unwrap_or(1).clamp(1, MAX_LIST_DEPTH);
    as_user(user, move || ops::list(&path, depth))
        .await
        .map(Json)
}

pub(super) async fn mkdir(
    st: St,
    ApiJson(req): ApiJson<MkdirRequest>,
) -> Result<Json<FileStat>, ApiError> {
    let (user, path) = target(&st, &req.path, req.user.as_deref())?;
    let mode = req.mode.unwrap_or(DEFAULT_DIR_MODE);
    if mode > 0o7777 {
        return Err(ApiError::invalid("mode must be at most 0o7777"));
    }
    as_user(user, move || ops::mkdir_p(&path, mode))
        .await
        .map(Json)
}

pub(super) async fn rename(
    st: St,
    ApiJson(req): ApiJson<RenameRequest>,
) -> Result<StatusCode, ApiError> {
    let user = st.user(req.user.as_deref())?;
    let from = st.path_for(&user, &req.from)?;
    let to = st.path_for(&user, &req.to)?;
    if to.starts_with(&from) && to != from {
        return Err(ApiError::new(
            ErrorCode::InvalidPath,
            "cannot move a directory into itself",
        ));
    }
    as_user(user, move || ops::rename(&from, &to)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn watch(
    st: St,
    ApiQuery(req): ApiQuery<WatchRequest>,
) -> Result<Response, ApiError> {
    let (user, root) = target(&st, &req.path, req.user.as_deref())?;
    let permit = st.watches.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            ErrorCode::TooManyRequests,
            format!("at most {MAX_WATCH_STREAMS} watches may run at once"),
        )
    })?;
    let spec = WatchSpec {
        root,
        recursive: req.recursive,
        user,
    };
    let watch = watch::start(spec, permit).await?;
    // The watch travels with the body: when the reader goes away the body is dropped, and
    // with it the watch, which stops its thread.
    let body = futures::stream::unfold(watch, |mut w| async move {
        let first = w.recv().await?;
        let mut chunk = Vec::new();
        let mut next = Some(first);
        let mut n = 0;
        while let Some(ev) = next.take() {
            if serde_json::to_writer(&mut chunk, &ev).is_ok() {
                chunk.push(b'\n');
            }
            n += 1;
            if n < WATCH_EVENTS_PER_CHUNK {
                next = w.try_recv();
            }
        }
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(chunk)), w))
    });
    Ok(([(header::CONTENT_TYPE, NDJSON)], Body::from_stream(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_octal_modes() {
        assert_eq!(parse_mode(None).unwrap(), None);
        assert_eq!(parse_mode(Some("755")).unwrap(), Some(0o755));
        assert_eq!(parse_mode(Some("0600")).unwrap(), Some(0o600));
        assert!(parse_mode(Some("9")).is_err());
        assert!(parse_mode(Some("77777")).is_err());
    }
}

//! File calls: read and write file contents (streamed), stat, list, mkdir, remove, rename,
//! and directory watches (streamed).
//!
//! Paths are checked with `space_core::files::validate_path` before anything is sent; a
//! refused path is [`GuestError::Local`] with code `invalid_path`. User names are checked
//! with the `space-core` rule (code `invalid_request`).

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::stream::BoxStream;
use http::Method;
use space_core::files::watch::{WatchEvent, WatchRequest};
use space_core::files::{
    validate_file_metadata, validate_path, FileList, FileStat, MkdirRequest, RenameRequest,
    MAX_LIST_DEPTH, MAX_LIST_ENTRIES,
};
use space_core::process::validate_user_name;
use space_core::ErrorCode;
use space_guest_proto::limits::MAX_JSON_BODY;
use space_guest_proto::routes;

use crate::error::GuestError;
use crate::options::MAX_LISTING_BODY;
use crate::query::Target;
use crate::transport::Body;
use crate::GuestClient;

/// Largest permission bits accepted (`0o7777`: rwx for all plus setuid, setgid, sticky).
const MAX_MODE: u32 = 0o7777;

fn check_path(path: &str) -> Result<(), GuestError> {
    validate_path(path).map_err(|e| GuestError::local(ErrorCode::InvalidPath, e.to_string()))
}

fn check_user(user: Option<&str>) -> Result<(), GuestError> {
    match user {
        Some(u) => validate_user_name(u)
            .map_err(|_| GuestError::local(ErrorCode::InvalidRequest, "bad user name")),
        None => Ok(()),
    }
}

fn check_mode(mode: Option<u32>) -> Result<(), GuestError> {
    match mode {
        Some(m) if m > MAX_MODE => Err(GuestError::local(
            ErrorCode::InvalidRequest,
            "mode must be at most 0o7777",
        )),
        _ => Ok(()),
    }
}

/// `route?path=P&user=U` after checking both.
fn file_target(route: &str, path: &str, user: Option<&str>) -> Result<Target, GuestError> {
    check_path(path)?;
    check_user(user)?;
    Ok(Target::new(route)
        .param("path", path)
        .opt_param("user", user))
}

impl GuestClient {
    /// `GET /v1/files`: streams a file's bytes; also returns the size the guest announced
    /// in `x-space-file-size`, if it did (advisory: a file growing while it is read
    /// streams more). Only the wait for the stream to open is timed.
    pub async fn read_file(
        &self,
        path: &str,
        user: Option<&str>,
    ) -> Result<(Option<u64>, BoxStream<'static, Result<Bytes, GuestError>>), GuestError> {
        let target = file_target(routes::FILES, path, user)?;
        let resp = self.transport().open_stream(Method::GET, target).await?;
        let size = match resp.headers().get(routes::FILE_SIZE_HEADER) {
            None => None,
            Some(v) => {
                let parsed = v.to_str().ok().and_then(|s| s.parse::<u64>().ok());
                Some(parsed.ok_or_else(|| {
                    GuestError::protocol(format!("bad {} header", routes::FILE_SIZE_HEADER))
                })?)
            }
        };
        Ok((
            size,
            crate::stream::bytes(resp.into_body(), self.transport().closed_rx()),
        ))
    }

    /// `PUT /v1/files`: streams `body` into a file (atomic replace, parents created), with
    /// permission bits `mode` (default decided by the guest) and `metadata` (none if empty).
    /// A failing `body` aborts the upload ([`GuestError::Local`]) and the guest keeps the
    /// old file.
    pub async fn write_file(
        &self,
        path: &str,
        user: Option<&str>,
        mode: Option<u32>,
        metadata: &BTreeMap<String, String>,
        body: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<FileStat, GuestError> {
        check_mode(mode)?;
        validate_file_metadata(metadata)
            .map_err(|e| GuestError::local(ErrorCode::InvalidRequest, e.to_string()))?;
        let mode = mode.map(|m| format!("{m:o}"));
        let metadata = (!metadata.is_empty())
            .then(|| serde_json::to_string(metadata))
            .transpose()
            .map_err(|e| GuestError::local(ErrorCode::InvalidRequest, e.to_string()))?;
        let target = file_target(routes::FILES, path, user)?
            .opt_param("mode", mode.as_deref())
            .opt_param("metadata", metadata.as_deref());
        self.transport()
            .upload_json(Method::PUT, target, body)
            .await
    }

    /// `PUT /v1/files/archive`: unpacks the tar archive `body` under directory `path` (made
    /// if missing), its entries owned by `user` (default root).
    pub async fn unpack_archive(
        &self,
        path: &str,
        user: Option<&str>,
        body: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<space_core::files::UnpackedArchive, GuestError> {
        let target = file_target(routes::FILES_ARCHIVE, path, user)?;
        self.transport()
            .upload_json(Method::PUT, target, body)
            .await
    }

    /// `GET /v1/files/stat`: metadata of `path` (not following a final symlink).
    pub async fn stat(&self, path: &str, user: Option<&str>) -> Result<FileStat, GuestError> {
        let target = file_target(routes::FILES_STAT, path, user)?;
        self.transport()
            .json(Method::GET, target, Body::Empty, MAX_JSON_BODY)
            .await
    }

    /// `GET /v1/files/list`: entries under `path`, `depth` levels deep (1 = direct children,
    /// at most `MAX_LIST_DEPTH`).
    pub async fn list(
        &self,
        path: &str,
        depth: u32,
        user: Option<&str>,
    ) -> Result<FileList, GuestError> {
        if depth > MAX_LIST_DEPTH {
            return Err(GuestError::local(
                ErrorCode::InvalidRequest,
                format!("depth must be at most {MAX_LIST_DEPTH}"),
            ));
        }
        let target =
            file_target(routes::FILES_LIST, path, user)?.param("depth", &depth.to_string());
        let list: FileList = self
            .transport()
            .json(Method::GET, target, Body::Empty, MAX_LISTING_BODY)
            .await?;
        if list.entries.len() > MAX_LIST_ENTRIES {
            return Err(GuestError::protocol(format!(
                "listing has more than {MAX_LIST_ENTRIES} entries"
            )));
        }
        Ok(list)
    }

    /// `POST /v1/files/mkdir`: `mkdir -p`.
    pub async fn mkdir(&self, req: &MkdirRequest) -> Result<FileStat, GuestError> {
        check_path(&req.path)?;
        check_user(req.user.as_deref())?;
        check_mode(req.mode)?;
        self.transport()
            .json(
                Method::POST,
                Target::new(routes::FILES_MKDIR),
                Body::json(req)?,
                MAX_JSON_BODY,
            )
            .await
    }

    /// `DELETE /v1/files`: removes a file, or a directory (`recursive` for a non-empty one).
    pub async fn remove(
        &self,
        path: &str,
        recursive: bool,
        user: Option<&str>,
    ) -> Result<(), GuestError> {
        let target = file_target(routes::FILES, path, user)?
            .param("recursive", if recursive { "true" } else { "false" });
        self.transport()
            .unit(Method::DELETE, target, Body::Empty)
            .await
    }

    /// `POST /v1/files/rename`.
    pub async fn rename(&self, req: &RenameRequest) -> Result<(), GuestError> {
        check_path(&req.from)?;
        check_path(&req.to)?;
        check_user(req.user.as_deref())?;
        self.transport()
            .unit(
                Method::POST,
                Target::new(routes::FILES_RENAME),
                Body::json(req)?,
            )
            .await
    }

    /// `GET /v1/files/watch`: watches a directory (with `recursive`, its whole tree, new
    /// subdirectories included). The guest answers an error (missing, not a directory, not
    /// permitted, too big a tree, too many watches) before the stream; the stream's first
    /// event is `started`, sent once every watch is in place, and it ends after the guest
    /// reports the watched directory's removal. Each NDJSON line is at most
    /// `MAX_WATCH_LINE` bytes; an oversize or unparsable line ends the stream with
    /// [`GuestError::Protocol`]. Only the wait for the stream to open is timed; dropping the
    /// stream stops the watch.
    pub async fn watch(
        &self,
        req: &WatchRequest,
    ) -> Result<BoxStream<'static, Result<WatchEvent, GuestError>>, GuestError> {
        let target = file_target(routes::FILES_WATCH, &req.path, req.user.as_deref())?
            .param("recursive", if req.recursive { "true" } else { "false" });
        let resp = self.transport().open_stream(Method::GET, target).await?;
        Ok(crate::stream::watch_events(
            resp.into_body(),
            self.transport().closed_rx(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_checks() {
        assert_eq!(
            check_path("../x").unwrap_err().code(),
            ErrorCode::InvalidPath
        );
        assert_eq!(check_path("").unwrap_err().code(), ErrorCode::InvalidPath);
        assert!(check_path("/tmp/a b&c#d").is_ok());
        assert_eq!(
            check_user(Some("Root")).unwrap_err().code(),
            ErrorCode::InvalidRequest
        );
        assert!(check_user(None).is_ok());
        assert!(check_mode(Some(0o10000)).is_err());
        assert!(check_mode(Some(0o644)).is_ok());
        let t = file_target(routes::FILES, "/a b", Some("user")).unwrap();
        assert_eq!(t.as_str(), "/v1/files?path=%2Fa%20b&user=user");
    }
}

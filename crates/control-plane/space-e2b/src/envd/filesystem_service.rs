//! envd's `filesystem.Filesystem` service onto SPACE's file operations
//! (`docs/e2b-compat.md`, 3.1): `Stat`, `MakeDir` (`already_exists` for an existing
//! directory, which the SDKs turn into `false`), `Move`, `ListDir`, `Remove` (recursive),
//! and directory watches, streamed (`WatchDir`) or polled (`CreateWatcher`,
//! `GetWatcherEvents`, `RemoveWatcher`; see [`super::watchers`]).
//!
//! A watch is refused for network mounts (`allow_network_mounts` is accepted and ignored:
//! a sandbox has none).
//!
//! envd accepts `..` in paths; SPACE refuses it. [`normalize`] resolves `.` and `..`
//! lexically first, so `/home/user/a/../b` works as on E2B (the guest still checks every
//! access as the acting user).

use axum::extract::Request;
use axum::response::Response;
use futures::stream::BoxStream;
use futures::StreamExt;
use space_control::api::error::ApiError;
use space_core::files::watch::{WatchEvent, WatchRequest};
use space_core::files::{FileKind, FileStat, MkdirRequest, RenameRequest, MAX_LIST_DEPTH};
use space_core::ErrorCode;
use space_guest_client::{GuestClient, GuestError};

use super::access::EnvdCaller;
use super::errors::connect_error;
use super::filesystem::{
    CreateWatcherResponse, EntryInfo, EntryResponse, GetWatcherEventsResponse, ListDirRequest,
    ListDirResponse, MoveRequest, PathRequest, WatchDirRequest, WatchDirResponse, WatcherRequest,
};
use super::process_service::Empty;
use super::watchers::{as_envd_writes, filesystem_event};
use super::{server_stream, unary, StreamCall};
use crate::connect::server::{keepalive, stream_response, with_keepalive_and_deadline};
use crate::connect::{Code, ConnectError};
use crate::state::E2bState;
use space_core::error::excerpt;

/// `path` with `.` and `..` resolved lexically; a relative path that climbs above its
/// start (the user's home, which only the guest knows) is refused.
pub fn normalize(path: &str) -> Result<String, ConnectError> {
    if path.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "path is empty"));
    }
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() && !absolute {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "a relative path may not climb above the home directory",
                    ));
                }
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    Ok(match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
    })
}

/// envd's entry for a SPACE stat (owner and group by name, by number when the guest's
/// accounts have none).
pub fn entry(stat: &FileStat) -> EntryInfo {
    EntryInfo::of(
        stat,
        stat.owner.clone().unwrap_or_else(|| stat.uid.to_string()),
        stat.group.clone().unwrap_or_else(|| stat.gid.to_string()),
    )
}

fn guest_error(e: GuestError) -> ConnectError {
    connect_error(ApiError::from(e))
}

/// `filesystem.Filesystem/Stat`.
pub async fn stat(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(st, caller, req, |guest, user, m: PathRequest| async move {
        let path = normalize(&m.path)?;
        let stat = guest
            .stat(&path, user.as_deref())
            .await
            .map_err(guest_error)?;
        Ok(EntryResponse {
            entry: entry(&stat),
        })
    })
    .await
}

/// `filesystem.Filesystem/MakeDir`: creates the directory and its parents;
/// `already_exists` if a directory is there already (the SDKs then answer `false`), and
/// `invalid_argument` if something else is, as envd does (the SDKs raise).
pub async fn make_dir(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(st, caller, req, |guest, user, m: PathRequest| async move {
        let path = normalize(&m.path)?;
        match guest.stat(&path, user.as_deref()).await {
            // As envd's `os.Stat`, a link counts as what it resolves to.
            Ok(there) if is_dir_or_link_to_one(&there) => {
                return Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("{} already exists", excerpt(&path, 256)),
                ))
            }
            Ok(_) => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!(
                        "{} already exists but it is not a directory",
                        excerpt(&path, 256)
                    ),
                ))
            }
            Err(e) if e.code() == ErrorCode::NotFound => {}
            Err(e) => return Err(guest_error(e)),
        }
        let stat = guest
            .mkdir(&MkdirRequest {
                path,
                mode: None,
                user,
            })
            .await
            .map_err(guest_error)?;
        Ok(EntryResponse {
            entry: entry(&stat),
        })
    })
    .await
}

/// `filesystem.Filesystem/Move`: the entry at its new path.
pub async fn move_entry(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(st, caller, req, |guest, user, m: MoveRequest| async move {
        let from = normalize(&m.source)?;
        let to = normalize(&m.destination)?;
        guest
            .rename(&RenameRequest {
                from,
                to: to.clone(),
                user: user.clone(),
            })
            .await
            .map_err(guest_error)?;
        let stat = guest
            .stat(&to, user.as_deref())
            .await
            .map_err(guest_error)?;
        Ok(EntryResponse {
            entry: entry(&stat),
        })
    })
    .await
}

/// `filesystem.Filesystem/ListDir`: entries `depth` levels deep (at least 1).
pub async fn list_dir(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(
        st,
        caller,
        req,
        |guest, user, m: ListDirRequest| async move {
            let path = normalize(&m.path)?;
            let depth = m.effective_depth();
            if depth > MAX_LIST_DEPTH {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("depth must be at most {MAX_LIST_DEPTH}"),
                ));
            }
            let list = match guest.list(&path, depth, user.as_deref()).await {
                Ok(list) => list,
                Err(refused) => {
                    // As envd, a root that is a link to a directory is listed through the
                    // link, its entries named under the path asked for.
                    let Ok(root) = guest.stat(&path, user.as_deref()).await else {
                        return Err(guest_error(refused));
                    };
                    let Some(target) = root.resolved.filter(|to| to.kind == FileKind::Dir) else {
                        return Err(guest_error(refused));
                    };
                    let mut list = guest
                        .list(&target.path, depth, user.as_deref())
                        .await
                        .map_err(guest_error)?;
                    for e in &mut list.entries {
                        e.path = rebase(&e.path, &target.path, &path);
                    }
                    list
                }
            };
            Ok(ListDirResponse {
                entries: list.entries.iter().map(entry).collect(),
            })
        },
    )
    .await
}

/// Whether `stat` is a directory, or a symlink that resolves to one.
fn is_dir_or_link_to_one(stat: &FileStat) -> bool {
    stat.kind == FileKind::Dir
        || stat
            .resolved
            .as_ref()
            .is_some_and(|to| to.kind == FileKind::Dir)
}

/// `path` under `from` as the same path under `to` (`path` itself if it is not under `from`).
fn rebase(path: &str, from: &str, to: &str) -> String {
    match path.strip_prefix(from.trim_end_matches('/')) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            format!("{}{rest}", to.trim_end_matches('/'))
        }
        _ => path.to_owned(),
    }
}

/// `filesystem.Filesystem/Remove`: a file, or a directory with its contents. A path that
/// is not there is removed already: success, as envd's `os.RemoveAll` answers.
pub async fn remove(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(st, caller, req, |guest, user, m: PathRequest| async move {
        let path = normalize(&m.path)?;
        match guest.remove(&path, true, user.as_deref()).await {
            Err(e) if e.code() == ErrorCode::NotFound => {}
            other => other.map_err(guest_error)?,
        }
        Ok(Empty {})
    })
    .await
}

/// Opens SPACE's watch for a `WatchDir`/`CreateWatcher` request and waits for it to be in
/// place (its `started`), so the caller's first change is never missed.
async fn open_watch(
    guest: &GuestClient,
    user: Option<String>,
    m: &WatchDirRequest,
) -> Result<BoxStream<'static, Result<WatchEvent, GuestError>>, ConnectError> {
    let req = WatchRequest {
        path: normalize(&m.path)?,
        recursive: m.recursive,
        user,
    };
    let mut events = guest.watch(&req).await.map_err(guest_error)?;
    match events.next().await {
        Some(Ok(WatchEvent::Started { .. })) => Ok(events),
        Some(Err(e)) => Err(guest_error(e)),
        _ => Err(ConnectError::new(Code::Internal, "the watch did not start")),
    }
}

fn keepalive_message() -> WatchDirResponse {
    WatchDirResponse::Keepalive {}
}

/// `filesystem.Filesystem/WatchDir` (server stream): `start`, then the changes.
pub async fn watch_dir(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    server_stream(
        st,
        caller,
        req,
        |c: StreamCall<WatchDirRequest>| async move {
            let guest = c.guest().await?;
            let events = open_watch(&guest, c.caller.user.clone(), &c.message).await?;
            let include = c.message.include_entry;
            let changes = as_envd_writes(events).filter_map(move |ev| async move {
                match ev {
                    Ok(ev) => filesystem_event(ev, include)
                        .map(|e| Ok(WatchDirResponse::Filesystem(Box::new(e)))),
                    Err(e) => Some(Err(ConnectError::new(
                        Code::Unavailable,
                        format!("the watch broke off: {}", ApiError::from(e).body.message),
                    ))),
                }
            });
            let stream =
                futures::stream::once(async { Ok(WatchDirResponse::Start {}) }).chain(changes);
            Ok(stream_response(with_keepalive_and_deadline(
                stream,
                keepalive(&c.headers),
                c.deadline,
                keepalive_message,
            )))
        },
    )
    .await
}

/// `filesystem.Filesystem/CreateWatcher`.
pub async fn create_watcher(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    let sandbox = caller.id.clone();
    let watchers = st.watchers.clone();
    unary(
        st,
        caller,
        req,
        |guest, user, m: WatchDirRequest| async move {
            let events = open_watch(&guest, user, &m).await?;
            let watcher_id = watchers.create(&sandbox, events, m.include_entry)?;
            Ok(CreateWatcherResponse { watcher_id })
        },
    )
    .await
}

/// `filesystem.Filesystem/GetWatcherEvents`.
pub async fn get_watcher_events(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    let sandbox = caller.id.clone();
    let watchers = st.watchers.clone();
    unary(
        st,
        caller,
        req,
        |_guest, _user, m: WatcherRequest| async move {
            Ok(GetWatcherEventsResponse {
                events: watchers.take_events(&sandbox, &m.watcher_id)?,
            })
        },
    )
    .await
}

/// `filesystem.Filesystem/RemoveWatcher`.
pub async fn remove_watcher(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    let sandbox = caller.id.clone();
    let watchers = st.watchers.clone();
    unary(
        st,
        caller,
        req,
        |_guest, _user, m: WatcherRequest| async move {
            watchers.remove(&sandbox, &m.watcher_id)?;
            Ok(Empty {})
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_listed_through_a_link_are_named_under_the_link() {
        assert_eq!(
            rebase("/data/real/a.txt", "/data/real", "/home/user/ln"),
            "/home/user/ln/a.txt"
        );
        assert_eq!(rebase("/data/real", "/data/real/", "/l"), "/l");
        assert_eq!(rebase("/data/realx/a", "/data/real", "/l"), "/data/realx/a");
        assert_eq!(rebase("/a/b", "/", "/l"), "/l/a/b");
    }

    #[test]
    fn paths_resolve_dots_lexically() {
        assert_eq!(normalize("/home/user/a/../b").unwrap(), "/home/user/b");
        assert_eq!(normalize("/../../etc").unwrap(), "/etc");
        assert_eq!(normalize("a/./b/").unwrap(), "a/b");
        assert_eq!(normalize("a/..").unwrap(), ".");
        assert_eq!(normalize("/").unwrap(), "/");
        assert!(normalize("../x").is_err());
        assert!(normalize("").is_err());
    }
}

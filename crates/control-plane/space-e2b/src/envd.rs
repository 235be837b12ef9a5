//! envd, the in-sandbox API the SDKs call, served by SPACE outside the sandbox
//! (`docs/e2b-compat.md`, section 3): Connect-RPC `process.Process` and
//! `filesystem.Filesystem` ([`process_service`], [`filesystem_service`]), HTTP `/files`
//! ([`files`]) and `/health`. Every request names its sandbox (the dispatcher's
//! [`EnvdTarget`]) and proves itself with the sandbox's access token ([`access`]); the
//! messages are our own serde types in the proto3 JSON mapping ([`process`],
//! [`filesystem`]). The guest daemon is reached through SPACE's own guest channel: it
//! still listens on no network socket.

pub mod access;
pub mod errors;
pub mod files;
pub mod filesystem;
pub mod filesystem_service;
pub mod process;
pub mod process_service;
pub mod signature;
pub mod watchers;

use axum::extract::{Path, Request, State};
use axum::http::{header::ALLOW, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;

pub use access::EnvdTarget;
pub use errors::sandbox_not_found_response;

use crate::connect::{Code, ConnectError};
use crate::state::E2bState;
use access::Proof;
use space_core::error::excerpt;
use space_core::process::ProcessSpec;

/// `bytes` fields: standard base64 with padding in JSON (proto3 JSON also accepts the
/// URL-safe alphabet and missing padding on input).
pub(crate) mod base64_bytes {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD
            .decode(&text)
            .or_else(|_| URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')))
            .map_err(|_| serde::de::Error::custom("bytes must be base64"))
    }
}

/// The port envd listens on in E2B sandboxes, named by the SDKs.
pub use crate::dispatch::ENVD_PORT;

/// The RPCs envd serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Start,
    Connect,
    List,
    SendInput,
    StreamInput,
    CloseStdin,
    SendSignal,
    Update,
    Stat,
    MakeDir,
    Move,
    ListDir,
    Remove,
    WatchDir,
    CreateWatcher,
    GetWatcherEvents,
    RemoveWatcher,
}

impl Rpc {
    fn parse(service: &str, method: &str) -> Option<Rpc> {
        Some(match (service, method) {
            ("process.Process", "Start") => Rpc::Start,
            ("process.Process", "Connect") => Rpc::Connect,
            ("process.Process", "List") => Rpc::List,
            ("process.Process", "SendInput") => Rpc::SendInput,
            ("process.Process", "StreamInput") => Rpc::StreamInput,
            ("process.Process", "CloseStdin") => Rpc::CloseStdin,
            ("process.Process", "SendSignal") => Rpc::SendSignal,
            ("process.Process", "Update") => Rpc::Update,
            ("filesystem.Filesystem", "Stat") => Rpc::Stat,
            ("filesystem.Filesystem", "MakeDir") => Rpc::MakeDir,
            ("filesystem.Filesystem", "Move") => Rpc::Move,
            ("filesystem.Filesystem", "ListDir") => Rpc::ListDir,
            ("filesystem.Filesystem", "Remove") => Rpc::Remove,
            ("filesystem.Filesystem", "WatchDir") => Rpc::WatchDir,
            ("filesystem.Filesystem", "CreateWatcher") => Rpc::CreateWatcher,
            ("filesystem.Filesystem", "GetWatcherEvents") => Rpc::GetWatcherEvents,
            ("filesystem.Filesystem", "RemoveWatcher") => Rpc::RemoveWatcher,
            _ => return None,
        })
    }
}

/// envd's routes (the dispatcher has put the target sandbox into each request).
pub fn router(st: E2bState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/files", any(files_route))
        .route("/{service}/{method}", any(rpc))
        .fallback(not_found)
        .with_state(st)
}

async fn not_found(req: Request) -> Response {
    errors::http_error(
        404,
        format!("no envd route {}", excerpt(req.uri().path(), 128)),
    )
}

fn target_of(req: &Request) -> Option<EnvdTarget> {
    req.extensions().get::<EnvdTarget>().cloned()
}

async fn rpc(
    State(st): State<E2bState>,
    Path((service, method)): Path<(String, String)>,
    req: Request,
) -> Response {
    if req.method() != Method::POST {
        crate::connect::server::discard(req).await;
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(ALLOW, "POST")],
            "Connect RPCs are POST",
        )
            .into_response();
    }
    let Some(rpc) = Rpc::parse(&service, &method) else {
        crate::connect::server::discard(req).await;
        return ConnectError::new(
            Code::Unimplemented,
            format!(
                "{}/{} is not implemented",
                excerpt(&service, 64),
                excerpt(&method, 64)
            ),
        )
        .into_response();
    };
    let Some(target) = target_of(&req) else {
        return sandbox_not_found_response("the request");
    };
    let caller = match access::caller(&st, &target, req.headers(), Proof::Token).await {
        Ok(c) => c,
        Err(e) => {
            crate::connect::server::discard(req).await;
            return errors::rpc_access_error(e);
        }
    };
    match rpc {
        Rpc::Start => process_service::start(&st, caller, req).await,
        Rpc::Connect => process_service::connect(&st, caller, req).await,
        Rpc::List => process_service::list(&st, caller, req).await,
        Rpc::SendInput => process_service::send_input(&st, caller, req).await,
        Rpc::StreamInput => process_service::stream_input(&st, caller, req).await,
        Rpc::CloseStdin => process_service::close_stdin(&st, caller, req).await,
        Rpc::SendSignal => process_service::send_signal(&st, caller, req).await,
        Rpc::Update => process_service::update(&st, caller, req).await,
        Rpc::Stat => filesystem_service::stat(&st, caller, req).await,
        Rpc::MakeDir => filesystem_service::make_dir(&st, caller, req).await,
        Rpc::Move => filesystem_service::move_entry(&st, caller, req).await,
        Rpc::ListDir => filesystem_service::list_dir(&st, caller, req).await,
        Rpc::Remove => filesystem_service::remove(&st, caller, req).await,
        Rpc::WatchDir => filesystem_service::watch_dir(&st, caller, req).await,
        Rpc::CreateWatcher => filesystem_service::create_watcher(&st, caller, req).await,
        Rpc::GetWatcherEvents => filesystem_service::get_watcher_events(&st, caller, req).await,
        Rpc::RemoveWatcher => filesystem_service::remove_watcher(&st, caller, req).await,
    }
}

/// Runs a unary RPC on the caller's guest: decodes its `T`, finds the guest (waking a
/// sandbox idleness paused), runs `f` with the guest, the acting user and the message, and
/// renders its result.
pub(crate) async fn unary<T, R, F, Fut>(
    st: &E2bState,
    caller: access::EnvdCaller,
    req: Request,
    f: F,
) -> Response
where
    T: serde::de::DeserializeOwned,
    R: serde::Serialize,
    F: FnOnce(space_guest_client::GuestClient, Option<String>, T) -> Fut,
    Fut: std::future::Future<Output = Result<R, ConnectError>>,
{
    use crate::connect::server::{Unary, UnaryResponse};
    use axum::extract::FromRequest as _;
    let message = match Unary::<T>::from_request(req, &()).await {
        Ok(Unary(m)) => m,
        Err(rejection) => return rejection.into_response(),
    };
    let guest = match guest(st, &caller).await {
        Ok(g) => g,
        Err(e) => return e.into_response(),
    };
    match f(guest, caller.user, message).await {
        Ok(r) => UnaryResponse(r).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The guest of the caller's sandbox (waking it if idleness paused it).
pub(crate) async fn guest(
    st: &E2bState,
    caller: &access::EnvdCaller,
) -> Result<space_guest_client::GuestClient, ConnectError> {
    st.app
        .guest(&caller.tenant, &caller.id)
        .await
        .map_err(errors::unreachable)
}

/// What a server-streaming RPC starts from: its one request message, its headers (for the
/// keepalive interval), its deadline and the caller.
pub(crate) struct StreamCall<'a, T> {
    st: &'a E2bState,
    pub caller: access::EnvdCaller,
    pub message: T,
    pub headers: axum::http::HeaderMap,
    pub deadline: Option<std::time::Duration>,
}

impl<T> StreamCall<'_, T> {
    /// The caller's guest ([`guest`]); asked for only once the request is known to be good.
    pub async fn guest(&self) -> Result<space_guest_client::GuestClient, ConnectError> {
        guest(self.st, &self.caller).await
    }

    /// `spec` as it is started in the caller's sandbox (see [`AppState::process_spec`]).
    ///
    /// [`AppState::process_spec`]: space_control::AppState::process_spec
    pub async fn process_spec(&self, spec: &ProcessSpec) -> Result<ProcessSpec, ConnectError> {
        self.st
            .app
            .process_spec(&self.caller.tenant, &self.caller.id, spec)
            .await
            .map_err(errors::unreachable)
    }
}

/// Runs a server-streaming RPC: decodes its `T` (a rejection is answered as such) and reads
/// its deadline, then `f` opens the stream. Whatever fails before the stream opens is the
/// stream's error.
pub(crate) async fn server_stream<'a, T, F, Fut>(
    st: &'a E2bState,
    caller: access::EnvdCaller,
    req: Request,
    f: F,
) -> Response
where
    T: serde::de::DeserializeOwned,
    F: FnOnce(StreamCall<'a, T>) -> Fut,
    Fut: std::future::Future<Output = Result<Response, ConnectError>>,
{
    use crate::connect::server::{stream_error, StreamRequest};
    use axum::extract::FromRequest as _;
    let StreamRequest { message, headers } = match StreamRequest::<T>::from_request(req, &()).await
    {
        Ok(r) => r,
        Err(rejection) => return rejection.into_response(),
    };
    let run = async {
        let deadline = crate::connect::server::deadline(&headers)?;
        f(StreamCall {
            st,
            caller,
            message,
            headers,
            deadline,
        })
        .await
    };
    run.await.unwrap_or_else(stream_error)
}

async fn files_route(State(st): State<E2bState>, req: Request) -> Response {
    let target = target_of(&req);
    files::files(&st, target, req).await
}

/// `GET /health`: 204 while the sandbox runs (one idleness paused is woken), else the
/// proxy's 502 "was not found", which the SDKs' `is_running()` reads as false. Needs no
/// token.
async fn health(State(st): State<E2bState>, req: Request) -> Response {
    let Some(target) = target_of(&req) else {
        return sandbox_not_found_response("the request");
    };
    let caller = match access::caller(&st, &target, req.headers(), Proof::None).await {
        Ok(c) => c,
        Err(e) => return errors::http_access_error(e),
    };
    let gone = || errors::http_error(502, format!("sandbox {} was not found", caller.id));
    match st.app.guest(&caller.tenant, &caller.id).await {
        Ok(guest) => match guest.health().await {
            Ok(_) => StatusCode::NO_CONTENT.into_response(),
            Err(_) => gone(),
        },
        Err(_) => gone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpcs_are_known_by_service_and_method() {
        assert_eq!(Rpc::parse("process.Process", "Start"), Some(Rpc::Start));
        assert_eq!(
            Rpc::parse("filesystem.Filesystem", "ListDir"),
            Some(Rpc::ListDir)
        );
        assert_eq!(Rpc::parse("process.Process", "Exec"), None);
        assert_eq!(Rpc::parse("filesystem.Filesystem", "Start"), None);
    }
}

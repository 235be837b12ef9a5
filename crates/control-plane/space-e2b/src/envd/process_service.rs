//! envd's `process.Process` service onto SPACE's processes (`docs/e2b-compat.md`, 3.1).
//!
//! - `Start` starts a SPACE process (`cmd` + `args` as its argv, the caller's user, the
//!   request's deadline as its timeout: envd kills a command whose `Connect-Timeout-Ms`
//!   passes) and streams its events; `Connect` streams a running one's from now on.
//! - Closing either stream never kills the process (SPACE's output streams are readers).
//! - Processes are named by their guest pid or tag, as in envd: the selector is resolved
//!   against the running processes.
//! - A process's end is rendered as Go's `os/exec` reports it (`exit status 3`,
//!   `signal: killed`), the text the SDKs show in their exceptions.

use axum::extract::{FromRequest, Request};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use space_control::api::error::ApiError;
use space_core::process::{
    ExitStatus, OutputEvent, OutputStream, ProcessId, ProcessInfo as SpaceProcess, ProcessSpec,
    PtySize,
};
use space_guest_client::{GuestClient, GuestError};

use super::access::EnvdCaller;
use super::errors::connect_error;
use super::process::{
    DataEvent, EndEvent, EventResponse, ListResponse, ProcessConfig, ProcessEvent, ProcessInfo,
    ProcessInput, ProcessRequest, ProcessSelector, SendInputRequest, SendSignalRequest,
    StartRequest, StreamInputRequest, UpdateRequest,
};
use super::{guest, server_stream, unary, StreamCall};
use crate::connect::server::{
    client_stream_response, deadline_passed, keepalive, stream_response,
    with_keepalive_and_deadline, ClientStream,
};
use crate::connect::{Code, ConnectError};
use crate::state::E2bState;
use space_core::error::excerpt;

/// An empty message (the response of most unary calls).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Empty {}

fn guest_error(e: GuestError) -> ConnectError {
    connect_error(ApiError::from(e))
}

/// SPACE's spec for a `Start` request.
pub fn spec_of(
    req: &StartRequest,
    user: Option<String>,
    timeout: Option<std::time::Duration>,
) -> Result<ProcessSpec, ConnectError> {
    if req.process.cmd.is_empty() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "process.cmd is empty",
        ));
    }
    let argv = std::iter::once(req.process.cmd.clone())
        .chain(req.process.args.iter().cloned())
        .collect();
    let pty = req.pty.map(|p| {
        let dim = |d: u32| u16::try_from(d).unwrap_or(u16::MAX);
        PtySize {
            rows: dim(p.size.rows),
            cols: dim(p.size.cols),
        }
    });
    let spec = ProcessSpec {
        argv: Some(argv),
        shell: None,
        env: req.process.envs.clone(),
        cwd: req.process.cwd.clone().filter(|c| !c.is_empty()),
        user,
        timeout_ms: timeout
            .filter(|t| !t.is_zero())
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        // envd keeps stdin open unless told otherwise; a PTY is always writable.
        stdin: pty.is_some() || req.stdin.unwrap_or(true),
        pty,
        tag: req.tag.clone().filter(|t| !t.is_empty()),
    };
    spec.validate()
        .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?;
    Ok(spec)
}

/// Go's `ProcessState.String()` for a signal number.
fn signal_text(signal: i32) -> String {
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        n => return format!("signal: signal {n}"),
    };
    format!("signal: {name}")
}

/// envd's end event for how a SPACE process ended.
pub fn end_event(status: &ExitStatus) -> EndEvent {
    match (status.exit_code, status.signal) {
        (Some(code), _) => EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: (code != 0).then(|| format!("exit status {code}")),
        },
        (None, signal) => {
            let text = signal_text(signal.unwrap_or(9));
            EndEvent {
                exit_code: -1,
                exited: false,
                status: text.clone(),
                error: Some(text),
            }
        }
    }
}

/// envd's event for one of SPACE's, if it has one (a `lost` gap has none).
pub fn event_of(ev: OutputEvent) -> Option<ProcessEvent> {
    match ev {
        OutputEvent::Started { pid, .. } => Some(ProcessEvent::Start { pid }),
        OutputEvent::Data { stream, data, .. } => Some(ProcessEvent::Data(match stream {
            OutputStream::Stdout => DataEvent::Stdout(data),
            OutputStream::Stderr => DataEvent::Stderr(data),
            OutputStream::Pty => DataEvent::Pty(data),
        })),
        OutputEvent::Lost { bytes, .. } => {
            tracing::debug!(bytes, "output lost before an E2B client read it");
            None
        }
        OutputEvent::Exit { status, .. } => Some(ProcessEvent::End(end_event(&status))),
    }
}

/// The envd stream of a process: `start{pid}` first (whatever the guest replays first),
/// then its output and its end.
fn process_stream(
    pid: u32,
    events: BoxStream<'static, Result<OutputEvent, GuestError>>,
    deadline_kills: bool,
) -> BoxStream<'static, Result<EventResponse, ConnectError>> {
    let start = futures::stream::once(async move {
        Ok(EventResponse {
            event: ProcessEvent::Start { pid },
        })
    });
    let rest = events.filter_map(move |ev| async move {
        match ev {
            Ok(OutputEvent::Started { .. }) => None,
            // The process's timeout is the request's deadline (`Start`): the guest's kill
            // and the stream's own deadline race, and envd answers the deadline, not an
            // end event, whichever the guest saw first.
            Ok(OutputEvent::Exit { status, .. }) if deadline_kills && status.timed_out => {
                Some(Err(deadline_passed()))
            }
            Ok(ev) => event_of(ev).map(|event| Ok(EventResponse { event })),
            Err(e) => Some(Err(ConnectError::new(
                Code::Unavailable,
                format!(
                    "the process's output broke off: {}",
                    ApiError::from(e).body.message
                ),
            ))),
        }
    });
    start.chain(rest).boxed()
}

fn keepalive_event() -> EventResponse {
    EventResponse {
        event: ProcessEvent::Keepalive {},
    }
}

/// The response of `Start` and `Connect`: the process's envd events, with keepalives at
/// the interval the request asks for, ended at its deadline (which, for `Start`, is also
/// the process's timeout: `deadline_kills`).
fn follow(
    pid: u32,
    events: BoxStream<'static, Result<OutputEvent, GuestError>>,
    headers: &axum::http::HeaderMap,
    deadline: Option<std::time::Duration>,
    deadline_kills: bool,
) -> Response {
    stream_response(with_keepalive_and_deadline(
        process_stream(pid, events, deadline_kills),
        keepalive(headers),
        deadline,
        keepalive_event,
    ))
}

/// `process.Process/Start` (server stream).
pub async fn start(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    server_stream(st, caller, req, |c: StreamCall<StartRequest>| async move {
        let spec = spec_of(&c.message, c.caller.user.clone(), c.deadline)?;
        let guest = c.guest().await?;
        let spec = c.process_spec(&spec).await?;
        let info = guest.start_process(&spec).await.map_err(guest_error)?;
        let events = guest.output(info.id, None).await.map_err(guest_error)?;
        Ok(follow(info.pid, events, &c.headers, c.deadline, true))
    })
    .await
}

/// The running process `selector` names.
async fn find(
    guest: &GuestClient,
    selector: &ProcessSelector,
) -> Result<SpaceProcess, ConnectError> {
    let processes = guest.list_processes().await.map_err(guest_error)?;
    processes
        .into_iter()
        .filter(|p| p.exit.is_none())
        .find(|p| match selector {
            ProcessSelector::Pid(pid) => p.pid == *pid,
            ProcessSelector::Tag(tag) => p.tag.as_deref() == Some(tag.as_str()),
        })
        .ok_or_else(|| {
            ConnectError::new(
                Code::NotFound,
                match selector {
                    ProcessSelector::Pid(pid) => format!("process with pid {pid} not found"),
                    ProcessSelector::Tag(tag) => {
                        format!("process with tag {:?} not found", excerpt(tag, 64))
                    }
                },
            )
        })
}

/// `process.Process/Connect` (server stream).
pub async fn connect(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    server_stream(
        st,
        caller,
        req,
        |c: StreamCall<ProcessRequest>| async move {
            let guest = c.guest().await?;
            let process = find(&guest, &c.message.process).await?;
            // envd's Connect follows the process from now on; what it printed before is not
            // sent again.
            let events = guest.output_live(process.id).await.map_err(guest_error)?;
            Ok(follow(process.pid, events, &c.headers, c.deadline, false))
        },
    )
    .await
}

/// envd's description of a running process.
fn info_of(p: &SpaceProcess) -> ProcessInfo {
    let mut argv = p.argv.iter().cloned();
    ProcessInfo {
        config: ProcessConfig {
            cmd: argv.next().unwrap_or_default(),
            args: argv.collect(),
            envs: p.env.clone(),
            cwd: p.cwd.clone(),
        },
        pid: p.pid,
        tag: p.tag.clone(),
    }
}

/// `process.Process/List`: the running processes.
pub async fn list(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(st, caller, req, |guest, _user, _: Empty| async move {
        let processes = guest.list_processes().await.map_err(guest_error)?;
        Ok(ListResponse {
            processes: processes
                .iter()
                .filter(|p| p.exit.is_none())
                .map(info_of)
                .collect(),
        })
    })
    .await
}

fn input_bytes(input: ProcessInput) -> Bytes {
    match input {
        ProcessInput::Stdin(b) | ProcessInput::Pty(b) => Bytes::from(b),
    }
}

async fn write(
    guest: &GuestClient,
    id: ProcessId,
    data: Bytes,
    close: bool,
) -> Result<(), ConnectError> {
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(data) }).boxed();
    guest
        .write_stdin(id, body, close)
        .await
        .map_err(guest_error)
}

/// `process.Process/SendInput`.
pub async fn send_input(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(
        st,
        caller,
        req,
        |guest, _user, m: SendInputRequest| async move {
            let p = find(&guest, &m.process).await?;
            write(&guest, p.id, input_bytes(m.input), false).await?;
            Ok(Empty {})
        },
    )
    .await
}

/// `process.Process/CloseStdin`.
pub async fn close_stdin(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(
        st,
        caller,
        req,
        |guest, _user, m: ProcessRequest| async move {
            let p = find(&guest, &m.process).await?;
            write(&guest, p.id, Bytes::new(), true).await?;
            Ok(Empty {})
        },
    )
    .await
}

/// `process.Process/SendSignal`: `not_found` for a process that is not running (the SDKs'
/// `kill` then returns false).
pub async fn send_signal(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(
        st,
        caller,
        req,
        |guest, _user, m: SendSignalRequest| async move {
            let signal = m.signal.number();
            if signal == 0 {
                return Err(ConnectError::new(Code::InvalidArgument, "no signal given"));
            }
            let p = find(&guest, &m.process).await?;
            guest.signal(p.id, signal).await.map_err(guest_error)?;
            Ok(Empty {})
        },
    )
    .await
}

/// `process.Process/Update`: resizes the process's PTY.
pub async fn update(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    unary(
        st,
        caller,
        req,
        |guest, _user, m: UpdateRequest| async move {
            let p = find(&guest, &m.process).await?;
            if let Some(pty) = m.pty {
                let dim = |d: u32| u16::try_from(d).unwrap_or(u16::MAX);
                let size = PtySize {
                    rows: dim(pty.size.rows),
                    cols: dim(pty.size.cols),
                };
                guest.resize(p.id, size).await.map_err(guest_error)?;
            }
            Ok(Empty {})
        },
    )
    .await
}

/// `process.Process/StreamInput` (client stream): the first message names the process,
/// each `data` after it is written to its stdin as it arrives.
pub async fn stream_input(st: &E2bState, caller: EnvdCaller, req: Request) -> Response {
    let ClientStream { mut messages, .. } =
        match ClientStream::<StreamInputRequest>::from_request(req, &()).await {
            Ok(s) => s,
            Err(rejection) => return rejection.into_response(),
        };
    let run = async {
        let selector = match messages.next().await {
            Some(Ok(StreamInputRequest::Start { process })) => process,
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "the first message of StreamInput must be start",
                ))
            }
        };
        let guest = guest(st, &caller).await?;
        let p = find(&guest, &selector).await?;
        // A client error mid-stream aborts the write (the process keeps what it got); the
        // stream's own error is what the client is told, not the aborted write's.
        let broke: std::sync::Arc<std::sync::Mutex<Option<ConnectError>>> = Default::default();
        let seen = broke.clone();
        let data = messages
            .filter_map(move |m| {
                let seen = seen.clone();
                async move {
                    let err = match m {
                        Ok(StreamInputRequest::Data { input }) => {
                            return Some(Ok(input_bytes(input)))
                        }
                        Ok(StreamInputRequest::Keepalive {}) => return None,
                        Ok(StreamInputRequest::Start { .. }) => {
                            ConnectError::new(Code::InvalidArgument, "a second start message")
                        }
                        Err(e) => e,
                    };
                    let text = err.to_string();
                    if let Ok(mut slot) = seen.lock() {
                        slot.get_or_insert(err);
                    }
                    Some(Err(std::io::Error::other(text)))
                }
            })
            .boxed();
        let written = guest.write_stdin(p.id, data, false).await;
        if let Some(e) = broke.lock().ok().and_then(|mut slot| slot.take()) {
            return Err(e);
        }
        written.map_err(guest_error)?;
        Ok(Empty {})
    };
    client_stream_response(run.await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envd::process::{Pty, PtySize as E2bPty};

    #[test]
    fn start_requests_become_specs() {
        let req: StartRequest = serde_json::from_value(serde_json::json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/tmp"},
            "stdin": false, "tag": "t"
        }))
        .unwrap();
        let spec = spec_of(
            &req,
            Some("root".into()),
            Some(std::time::Duration::from_secs(60)),
        )
        .unwrap();
        assert_eq!(
            spec.argv.as_deref().unwrap(),
            ["/bin/bash", "-l", "-c", "echo hi"]
        );
        assert_eq!((spec.stdin, spec.timeout_ms), (false, Some(60_000)));
        assert_eq!(spec.user.as_deref(), Some("root"));
        assert_eq!(spec.tag.as_deref(), Some("t"));
        let pty = StartRequest {
            pty: Some(Pty {
                size: E2bPty { cols: 80, rows: 24 },
            }),
            ..req.clone()
        };
        let spec = spec_of(&pty, None, Some(std::time::Duration::ZERO)).unwrap();
        assert!(spec.stdin && spec.timeout_ms.is_none());
        assert_eq!(spec.pty, Some(PtySize { rows: 24, cols: 80 }));
        assert!(spec_of(&StartRequest::default(), None, None).is_err());
    }

    #[test]
    fn ends_read_as_go_reports_them() {
        let exited = end_event(&ExitStatus {
            exit_code: Some(3),
            signal: None,
            timed_out: false,
        });
        assert_eq!(
            (
                exited.exit_code,
                exited.exited,
                exited.status.as_str(),
                exited.error.as_deref()
            ),
            (3, true, "exit status 3", Some("exit status 3"))
        );
        let ok = end_event(&ExitStatus {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
        });
        assert_eq!(ok.error, None);
        let killed = end_event(&ExitStatus {
            exit_code: None,
            signal: Some(9),
            timed_out: true,
        });
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.status, "signal: killed");
        assert_eq!(signal_text(40), "signal: signal 40");
    }

    #[test]
    fn output_passes_through_as_base64() {
        let ev = event_of(OutputEvent::data(1, OutputStream::Stderr, b"oops")).unwrap();
        assert_eq!(ev, ProcessEvent::Data(DataEvent::Stderr("b29wcw==".into())));
        assert_eq!(event_of(OutputEvent::Lost { seq: 2, bytes: 9 }), None);
    }
}

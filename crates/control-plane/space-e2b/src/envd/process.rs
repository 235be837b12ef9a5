//! The messages of envd's `process.Process` service in the proto3 JSON mapping the SDKs
//! send and read: lowerCamelCase names (the original snake_case names accepted on input),
//! `bytes` as base64, enums by name (or number), a oneof as the one key that is set, default
//! values omitted, unknown fields ignored. Written from the interface's facts (names,
//! types, semantics; `docs/e2b-compat.md`, section 3.1), not generated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::base64_bytes;

/// What to run: `cmd` and `args` (the SDKs send `/bin/bash -l -c <command>`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessConfig {
    /// The program.
    pub cmd: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment (on top of the sandbox's).
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// A terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PtySize {
    /// Columns.
    pub cols: u32,
    /// Rows.
    pub rows: u32,
}

/// A pseudo-terminal request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Pty {
    /// Its size.
    pub size: PtySize,
}

/// `Start`: run a process and stream its events.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default)]
pub struct StartRequest {
    /// What to run.
    pub process: ProcessConfig,
    /// Run it on a PTY.
    pub pty: Option<Pty>,
    /// A name to select it by later.
    pub tag: Option<String>,
    /// Keep stdin open for input.
    pub stdin: Option<bool>,
}

/// Selects a process: by guest pid or by tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessSelector {
    /// Guest process id.
    Pid(u32),
    /// The tag given at start.
    Tag(String),
}

/// A request naming a process (`Connect`, `CloseStdin`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ProcessRequest {
    /// Which process.
    pub process: ProcessSelector,
}

/// Input for a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessInput {
    /// Bytes for stdin.
    Stdin(#[serde(with = "base64_bytes")] Vec<u8>),
    /// Bytes for the PTY.
    Pty(#[serde(with = "base64_bytes")] Vec<u8>),
}

/// `SendInput`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SendInputRequest {
    /// Which process.
    pub process: ProcessSelector,
    /// What to send.
    pub input: ProcessInput,
}

/// The signals `SendSignal` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Signal {
    /// Not set.
    #[serde(rename = "SIGNAL_UNSPECIFIED")]
    Unspecified,
    /// SIGTERM.
    #[serde(rename = "SIGNAL_SIGTERM")]
    Sigterm,
    /// SIGKILL.
    #[serde(rename = "SIGNAL_SIGKILL")]
    Sigkill,
}

impl Signal {
    /// The signal number (0 for unspecified).
    pub fn number(self) -> i32 {
        match self {
            Signal::Unspecified => 0,
            Signal::Sigterm => 15,
            Signal::Sigkill => 9,
        }
    }
}

/// `SendSignal`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SendSignalRequest {
    /// Which process.
    pub process: ProcessSelector,
    /// Which signal (by name; proto3 JSON also allows the number).
    #[serde(deserialize_with = "signal_by_name_or_number")]
    pub signal: Signal,
}

fn signal_by_name_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Signal, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Name(Signal),
        Number(i64),
    }
    match Raw::deserialize(d)? {
        Raw::Name(s) => Ok(s),
        Raw::Number(0) => Ok(Signal::Unspecified),
        Raw::Number(9) => Ok(Signal::Sigkill),
        Raw::Number(15) => Ok(Signal::Sigterm),
        Raw::Number(n) => Err(serde::de::Error::custom(format!("unknown signal {n}"))),
    }
}

/// One message of `StreamInput`'s request stream: exactly one of its fields is set. The
/// first selects the process; then each `data` is a chunk of input and `keepalive` keeps
/// an idle stream open.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamInputRequest {
    /// Which process the input is for.
    Start {
        /// Which process.
        process: ProcessSelector,
    },
    /// A chunk of input.
    Data {
        /// What to send.
        input: ProcessInput,
    },
    /// Nothing to send for now.
    Keepalive {},
}

/// `Update`: resize a process's PTY.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct UpdateRequest {
    /// Which process.
    pub process: ProcessSelector,
    /// The new size.
    #[serde(default)]
    pub pty: Option<Pty>,
}

/// One event of a process's stream: exactly one of its fields is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessEvent {
    /// It started (always the first event).
    Start {
        /// Guest pid.
        pid: u32,
    },
    /// Output.
    Data(DataEvent),
    /// It ended.
    End(EndEvent),
    /// Nothing happened for a while (keeps idle connections alive; the SDKs skip it).
    Keepalive {},
}

/// Output of a process: one of stdout, stderr or PTY bytes, as standard base64 (SPACE's
/// output events carry the same encoding, so the text passes through untouched).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DataEvent {
    /// Stdout bytes, base64.
    Stdout(String),
    /// Stderr bytes, base64.
    Stderr(String),
    /// PTY bytes, base64.
    Pty(String),
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// How a process ended. Defaults are omitted, as proto3 JSON does (`exitCode: 0` is absent,
/// which the SDKs read as 0).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndEvent {
    /// Exit code (-1 when killed by a signal).
    #[serde(skip_serializing_if = "is_zero", alias = "exit_code")]
    pub exit_code: i32,
    /// Whether it exited (rather than being killed).
    #[serde(skip_serializing_if = "is_false")]
    pub exited: bool,
    /// `exit status 1`, `signal: killed`, …
    #[serde(skip_serializing_if = "String::is_empty")]
    pub status: String,
    /// Why it failed, if it did (the SDKs' exception message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The response message of `Start` and `Connect` streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventResponse {
    /// The event.
    pub event: ProcessEvent,
}

/// One process of `List`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// What it runs.
    pub config: ProcessConfig,
    /// Guest pid.
    pub pid: u32,
    /// Its tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `List`'s response.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ListResponse {
    /// The processes.
    pub processes: Vec<ProcessInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn start_requests_parse_as_the_sdks_send_them() {
        let r: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                        "envs": {"A": "1"}, "cwd": "/tmp"},
            "pty": {"size": {"cols": 80, "rows": 24}},
            "tag": "t", "stdin": false, "somethingNew": 1
        }))
        .unwrap();
        assert_eq!(r.process.args[2], "echo hi");
        assert_eq!(r.pty.unwrap().size.rows, 24);
        assert_eq!(r.stdin, Some(false));
        let empty: StartRequest = serde_json::from_value(json!({})).unwrap();
        assert_eq!(empty, StartRequest::default());
    }

    #[test]
    fn selectors_inputs_and_signals() {
        let r: SendInputRequest =
            serde_json::from_value(json!({"process": {"pid": 42}, "input": {"stdin": "aGk="}}))
                .unwrap();
        assert_eq!(r.process, ProcessSelector::Pid(42));
        assert_eq!(r.input, ProcessInput::Stdin(b"hi".to_vec()));
        let by_tag: ProcessRequest =
            serde_json::from_value(json!({"process": {"tag": "web"}})).unwrap();
        assert_eq!(by_tag.process, ProcessSelector::Tag("web".into()));
        for (json, want) in [
            (json!("SIGNAL_SIGKILL"), Signal::Sigkill),
            (json!(15), Signal::Sigterm),
        ] {
            let r: SendSignalRequest =
                serde_json::from_value(json!({"process": {"pid": 1}, "signal": json})).unwrap();
            assert_eq!(r.signal, want);
        }
        assert_eq!(Signal::Sigkill.number(), 9);
        assert!(serde_json::from_value::<SendSignalRequest>(
            json!({"process": {"pid": 1}, "signal": 11})
        )
        .is_err());
        assert!(serde_json::from_value::<SendInputRequest>(
            json!({"process": {"pid": 1}, "input": {"stdin": "not base64!"}})
        )
        .is_err());
    }

    #[test]
    fn stream_input_messages_are_one_key() {
        let start: StreamInputRequest =
            serde_json::from_value(json!({"start": {"process": {"pid": 3}}})).unwrap();
        assert_eq!(
            start,
            StreamInputRequest::Start {
                process: ProcessSelector::Pid(3)
            }
        );
        let data: StreamInputRequest =
            serde_json::from_value(json!({"data": {"input": {"stdin": "aGk="}}})).unwrap();
        assert_eq!(
            data,
            StreamInputRequest::Data {
                input: ProcessInput::Stdin(b"hi".to_vec())
            }
        );
        let idle: StreamInputRequest = serde_json::from_value(json!({"keepalive": {}})).unwrap();
        assert_eq!(idle, StreamInputRequest::Keepalive {});
    }

    #[test]
    fn events_render_in_the_proto3_json_mapping() {
        let render = |e: ProcessEvent| serde_json::to_value(EventResponse { event: e }).unwrap();
        assert_eq!(
            render(ProcessEvent::Start { pid: 7 }),
            json!({"event": {"start": {"pid": 7}}})
        );
        assert_eq!(
            render(ProcessEvent::Data(DataEvent::Stderr("b29wcw==".into()))),
            json!({"event": {"data": {"stderr": "b29wcw=="}}})
        );
        assert_eq!(
            render(ProcessEvent::End(EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None
            })),
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        assert_eq!(
            render(ProcessEvent::End(EndEvent {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: None
            })),
            json!({"event": {"end": {"exitCode": -1, "status": "signal: killed"}}})
        );
        assert_eq!(
            render(ProcessEvent::Keepalive {}),
            json!({"event": {"keepalive": {}}})
        );
    }
}

//! Daemon and process calls: health, configure, start/list/inspect processes, their
//! output stream, stdin, signals and terminal size.
//!
//! Requests are checked against the same `space-core` rules the daemon applies, so a bad
//! request fails here with [`GuestError::Local`] instead of costing a round trip (and a
//! guest is never handed input it would have to refuse).

use bytes::Bytes;
use futures::stream::BoxStream;
use http::Method;
use space_core::process::{
    validate_env, validate_user_name, OutputEvent, ProcessId, ProcessInfo, ProcessSpec, PtySize,
    SignalRequest,
};
use space_core::ErrorCode;
use space_guest_proto::limits::MAX_JSON_BODY;
use space_guest_proto::{routes, GuestConfig, Health};

use crate::error::GuestError;
use crate::options::MAX_LISTING_BODY;
use crate::query::Target;
use crate::transport::Body;
use crate::GuestClient;

impl GuestClient {
    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<Health, GuestError> {
        self.transport()
            .json(
                Method::GET,
                Target::new(routes::HEALTH),
                Body::Empty,
                MAX_JSON_BODY,
            )
            .await
    }

    /// `POST /v1/configure`: hostname, environment, default user, clock of a fresh guest.
    pub async fn configure(&self, cfg: &GuestConfig) -> Result<(), GuestError> {
        if !space_guest_proto::valid_hostname(&cfg.hostname) {
            return Err(GuestError::local(
                ErrorCode::InvalidRequest,
                space_guest_proto::RequestError::Hostname.to_string(),
            ));
        }
        validate_env(&cfg.env).map_err(|name| {
            GuestError::local(
                ErrorCode::InvalidRequest,
                format!("bad environment variable '{name}'"),
            )
        })?;
        validate_user_name(&cfg.default_user)
            .map_err(|_| GuestError::local(ErrorCode::InvalidRequest, "bad default user name"))?;
        self.transport()
            .unit(
                Method::POST,
                Target::new(routes::CONFIGURE),
                Body::json(cfg)?,
            )
            .await
    }

    /// `POST /v1/processes`: starts a process.
    pub async fn start_process(&self, spec: &ProcessSpec) -> Result<ProcessInfo, GuestError> {
        spec.validate()
            .map_err(|e| GuestError::local(ErrorCode::InvalidRequest, e.to_string()))?;
        self.transport()
            .json(
                Method::POST,
                Target::new(routes::PROCESSES),
                Body::json(spec)?,
                MAX_JSON_BODY,
            )
            .await
    }

    /// `GET /v1/processes`: running and recently finished processes.
    pub async fn list_processes(&self) -> Result<Vec<ProcessInfo>, GuestError> {
        self.transport()
            .json(
                Method::GET,
                Target::new(routes::PROCESSES),
                Body::Empty,
                MAX_LISTING_BODY,
            )
            .await
    }

    /// `GET /v1/processes/{id}`.
    pub async fn process(&self, id: ProcessId) -> Result<ProcessInfo, GuestError> {
        self.transport()
            .json(
                Method::GET,
                Target::new(routes::process(id)),
                Body::Empty,
                MAX_JSON_BODY,
            )
            .await
    }

    /// `GET /v1/processes/{id}/output?after=SEQ`: the process's output events (those after
    /// `after`), ending with its `exit` event. Each NDJSON line is at most
    /// `space_core::process::MAX_OUTPUT_LINE` bytes; an oversize or unparsable line, or a
    /// stream that ends without `exit`, ends the stream with [`GuestError::Protocol`].
    /// Only the wait for the stream to open is timed; dropping the stream cancels it.
    pub async fn output(
        &self,
        id: ProcessId,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<OutputEvent, GuestError>>, GuestError> {
        let after = after.map(|seq| seq.to_string());
        let target = Target::new(routes::process_output(id)).opt_param("after", after.as_deref());
        self.output_events(target).await
    }

    /// `GET /v1/processes/{id}/output?live=true`: the process's `started` event, then only
    /// the events it produces from now on, ending with its `exit` (for a process that has
    /// exited: `started`, then `exit`). Bounded and timed as [`GuestClient::output`].
    pub async fn output_live(
        &self,
        id: ProcessId,
    ) -> Result<BoxStream<'static, Result<OutputEvent, GuestError>>, GuestError> {
        let target = Target::new(routes::process_output(id)).param("live", "true");
        self.output_events(target).await
    }

    async fn output_events(
        &self,
        target: Target,
    ) -> Result<BoxStream<'static, Result<OutputEvent, GuestError>>, GuestError> {
        let resp = self.transport().open_stream(Method::GET, target).await?;
        Ok(crate::stream::events(
            resp.into_body(),
            self.transport().closed_rx(),
        ))
    }

    /// `POST /v1/processes/{id}/stdin?close=BOOL`: streams `body` to the process's stdin;
    /// `close` closes stdin after it. A failing `body` aborts the request
    /// ([`GuestError::Local`]).
    pub async fn write_stdin(
        &self,
        id: ProcessId,
        body: BoxStream<'static, Result<Bytes, std::io::Error>>,
        close: bool,
    ) -> Result<(), GuestError> {
        let target = Target::new(routes::process_stdin(id))
            .param("close", if close { "true" } else { "false" });
        self.transport()
            .upload_unit(Method::POST, target, body)
            .await
    }

    /// `POST /v1/processes/{id}/signal`: delivers signal `signal` (1..=64).
    pub async fn signal(&self, id: ProcessId, signal: i32) -> Result<(), GuestError> {
        if let Err(e) = space_core::process::validate_signal(signal) {
            return Err(GuestError::local(ErrorCode::InvalidRequest, e.to_string()));
        }
        self.transport()
            .unit(
                Method::POST,
                Target::new(routes::process_signal(id)),
                Body::json(&SignalRequest { signal })?,
            )
            .await
    }

    /// `POST /v1/processes/{id}/resize`: sets the terminal size of a pty process.
    pub async fn resize(&self, id: ProcessId, size: PtySize) -> Result<(), GuestError> {
        if let Err(e) = size.validate() {
            return Err(GuestError::local(ErrorCode::InvalidRequest, e.to_string()));
        }
        self.transport()
            .unit(
                Method::POST,
                Target::new(routes::process_resize(id)),
                Body::json(&size)?,
            )
            .await
    }
}

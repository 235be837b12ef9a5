//! The E2B-compatible API as one more surface of the control plane's listener
//! ([`space_control::ApiSurface`]), and the dispatch in front of everything: each request is
//! classified by its `Host` and `E2b-Sandbox-*` headers *before* any routing or
//! authentication ([`crate::dispatch`]), then goes to envd, to a sandbox port, to SPACE's own
//! API (`/v1`, `/healthz`, `/openapi.json`) or to the E2B REST API.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use space_control::{ApiSurface, SurfaceContext};
use tower::ServiceExt as _;

use crate::dispatch::{self, Route, RouteError};
use crate::envd::{self, EnvdTarget};
use crate::rest;
use crate::state::E2bState;
use crate::token::TokenKey;

/// Name of the node key envd access tokens are derived from, in the server's data directory.
pub const TOKEN_KEY_FILE: &str = "e2b.key";
/// The domain `get_host(port)` names hosts under when none is configured.
pub const DEFAULT_DOMAIN: &str = "localhost";

/// How the E2B API is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bConfig {
    /// The domain sandbox hosts are named under (`{port}-{sandbox id}.{domain}`), as the
    /// SDKs see it (what create and connect return as `domain`, from which they build
    /// `get_host(port)`). Without a port of its own, the server's listening port is added
    /// (`localhost` → `localhost:7070`).
    pub domain: String,
    /// How long a sandbox's envd and traffic tokens stay valid after they were last handed
    /// out (create, connect, get renew it), seconds.
    pub token_ttl_secs: u64,
}

/// The default of [`E2bConfig::token_ttl_secs`]: a week.
pub const DEFAULT_TOKEN_TTL_SECS: u64 = 7 * 24 * 3600;

impl Default for E2bConfig {
    fn default() -> Self {
        Self {
            domain: DEFAULT_DOMAIN.to_owned(),
            token_ttl_secs: DEFAULT_TOKEN_TTL_SECS,
        }
    }
}

/// `domain` split into name and explicit port.
fn split_port(domain: &str) -> (&str, Option<&str>) {
    match domain.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            (name, Some(port))
        }
        _ => (domain, None),
    }
}

impl E2bConfig {
    /// The domain without a port: what a request's `Host` is matched against.
    pub fn host_domain(&self) -> &str {
        split_port(&self.domain).0
    }

    /// The domain as the SDKs are told it, for a server listening on `addr` and, if it has
    /// one, on `tls_addr`: host-mode clients reach `{port}-{id}.{domain}` over HTTPS, so the
    /// TLS listener's port is the one to name. The server's banner and the surface both ask
    /// here, so the two cannot disagree.
    pub fn advertised_domain(&self, addr: SocketAddr, tls_addr: Option<SocketAddr>) -> String {
        match split_port(&self.domain) {
            (_, Some(_)) => self.domain.clone(),
            (name, None) => format!("{name}:{}", tls_addr.unwrap_or(addr).port()),
        }
    }
}

/// The E2B-compatible API, ready to be served beside SPACE's own.
#[derive(Debug, Clone, Default)]
pub struct E2bApi {
    config: E2bConfig,
}

impl E2bApi {
    /// The API with `config`.
    pub fn new(config: E2bConfig) -> Self {
        Self { config }
    }
}

impl ApiSurface for E2bApi {
    fn wrap(&self, ctx: SurfaceContext<'_>) -> anyhow::Result<Router> {
        // A cluster's replicas share one key (every replica verifies what any handed out);
        // it must exist already (`space cluster init` makes it): one made here would be this
        // replica's alone.
        let key = match &ctx.shared_token_key {
            Some(path) => space_secrets::keyfile::load_key(path).map_err(|e| {
                anyhow::anyhow!(
                    "{e} (the cluster directory's token key, made by `space cluster init`)"
                )
            })?,
            None => space_secrets::keyfile::load_or_create_key(&ctx.data_dir.join(TOKEN_KEY_FILE))?,
        };
        let config = E2bConfig {
            domain: self.config.advertised_domain(ctx.addr, ctx.tls_addr),
            ..self.config.clone()
        };
        let st = E2bState::new(ctx.state, config, TokenKey::new(*key), ctx.data_dir);
        let native = ctx.native;
        let dispatcher = Dispatcher {
            envd: envd::router(st.clone()),
            rest: rest::router(st.clone()),
            ports: crate::ports::router(st.clone()),
            native,
            st,
        };
        Ok(Router::new()
            .fallback(dispatch_request)
            .with_state(Arc::new(dispatcher)))
    }
}

/// The applications a request can go to.
struct Dispatcher {
    envd: Router,
    rest: Router,
    ports: Router,
    native: Router,
    st: E2bState,
}

async fn dispatch_request(State(d): State<Arc<Dispatcher>>, mut req: Request) -> Response {
    let route = {
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        // HTTP/2 requests carry the host in the URI's authority, HTTP/1 in `Host`.
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str())
            .or_else(|| header("host"));
        let shape = dispatch::RequestShape {
            host,
            sandbox_id: header("e2b-sandbox-id"),
            sandbox_port: header("e2b-sandbox-port"),
            access_token: header(envd::access::ACCESS_TOKEN_HEADER),
            path: req.uri().path(),
        };
        dispatch::route(&shape, d.st.config.host_domain())
    };
    let app = match route {
        Ok(Route::Envd(id)) => {
            req.extensions_mut().insert(EnvdTarget(id));
            d.envd.clone()
        }
        Ok(Route::Port(id, port)) => {
            req.extensions_mut()
                .insert(crate::ports::PortTarget { id, port });
            d.ports.clone()
        }
        Ok(Route::Control) if dispatch::is_native_path(req.uri().path()) => d.native.clone(),
        // A signed `/files` URL made with `E2B_SANDBOX_URL` names no sandbox: envd finds it.
        Ok(Route::Control) if req.uri().path() == "/files" => d.envd.clone(),
        Ok(Route::Control) => d.rest.clone(),
        // What E2B's proxy answers for a sandbox it does not know; the SDKs read
        // "was not found" as "the sandbox is not running".
        Err(RouteError::BadSandboxId) => {
            return envd::sandbox_not_found_response("the E2b-Sandbox-Id header");
        }
        Err(e @ RouteError::TokenNamesNoSandbox) => {
            return envd::errors::http_error(
                401,
                format!("invalid access token: {e} (connect to the sandbox for a valid one)"),
            );
        }
        Err(e @ RouteError::BadPort) => {
            return crate::rest::error::RestError::bad_request(e.to_string()).into_response();
        }
    };
    match app.oneshot(req).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_domain_drops_a_port() {
        let c = E2bConfig {
            domain: "space.test:7070".into(),
            ..E2bConfig::default()
        };
        assert_eq!(c.host_domain(), "space.test");
        let (plain, tls): (SocketAddr, SocketAddr) = (
            "127.0.0.1:7070".parse().expect("address"),
            "127.0.0.1:7443".parse().expect("address"),
        );
        assert_eq!(c.advertised_domain(plain, Some(tls)), "space.test:7070");
        assert_eq!(E2bConfig::default().host_domain(), "localhost");
        assert_eq!(
            E2bConfig::default().advertised_domain(plain, None),
            "localhost:7070"
        );
        assert_eq!(
            E2bConfig::default().advertised_domain(plain, Some(tls)),
            "localhost:7443",
            "host-mode clients come over TLS"
        );
    }
}

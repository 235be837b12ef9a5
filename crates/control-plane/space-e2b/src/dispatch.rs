//! Which API a request is for, decided from its `Host` and headers before any
//! authentication (envd requests carry `Authorization: Basic <user>:`, which is no API key).
//! Pure; `docs/e2b-compat.md`, section 1:
//! 1. `Host: {port}-{sandbox id}.{e2b domain}` → that port of that sandbox (envd's own port
//!    means envd);
//! 2. an `E2b-Sandbox-Id` header → envd (or a port, by `E2b-Sandbox-Port`);
//! 3. no such header but an `X-Access-Token` → envd of the sandbox the token names (SPACE's
//!    envd tokens do, [`crate::token`]; one that names none is answered 401, as a wrong
//!    token is): older SDK releases (JS 2.9) send their `/files` and `/health`
//!    requests to `E2B_SANDBOX_URL` with the token only. Routing does not authenticate: envd
//!    then checks the whole token against that sandbox;
//! 4. anything else → the REST APIs (E2B's or SPACE's own, by path).
//!
//! Rules 2 and 3 yield to a path envd never serves (E2B's REST sandboxes, `/sandboxes…` and
//! `/v2/sandboxes…`, and SPACE's `/v1…`) when they would name envd: older SDK releases
//! (Python 2.9) send their control-API `connect` with the sandbox headers (and their envd
//! calls with the API key, so the key tells nothing).

use space_core::SandboxId;

/// The port envd listens on in E2B sandboxes; the SDKs address it.
pub const ENVD_PORT: u16 = 49983;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// envd of this sandbox.
    Envd(SandboxId),
    /// A TCP port of this sandbox (a server the agent started there).
    Port(SandboxId, u16),
    /// A control API (E2B's REST or SPACE's `/v1`, told apart by path).
    Control,
}

/// Why a request names a sandbox badly (answered 400 before anything else).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// `E2b-Sandbox-Id` is not a sandbox id.
    #[error("E2b-Sandbox-Id is not a sandbox id")]
    BadSandboxId,
    /// `E2b-Sandbox-Port` is not a port.
    #[error("E2b-Sandbox-Port is not a port number")]
    BadPort,
    /// An envd request names its sandbox by nothing but an `X-Access-Token` that names none.
    #[error("the access token names no sandbox")]
    TokenNamesNoSandbox,
}

/// What of a request decides its route.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestShape<'a> {
    /// `Host` (or the HTTP/2 authority), with or without `:port`.
    pub host: Option<&'a str>,
    /// `E2b-Sandbox-Id`.
    pub sandbox_id: Option<&'a str>,
    /// `E2b-Sandbox-Port`.
    pub sandbox_port: Option<&'a str>,
    /// `X-Access-Token`.
    pub access_token: Option<&'a str>,
    /// The URI's path.
    pub path: &'a str,
}

/// Routes a request by its shape; `domain` is the E2B domain SPACE serves (without a port).
pub fn route(req: &RequestShape<'_>, domain: &str) -> Result<Route, RouteError> {
    if let Some((port, id)) = req.host.and_then(|h| by_host(h, domain)) {
        return Ok(to(id, port));
    }
    let (id, port) = match (req.sandbox_id, req.access_token) {
        (Some(id), _) => {
            let id: SandboxId = id.trim().parse().map_err(|_| RouteError::BadSandboxId)?;
            let port = match req.sandbox_port {
                None => ENVD_PORT,
                Some(p) => p
                    .trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or(RouteError::BadPort)?,
            };
            (id, port)
        }
        (None, Some(token)) if !is_control_path(req.path) => (
            crate::token::sandbox_of(token).ok_or(RouteError::TokenNamesNoSandbox)?,
            ENVD_PORT,
        ),
        (None, _) => return Ok(Route::Control),
    };
    if port == ENVD_PORT && is_control_path(req.path) {
        return Ok(Route::Control);
    }
    Ok(to(id, port))
}

/// A path envd never serves: the E2B REST API's sandboxes (`/sandboxes`, `/v2/sandboxes`
/// and below) and SPACE's own API.
fn is_control_path(path: &str) -> bool {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    under("/sandboxes") || under("/v2/sandboxes") || is_native_path(path)
}

/// Paths of SPACE's own API, which never go to the E2B REST API.
pub fn is_native_path(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/") || path == "/healthz" || path == "/openapi.json"
}

fn to(id: SandboxId, port: u16) -> Route {
    if port == ENVD_PORT {
        Route::Envd(id)
    } else {
        Route::Port(id, port)
    }
}

/// `{port}-{id}.{domain}[:p]` → (port, id); anything else (another domain, a bad id or
/// port, extra labels) → `None`, and the request is not host-routed.
fn by_host(host: &str, domain: &str) -> Option<(u16, SandboxId)> {
    let name = match host.rsplit_once(':') {
        Some((name, p)) if p.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let label = name
        .strip_suffix(domain)?
        .strip_suffix('.')
        .filter(|l| !l.contains('.'))?;
    let (port, id) = label.split_once('-')?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && !port.starts_with('0'))?;
    Some((port, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sbx-abcdefghij0123456789";

    fn id() -> SandboxId {
        ID.parse().unwrap()
    }

    fn shape<'a>(
        host: Option<&'a str>,
        sandbox_id: Option<&'a str>,
        sandbox_port: Option<&'a str>,
        path: &'a str,
    ) -> RequestShape<'a> {
        RequestShape {
            host,
            sandbox_id,
            sandbox_port,
            access_token: None,
            path,
        }
    }

    #[test]
    fn hosts_name_a_port_of_a_sandbox() {
        let d = "space.test";
        assert_eq!(
            route(
                &shape(Some(&format!("3000-{ID}.space.test")), None, None, "/"),
                d
            ),
            Ok(Route::Port(id(), 3000))
        );
        assert_eq!(
            route(
                &shape(
                    Some(&format!("49983-{ID}.space.test:7070")),
                    None,
                    None,
                    "/"
                ),
                d
            ),
            Ok(Route::Envd(id()))
        );
        for not_ours in [
            format!("3000-{ID}.other.test"),
            format!("x.3000-{ID}.space.test"),
            format!("0-{ID}.space.test"),
            format!("03000-{ID}.space.test"),
            format!("70000-{ID}.space.test"),
            "3000-sbx-NOTANID.space.test".to_owned(),
            "space.test".to_owned(),
            "127.0.0.1:7070".to_owned(),
        ] {
            assert_eq!(
                route(&shape(Some(&not_ours), None, None, "/"), d),
                Ok(Route::Control),
                "{not_ours}"
            );
        }
    }

    #[test]
    fn headers_name_envd_or_a_port() {
        let d = "space.test";
        let host = Some("127.0.0.1:7070");
        assert_eq!(
            route(&shape(host, Some(ID), Some("49983"), "/"), d),
            Ok(Route::Envd(id()))
        );
        assert_eq!(
            route(&shape(host, Some(ID), None, "/"), d),
            Ok(Route::Envd(id()))
        );
        assert_eq!(
            route(&shape(host, Some(ID), Some("8080"), "/"), d),
            Ok(Route::Port(id(), 8080))
        );
        assert_eq!(
            route(&shape(host, Some("nope"), None, "/"), d),
            Err(RouteError::BadSandboxId)
        );
        assert_eq!(
            route(&shape(host, Some(ID), Some("0"), "/"), d),
            Err(RouteError::BadPort)
        );
        assert_eq!(
            route(&shape(host, Some(ID), Some("http"), "/"), d),
            Err(RouteError::BadPort)
        );
        assert_eq!(route(&shape(host, None, None, "/"), d), Ok(Route::Control));
        // The sandbox headers on a REST sandboxes path naming envd are a control request
        // (Python SDK 2.9 sends its `connect` so); envd's own paths stay envd's, and on
        // another port the path is the guest server's.
        let connect = format!("/sandboxes/{ID}/connect");
        assert_eq!(
            route(&shape(host, Some(ID), None, &connect), d),
            Ok(Route::Control)
        );
        assert_eq!(
            route(&shape(host, Some(ID), Some("49983"), "/v2/sandboxes"), d),
            Ok(Route::Control)
        );
        for envd_path in [
            "/files",
            "/health",
            "/process.Process/Connect",
            "/sandboxesx",
        ] {
            assert_eq!(
                route(&shape(host, Some(ID), None, envd_path), d),
                Ok(Route::Envd(id()))
            );
        }
        assert_eq!(
            route(&shape(host, Some(ID), Some("8080"), &connect), d),
            Ok(Route::Port(id(), 8080))
        );
    }

    #[test]
    fn a_token_that_names_its_sandbox_routes_to_envd() {
        let d = "space.test";
        let token = format!("{ID}.{}", "ab".repeat(32));
        let with_token = |access_token, sandbox_id| RequestShape {
            host: Some("127.0.0.1:7070"),
            sandbox_id,
            access_token: Some(access_token),
            path: "/files",
            ..RequestShape::default()
        };
        assert_eq!(route(&with_token(&token, None), d), Ok(Route::Envd(id())));
        // The headers win over the token (envd then refuses a token of another sandbox).
        let other = SandboxId::generate();
        assert_eq!(
            route(&with_token(&token, Some(other.as_str())), d),
            Ok(Route::Envd(other.clone()))
        );
        let bare_mac = "ab".repeat(32);
        for not_a_sandbox in ["", bare_mac.as_str(), "sbx-nope.ab", "."] {
            assert_eq!(
                route(&with_token(not_a_sandbox, None), d),
                Err(RouteError::TokenNamesNoSandbox),
                "{not_a_sandbox:?}"
            );
        }
        // A token never takes a control request to envd.
        for control in ["/v2/sandboxes", "/v1/sandboxes", "/sandboxes/x/connect"] {
            let req = RequestShape {
                path: control,
                ..with_token(&token, None)
            };
            assert_eq!(route(&req, d), Ok(Route::Control), "{control}");
        }
    }

    #[test]
    fn native_paths_are_spaces_own() {
        assert!(is_native_path("/v1/sandboxes"));
        assert!(is_native_path("/healthz"));
        assert!(!is_native_path("/v1sandboxes"));
        assert!(!is_native_path("/v2/sandboxes"));
        assert!(!is_native_path("/sandboxes"));
    }
}

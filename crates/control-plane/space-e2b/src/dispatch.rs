//! Which API a request is for, decided from its `Host` and headers before any
//! authentication (envd requests carry `Authorization: Basic <user>:`, which is no API key).
//! Pure; `docs/e2b-compat.md`, section 1:
//! 1. `Host: {port}-{sandbox id}.{e2b domain}` → that port of that sandbox (envd's own port
//!    means envd);
//! 2. an `E2b-Sandbox-Id` header → envd (or a port, by `E2b-Sandbox-Port`);
//! 3. anything else → the REST APIs (E2B's or SPACE's own, by path).

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
}

/// Routes a request by its `Host` (`host`, with or without `:port`) and its
/// `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers; `domain` is the E2B domain SPACE serves
/// (without a port).
pub fn route(
    host: Option<&str>,
    sandbox_id: Option<&str>,
    sandbox_port: Option<&str>,
    domain: &str,
) -> Result<Route, RouteError> {
    if let Some((port, id)) = host.and_then(|h| by_host(h, domain)) {
        return Ok(to(id, port));
    }
    let Some(id) = sandbox_id else {
        return Ok(Route::Control);
    };
    let id: SandboxId = id.trim().parse().map_err(|_| RouteError::BadSandboxId)?;
    let port = match sandbox_port {
        None => ENVD_PORT,
        Some(p) => p
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or(RouteError::BadPort)?,
    };
    Ok(to(id, port))
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

    #[test]
    fn hosts_name_a_port_of_a_sandbox() {
        let d = "space.test";
        assert_eq!(
            route(Some(&format!("3000-{ID}.space.test")), None, None, d),
            Ok(Route::Port(id(), 3000))
        );
        assert_eq!(
            route(Some(&format!("49983-{ID}.space.test:7070")), None, None, d),
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
                route(Some(&not_ours), None, None, d),
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
            route(host, Some(ID), Some("49983"), d),
            Ok(Route::Envd(id()))
        );
        assert_eq!(route(host, Some(ID), None, d), Ok(Route::Envd(id())));
        assert_eq!(
            route(host, Some(ID), Some("8080"), d),
            Ok(Route::Port(id(), 8080))
        );
        assert_eq!(
            route(host, Some("nope"), None, d),
            Err(RouteError::BadSandboxId)
        );
        assert_eq!(
            route(host, Some(ID), Some("0"), d),
            Err(RouteError::BadPort)
        );
        assert_eq!(
            route(host, Some(ID), Some("http"), d),
            Err(RouteError::BadPort)
        );
        assert_eq!(route(host, None, None, d), Ok(Route::Control));
    }
}

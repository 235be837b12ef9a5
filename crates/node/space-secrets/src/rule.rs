//! Where a credential may be sent and how it is put into a request: host, method and path
//! patterns, the injection (a header, HTTP Basic auth or a query parameter), whether TLS is
//! required, a rate limit, whether the guest gets a placeholder, and the image registries
//! a template build may log in to with it.
//!
//! [`CredentialRule`] is the stored, serialisable form; [`CredentialRule::compile`] checks
//! every field and produces the [`CompiledRule`] the resolver matches with.

use http::header::{self, HeaderName};
use http::Method;
use serde::{Deserialize, Serialize};

use crate::egress::{DomainPattern, Hostname};
use crate::model::ValidationError;
use crate::pattern::PathPattern;

/// Most host patterns in one rule.
pub const MAX_HOSTS: usize = 32;
/// Most image registries in one rule.
pub const MAX_REGISTRIES: usize = 16;
/// Most methods in one rule.
pub const MAX_METHODS: usize = 16;
/// Longest method name.
pub const MAX_METHOD_LEN: usize = 32;
/// Most path patterns in one rule.
pub const MAX_PATHS: usize = 32;
/// Longest header name an injection may target.
pub const MAX_HEADER_NAME_LEN: usize = 64;
/// Longest header template (without the value).
pub const MAX_TEMPLATE_LEN: usize = 256;
/// Longest HTTP Basic user name.
pub const MAX_USERNAME_LEN: usize = 256;
/// Longest query parameter name.
pub const MAX_QUERY_PARAM_LEN: usize = 64;
/// Largest `requests` of a rate limit.
pub const MAX_RATE_REQUESTS: u32 = 1_000_000;
/// Longest rate-limit period (one day).
pub const MAX_RATE_PERIOD_SECS: u32 = 86_400;

/// The value's slot in a header template.
pub const TEMPLATE_SLOT: &str = "{}";

/// Methods that are refused outright whenever a credential applies: they echo the request
/// (headers included) back to the client, which would hand the injected value to the guest.
pub const REFLECTING_METHODS: [&str; 2] = ["TRACE", "TRACK"];

/// Headers an injection may never target: hop-by-hop headers (RFC 9110 §7.6.1, plus the
/// de-facto `keep-alive` and `proxy-connection`), framing headers (a value there would change
/// how the request is delimited), `host` (routing) and `expect`.
pub const FORBIDDEN_INJECTION_HEADERS: [&str; 12] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "expect",
];

fn default_true() -> bool {
    true
}

/// Where and how a credential is injected. Stored as given; see [`CredentialRule::compile`]
/// for what is checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialRule {
    /// Host patterns: `api.example.com` (that name) or `*.example.com` (names below it).
    /// May be empty for a credential that only logs in to `registries`.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Allowed methods (upper case, e.g. `GET`); `None`: any method but TRACE/TRACK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Allowed path patterns (see [`crate::pattern`]); `None`: any path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    /// How the value goes into the request.
    pub injection: Injection,
    /// Refuse to inject into cleartext HTTP (default true).
    #[serde(default = "default_true")]
    pub require_tls: bool,
    /// Per-credential request budget; `None`: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Give the guest a placeholder for this credential (see [`crate::placeholder`]).
    #[serde(default)]
    pub placeholder: bool,
    /// Image registries (`HOST[:PORT]`, as image references name them: `ghcr.io`,
    /// `10.0.0.5:5000`, `docker.io`) that template builds of the tenant pull from with this
    /// credential, as HTTP Basic auth (the injection must be `basic_auth`). The value is
    /// sent to these registries and nowhere else; no sandbox sees it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registries: Vec<String>,
}

/// How the value is put into a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Injection {
    /// A header set to `template` with `{}` replaced by the value, e.g. `Bearer {}`.
    Header {
        /// Header name (a token; not hop-by-hop, framing or `Host`).
        name: String,
        /// Header value with exactly one `{}`.
        template: String,
    },
    /// `Authorization: Basic base64(username ":" value)`.
    BasicAuth {
        /// User name (may be empty; no ':').
        username: String,
    },
    /// A query parameter `name=value` (percent-encoded), replacing any the guest sent.
    QueryParam {
        /// Parameter name (unreserved characters only).
        name: String,
    },
}

/// At most `requests` requests per `per_secs` seconds (a token bucket: bursts up to
/// `requests`, refilled continuously).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Bucket size and requests per period (1..=[`MAX_RATE_REQUESTS`]).
    pub requests: u32,
    /// Period in seconds (1..=[`MAX_RATE_PERIOD_SECS`]).
    pub per_secs: u32,
}

/// What an injection writes, used to detect two credentials writing the same place.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InjectionTarget {
    /// A header (lower-case name).
    Header(HeaderName),
    /// A query parameter.
    QueryParam(String),
}

impl std::fmt::Display for InjectionTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InjectionTarget::Header(h) => write!(f, "header {h}"),
            InjectionTarget::QueryParam(p) => write!(f, "query parameter {p}"),
        }
    }
}

/// The injection, checked and ready to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompiledInjection {
    /// `name: prefix value suffix`.
    Header {
        /// Target header.
        name: HeaderName,
        /// Template text before `{}`.
        prefix: String,
        /// Template text after `{}`.
        suffix: String,
    },
    /// `Authorization: Basic …`.
    BasicAuth {
        /// User name.
        username: String,
    },
    /// `?name=value`.
    QueryParam {
        /// Parameter name.
        name: String,
    },
}

impl CompiledInjection {
    /// Where this injection writes.
    pub fn target(&self) -> InjectionTarget {
        match self {
            CompiledInjection::Header { name, .. } => InjectionTarget::Header(name.clone()),
            CompiledInjection::BasicAuth { .. } => InjectionTarget::Header(header::AUTHORIZATION),
            CompiledInjection::QueryParam { name } => InjectionTarget::QueryParam(name.clone()),
        }
    }

    /// Whether this injection writes header `name`.
    pub fn writes_header(&self, name: &HeaderName) -> bool {
        match self {
            CompiledInjection::Header { name: target, .. } => target == name,
            CompiledInjection::BasicAuth { .. } => name == header::AUTHORIZATION,
            CompiledInjection::QueryParam { .. } => false,
        }
    }
}

/// A checked rule, ready to match requests.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    /// Host patterns.
    pub hosts: Vec<DomainPattern>,
    /// Allowed methods, if restricted.
    pub methods: Option<Vec<Method>>,
    /// Allowed paths, if restricted.
    pub paths: Option<Vec<PathPattern>>,
    /// The injection.
    pub injection: CompiledInjection,
    /// Refuse cleartext.
    pub require_tls: bool,
    /// Request budget.
    pub rate_limit: Option<RateLimit>,
    /// Placeholder mode.
    pub placeholder: bool,
}

impl CompiledRule {
    /// Whether `host` matches one of the host patterns.
    pub fn matches_host(&self, host: &Hostname) -> bool {
        self.hosts.iter().any(|p| p.matches(host))
    }

    /// Whether `method` is allowed (any method when unrestricted).
    pub fn matches_method(&self, method: &Method) -> bool {
        self.methods
            .as_ref()
            .is_none_or(|methods| methods.contains(method))
    }

    /// Whether `path` matches (any path when unrestricted). Canonical-path checking is the
    /// caller's job (see [`crate::pattern::path_problem`]).
    pub fn matches_path(&self, path: &str) -> bool {
        self.paths
            .as_ref()
            .is_none_or(|paths| paths.iter().any(|p| p.matches(path)))
    }
}

/// Whether `b` is a character a header value may contain literally (visible ASCII, space or
/// tab; no control characters, no obs-text).
pub(crate) fn header_safe_byte(b: u8) -> bool {
    b == b'\t' || (0x20..0x7f).contains(&b)
}

/// Unreserved characters of RFC 3986 (safe in a query parameter name unencoded).
pub(crate) fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

impl CredentialRule {
    /// Checks every field and returns the matching form. Errors name the field.
    pub fn compile(&self) -> Result<CompiledRule, ValidationError> {
        if self.hosts.is_empty() && self.registries.is_empty() {
            return Err(ValidationError::rule(
                "hosts",
                "at least one host pattern (or registry) is required",
            ));
        }
        if self.hosts.len() > MAX_HOSTS {
            return Err(ValidationError::rule(
                "hosts",
                format!("more than {MAX_HOSTS} patterns"),
            ));
        }
        let mut hosts = Vec::with_capacity(self.hosts.len());
        for (i, h) in self.hosts.iter().enumerate() {
            let field = || format!("hosts[{i}]");
            let pattern = DomainPattern::parse(h)
                .map_err(|e| ValidationError::rule(field(), e.to_string()))?;
            if pattern.is_wildcard() && !pattern.name().contains('.') {
                return Err(ValidationError::rule(
                    field(),
                    "a wildcard over a top-level domain would send the credential to every name under it",
                ));
            }
            hosts.push(pattern);
        }

        let methods = match &self.methods {
            None => None,
            Some(list) => {
                if list.is_empty() || list.len() > MAX_METHODS {
                    return Err(ValidationError::rule(
                        "methods",
                        format!("between 1 and {MAX_METHODS} methods, or absent for any"),
                    ));
                }
                let mut out = Vec::with_capacity(list.len());
                for (i, m) in list.iter().enumerate() {
                    let field = || format!("methods[{i}]");
                    if m.is_empty()
                        || m.len() > MAX_METHOD_LEN
                        || !m
                            .bytes()
                            .all(|b| b.is_ascii_uppercase() || b == b'-' || b == b'_')
                    {
                        return Err(ValidationError::rule(
                            field(),
                            format!(
                                "upper-case method name of at most {MAX_METHOD_LEN} characters"
                            ),
                        ));
                    }
                    if REFLECTING_METHODS.contains(&m.as_str()) {
                        return Err(ValidationError::rule(
                            field(),
                            "TRACE and TRACK are never allowed with credentials",
                        ));
                    }
                    let method = Method::from_bytes(m.as_bytes())
                        .map_err(|e| ValidationError::rule(field(), e.to_string()))?;
                    out.push(method);
                }
                Some(out)
            }
        };

        let paths = match &self.paths {
            None => None,
            Some(list) => {
                if list.is_empty() || list.len() > MAX_PATHS {
                    return Err(ValidationError::rule(
                        "paths",
                        format!("between 1 and {MAX_PATHS} patterns, or absent for any"),
                    ));
                }
                let parsed = list
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        PathPattern::parse(p)
                            .map_err(|e| ValidationError::rule(format!("paths[{i}]"), e))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Some(parsed)
            }
        };

        let injection = self.injection.compile()?;
        self.check_registries()?;

        if let Some(limit) = self.rate_limit {
            if limit.requests == 0 || limit.requests > MAX_RATE_REQUESTS {
                return Err(ValidationError::rule(
                    "rate_limit.requests",
                    format!("between 1 and {MAX_RATE_REQUESTS}"),
                ));
            }
            if limit.per_secs == 0 || limit.per_secs > MAX_RATE_PERIOD_SECS {
                return Err(ValidationError::rule(
                    "rate_limit.per_secs",
                    format!("between 1 and {MAX_RATE_PERIOD_SECS}"),
                ));
            }
        }

        Ok(CompiledRule {
            hosts,
            methods,
            paths,
            injection,
            require_tls: self.require_tls,
            rate_limit: self.rate_limit,
            placeholder: self.placeholder,
        })
    }
}

impl CredentialRule {
    fn check_registries(&self) -> Result<(), ValidationError> {
        if self.registries.len() > MAX_REGISTRIES {
            return Err(ValidationError::rule(
                "registries",
                format!("more than {MAX_REGISTRIES} registries"),
            ));
        }
        if !self.registries.is_empty() && !matches!(self.injection, Injection::BasicAuth { .. }) {
            return Err(ValidationError::rule(
                "registries",
                "a registry login is HTTP Basic auth: the injection must be basic_auth with the registry's user name",
            ));
        }
        for (i, r) in self.registries.iter().enumerate() {
            if canonical_registry(r).is_none() {
                return Err(ValidationError::rule(
                    format!("registries[{i}]"),
                    "a registry as image references name it: a host name or IP address, with an optional :PORT (e.g. ghcr.io, 10.0.0.5:5000, docker.io)",
                ));
            }
        }
        Ok(())
    }

    /// Whether a template build may log in to `registry` (as [`canonical_registry`] gives
    /// it) with this credential.
    pub fn logs_in_to(&self, registry: &str) -> bool {
        let registry = canonical_registry(registry);
        self.registries
            .iter()
            .any(|r| canonical_registry(r) == registry && registry.is_some())
    }

    /// The registry user name, for a credential that logs in to registries.
    pub fn registry_username(&self) -> Option<&str> {
        match &self.injection {
            Injection::BasicAuth { username } if !self.registries.is_empty() => Some(username),
            _ => None,
        }
    }
}

/// Longest registry name (a host name, `:`, a port).
const MAX_REGISTRY_LEN: usize = 255 + 6;

/// `registry` in one spelling: lower case, Docker Hub's aliases as `docker.io`; `None` if
/// it is not `HOST[:PORT]` (a host name of letters, digits, `-` and `.`, an IPv4 address,
/// or a bracketed IPv6 address; a port of 1 to 65535).
pub fn canonical_registry(registry: &str) -> Option<String> {
    if registry.is_empty() || registry.len() > MAX_REGISTRY_LEN {
        return None;
    }
    let lower = registry.to_ascii_lowercase();
    let (host, port) = if let Some(rest) = lower.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        addr.parse::<std::net::Ipv6Addr>().ok()?;
        (&lower[..addr.len() + 2], after.strip_prefix(':'))
    } else {
        match lower.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (lower.as_str(), None),
        }
    };
    if let Some(port) = port {
        let ok = !port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && !port.starts_with('0')
            && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
        if !ok {
            return None;
        }
    }
    if !host.starts_with('[') {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if !host.split('.').all(label_ok) {
            return None;
        }
    }
    let host = match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        h => h,
    };
    Some(match port {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

impl Injection {
    /// Checks the injection and splits a header template.
    pub fn compile(&self) -> Result<CompiledInjection, ValidationError> {
        match self {
            Injection::Header { name, template } => {
                if name.is_empty() || name.len() > MAX_HEADER_NAME_LEN {
                    return Err(ValidationError::rule(
                        "injection.name",
                        format!("1 to {MAX_HEADER_NAME_LEN} characters"),
                    ));
                }
                let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    ValidationError::rule("injection.name", "not a valid header name (token)")
                })?;
                if FORBIDDEN_INJECTION_HEADERS.contains(&header.as_str()) {
                    return Err(ValidationError::rule(
                        "injection.name",
                        format!(
                            "{} is a hop-by-hop, framing or routing header",
                            header.as_str()
                        ),
                    ));
                }
                if template.len() > MAX_TEMPLATE_LEN {
                    return Err(ValidationError::rule(
                        "injection.template",
                        format!("longer than {MAX_TEMPLATE_LEN} bytes"),
                    ));
                }
                if !template.bytes().all(header_safe_byte) {
                    return Err(ValidationError::rule(
                        "injection.template",
                        "only visible ASCII, space and tab",
                    ));
                }
                if template.matches(TEMPLATE_SLOT).count() != 1 {
                    return Err(ValidationError::rule(
                        "injection.template",
                        "must contain exactly one '{}'",
                    ));
                }
                let (prefix, suffix) = template
                    .split_once(TEMPLATE_SLOT)
                    .ok_or_else(|| ValidationError::rule("injection.template", "no '{}'"))?;
                Ok(CompiledInjection::Header {
                    name: header,
                    prefix: prefix.to_owned(),
                    suffix: suffix.to_owned(),
                })
            }
            Injection::BasicAuth { username } => {
                if username.len() > MAX_USERNAME_LEN
                    || username.contains(':')
                    || !username.bytes().all(|b| (0x20..0x7f).contains(&b))
                {
                    return Err(ValidationError::rule(
                        "injection.username",
                        format!("at most {MAX_USERNAME_LEN} printable ASCII characters, no ':'"),
                    ));
                }
                Ok(CompiledInjection::BasicAuth {
                    username: username.clone(),
                })
            }
            Injection::QueryParam { name } => {
                if name.is_empty()
                    || name.len() > MAX_QUERY_PARAM_LEN
                    || !name.bytes().all(is_unreserved)
                {
                    return Err(ValidationError::rule(
                        "injection.name",
                        format!("1 to {MAX_QUERY_PARAM_LEN} characters from A-Z a-z 0-9 - . _ ~"),
                    ));
                }
                Ok(CompiledInjection::QueryParam { name: name.clone() })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::bearer_rule;

    type Mutation = Box<dyn Fn(&mut CredentialRule)>;

    fn field_of(err: ValidationError) -> String {
        match err {
            ValidationError::Rule { field, .. } => field,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_good_rule_compiles() {
        let mut rule = bearer_rule(&["api.example.com", "*.example.org"]);
        rule.methods = Some(vec!["GET".into(), "POST".into()]);
        rule.paths = Some(vec!["/v1/**".into()]);
        rule.rate_limit = Some(RateLimit {
            requests: 10,
            per_secs: 60,
        });
        let c = rule.compile().unwrap();
        assert!(c.matches_host(&Hostname::parse("api.example.com").unwrap()));
        assert!(c.matches_host(&Hostname::parse("x.example.org").unwrap()));
        assert!(!c.matches_host(&Hostname::parse("example.com").unwrap()));
        assert!(!c.matches_host(&Hostname::parse("api.example.com.evil.net").unwrap()));
        assert!(c.matches_method(&Method::GET));
        assert!(!c.matches_method(&Method::DELETE));
        assert!(c.matches_path("/v1/chat"));
        assert!(!c.matches_path("/v2/chat"));
        assert_eq!(
            c.injection,
            CompiledInjection::Header {
                name: header::AUTHORIZATION,
                prefix: "Bearer ".into(),
                suffix: "".into()
            }
        );
    }

    #[test]
    fn rule_defaults_when_deserialised() {
        let rule: CredentialRule = serde_json::from_str(
            r#"{"hosts":["api.example.com"],"injection":{"kind":"basic_auth","username":"u"}}"#,
        )
        .unwrap();
        assert!(rule.require_tls);
        assert!(!rule.placeholder);
        assert_eq!(rule.methods, None);
        assert!(serde_json::from_str::<CredentialRule>(
            r#"{"hosts":["a.com"],"injection":{"kind":"basic_auth","username":"u"},"extra":1}"#
        )
        .is_err());
    }

    #[test]
    fn bad_rules_name_the_field() {
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|r| r.hosts.clear()), "hosts"),
            (
                Box::new(|r| r.hosts = vec!["exa mple.com".into()]),
                "hosts[0]",
            ),
            (
                Box::new(|r| r.hosts = vec!["a.com".into(), "*.com".into()]),
                "hosts[1]",
            ),
            (
                Box::new(|r| r.hosts = vec!["a.com".to_string(); MAX_HOSTS + 1]),
                "hosts",
            ),
            (Box::new(|r| r.methods = Some(vec![])), "methods"),
            (
                Box::new(|r| r.methods = Some(vec!["get".into()])),
                "methods[0]",
            ),
            (
                Box::new(|r| r.methods = Some(vec!["GET".into(), "TRACE".into()])),
                "methods[1]",
            ),
            (
                Box::new(|r| r.methods = Some(vec!["TRACK".into()])),
                "methods[0]",
            ),
            (Box::new(|r| r.paths = Some(vec!["v1".into()])), "paths[0]"),
            (
                Box::new(|r| {
                    r.rate_limit = Some(RateLimit {
                        requests: 0,
                        per_secs: 1,
                    })
                }),
                "rate_limit.requests",
            ),
            (
                Box::new(|r| {
                    r.rate_limit = Some(RateLimit {
                        requests: 1,
                        per_secs: MAX_RATE_PERIOD_SECS + 1,
                    })
                }),
                "rate_limit.per_secs",
            ),
        ];
        for (mutate, field) in cases {
            let mut rule = bearer_rule(&["api.example.com"]);
            mutate(&mut rule);
            assert_eq!(field_of(rule.compile().unwrap_err()), field);
        }
    }

    #[test]
    fn header_injections_are_checked() {
        let header = |name: &str, template: &str| Injection::Header {
            name: name.into(),
            template: template.into(),
        };
        assert!(header("X-Api-Key", "{}").compile().is_ok());
        assert!(header("x-goog-api-key", "key={};").compile().is_ok());
        for bad_name in [
            "",
            "Bad Header",
            "Host",
            "Connection",
            "Transfer-Encoding",
            "Content-Length",
            "Proxy-Authorization",
            "TE",
            "Upgrade",
            "X:Y",
        ] {
            let err = header(bad_name, "{}").compile().unwrap_err();
            assert_eq!(field_of(err), "injection.name", "{bad_name}");
        }
        for bad_template in [
            "Bearer",
            "{} {}",
            "Bearer {}\r\nX-Evil: 1",
            "Bearer {}\0",
            "Bé {}",
        ] {
            let err = header("Authorization", bad_template).compile().unwrap_err();
            assert_eq!(field_of(err), "injection.template", "{bad_template:?}");
        }
        let long = format!("{}{{}}", "a".repeat(MAX_TEMPLATE_LEN));
        assert!(header("Authorization", &long).compile().is_err());
    }

    #[test]
    fn basic_and_query_injections_are_checked() {
        let basic = |u: &str| Injection::BasicAuth { username: u.into() };
        assert!(basic("").compile().is_ok());
        assert!(basic("user").compile().is_ok());
        assert!(basic("a:b").compile().is_err());
        assert!(basic("a\nb").compile().is_err());
        let query = |n: &str| Injection::QueryParam { name: n.into() };
        assert!(query("api_key").compile().is_ok());
        assert!(query("").compile().is_err());
        assert!(query("a&b").compile().is_err());
        assert!(query("a=b").compile().is_err());
        assert_eq!(
            basic("u").compile().unwrap().target(),
            InjectionTarget::Header(header::AUTHORIZATION)
        );
    }

    #[test]
    fn registries_are_spelled_as_image_references_name_them() {
        for (given, canonical) in [
            ("ghcr.io", "ghcr.io"),
            ("GHCR.io", "ghcr.io"),
            ("10.0.0.5:5000", "10.0.0.5:5000"),
            ("localhost:5000", "localhost:5000"),
            ("[::1]:5000", "[::1]:5000"),
            ("index.docker.io", "docker.io"),
            ("registry-1.docker.io", "docker.io"),
        ] {
            assert_eq!(
                canonical_registry(given).as_deref(),
                Some(canonical),
                "{given}"
            );
        }
        for bad in [
            "",
            "https://ghcr.io",
            "ghcr.io/team",
            "ghcr.io:",
            "ghcr.io:0",
            "ghcr.io:65536",
            "ghcr.io:050",
            "-x.io",
            "a..b",
            "[::1",
            "[zz]:1",
            "user@ghcr.io",
        ] {
            assert_eq!(canonical_registry(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_registry_credential_is_basic_auth_and_needs_no_hosts() {
        let mut rule = bearer_rule(&[]);
        rule.registries = vec!["ghcr.io".into()];
        assert_eq!(field_of(rule.compile().unwrap_err()), "registries");
        rule.injection = Injection::BasicAuth {
            username: "bot".into(),
        };
        let compiled = rule.compile().expect("a registry-only credential");
        assert!(compiled.hosts.is_empty(), "it is injected nowhere");
        assert!(rule.logs_in_to("GHCR.IO") && !rule.logs_in_to("ghcr.io:443"));
        assert_eq!(rule.registry_username(), Some("bot"));
        rule.registries = vec!["ghcr.io/x".into()];
        assert_eq!(field_of(rule.compile().unwrap_err()), "registries[0]");
        rule.registries = vec!["r.io".into(); MAX_REGISTRIES + 1];
        assert_eq!(field_of(rule.compile().unwrap_err()), "registries");
        rule.registries.clear();
        assert_eq!(field_of(rule.compile().unwrap_err()), "hosts");
    }
}

//! Request targets: a route plus a properly encoded query string.
//!
//! Guest paths may hold spaces, `&`, `#`, `+`, `%` and any Unicode. Every byte outside the
//! RFC 3986 unreserved set is percent-encoded and a space becomes `%20`, never `+`, so the
//! guest reads the same string whether it decodes the query as a form
//! (`application/x-www-form-urlencoded`, as axum's `Query` does) or as plain percent-encoding.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but ALPHA / DIGIT / "-" / "." / "_" / "~".
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Builds `route?k=v&k=v`.
#[derive(Debug, Clone)]
pub struct Target {
    s: String,
    has_query: bool,
}

impl Target {
    /// A target for `route` (a constant from `space_guest_proto::routes`).
    pub fn new(route: impl Into<String>) -> Self {
        Self {
            s: route.into(),
            has_query: false,
        }
    }

    /// A target whose path and query are already encoded (a request being relayed).
    pub(crate) fn encoded(path_and_query: impl Into<String>) -> Self {
        let s = path_and_query.into();
        let has_query = s.contains('?');
        Self { s, has_query }
    }

    /// Adds `key=value`, value encoded.
    pub fn param(mut self, key: &str, value: &str) -> Self {
        self.s.push(if self.has_query { '&' } else { '?' });
        self.has_query = true;
        self.s.extend(utf8_percent_encode(key, QUERY_VALUE));
        self.s.push('=');
        self.s.extend(utf8_percent_encode(value, QUERY_VALUE));
        self
    }

    /// Adds `key=value` when `value` is set.
    pub fn opt_param(self, key: &str, value: Option<&str>) -> Self {
        match value {
            Some(v) => self.param(key, v),
            None => self,
        }
    }

    /// The path and query.
    pub fn as_str(&self) -> &str {
        &self.s
    }

    /// The absolute URI HTTP/2 needs (`:scheme` and `:authority` are required).
    pub fn uri(&self) -> String {
        format!("http://spaced{}", self.s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_form(query: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect()
    }

    #[test]
    fn hostile_paths_round_trip_through_a_form_decoder() {
        let nasty = "/home/user/a b&c=d#e+f%20g?h/é/日本/\u{1F600}/;,'\"<>\\";
        let t = Target::new("/v1/files")
            .param("path", nasty)
            .param("user", "user")
            .param("recursive", "true");
        let s = t.as_str();
        let (route, query) = s.split_once('?').unwrap();
        assert_eq!(route, "/v1/files");
        assert!(!query.contains('+') && !query.contains(' ') && !query.contains('#'));
        assert_eq!(
            decode_form(query),
            vec![
                ("path".into(), nasty.into()),
                ("user".into(), "user".into()),
                ("recursive".into(), "true".into())
            ]
        );
        // Plain percent-decoding agrees with the form decoding.
        let value = query
            .split('&')
            .next()
            .unwrap()
            .strip_prefix("path=")
            .unwrap();
        assert_eq!(
            percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .unwrap(),
            nasty
        );
        assert!(t.uri().parse::<http::Uri>().is_ok());
    }

    #[test]
    fn optional_params() {
        let t = Target::new("/v1/files/stat")
            .param("path", "x")
            .opt_param("user", None);
        assert_eq!(t.as_str(), "/v1/files/stat?path=x");
        let t = Target::new("/v1/x").opt_param("a", Some("1"));
        assert_eq!(t.as_str(), "/v1/x?a=1");
    }
}

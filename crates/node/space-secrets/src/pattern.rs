//! Path patterns of credential rules, and the canonical-path check that makes them safe to
//! match against paths a hostile guest wrote.
//!
//! A tiny glob, matched segment by segment against the request's path as sent (still
//! percent-encoded, without the query):
//! - a pattern starts with `/` and is split at `/` into segments;
//! - `*` inside a segment matches any run of characters within that one segment (never `/`);
//! - a segment that is exactly `**` matches any number of whole segments, none included;
//! - every other character matches itself (case-sensitive).
//!
//! So `/v1/*/messages` matches `/v1/abc/messages`, and `/repos/**` matches `/repos`,
//! `/repos/` and `/repos/a/b/c`.
//!
//! Servers normalise paths before routing (`/v1/../admin` is `/admin`), so a credential
//! restricted to `/v1/**` could be steered elsewhere by dot segments. [`path_problem`] names
//! the forms we refuse to match at all: dot segments (also percent-encoded), empty segments,
//! encoded slashes or backslashes, and control characters. The resolver denies a request that
//! has one of them whenever a path-restricted credential would otherwise apply.

/// Longest path pattern.
pub const MAX_PATH_PATTERN_LEN: usize = 256;
/// Most segments in a path pattern.
pub const MAX_PATH_PATTERN_SEGMENTS: usize = 32;
/// Most segments of a request path considered for matching; longer paths never match.
pub const MAX_MATCHED_PATH_SEGMENTS: usize = 256;

/// A parsed path pattern (see the module doc for the syntax).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// `**`: any number of whole segments.
    AnyDepth,
    /// Literal characters and `*`.
    Glob(String),
}

impl PathPattern {
    /// Parses a pattern. The error says what is wrong.
    pub fn parse(s: &str) -> Result<PathPattern, String> {
        if s.len() > MAX_PATH_PATTERN_LEN {
            return Err(format!("longer than {MAX_PATH_PATTERN_LEN} bytes"));
        }
        let Some(rest) = s.strip_prefix('/') else {
            return Err("must start with '/'".into());
        };
        if let Some(bad) = s
            .chars()
            .find(|c| !c.is_ascii_graphic() || matches!(c, '?' | '#' | '\\'))
        {
            return Err(format!(
                "character {bad:?} not allowed (printable ASCII, no '?', '#' or '\\')"
            ));
        }
        let mut segments = Vec::new();
        for seg in rest.split('/') {
            if seg.contains("**") && seg != "**" {
                return Err("'**' must be a whole segment".into());
            }
            if seg == "." || seg == ".." {
                return Err("dot segments are not allowed".into());
            }
            segments.push(if seg == "**" {
                Segment::AnyDepth
            } else {
                Segment::Glob(seg.to_owned())
            });
        }
        if segments.len() > MAX_PATH_PATTERN_SEGMENTS {
            return Err(format!("more than {MAX_PATH_PATTERN_SEGMENTS} segments"));
        }
        Ok(PathPattern { segments })
    }

    /// Whether `path` (starting with `/`, no query) matches. Run [`path_problem`] first: this
    /// function matches text and knows nothing of normalisation.
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() > MAX_MATCHED_PATH_SEGMENTS {
            return false;
        }
        // reach[j]: the pattern prefix handled so far can consume exactly parts[..j].
        // O(pattern segments × path segments), no backtracking.
        let mut reach = vec![false; parts.len() + 1];
        reach[0] = true;
        for seg in &self.segments {
            let mut next = vec![false; parts.len() + 1];
            match seg {
                Segment::AnyDepth => {
                    let mut any = false;
                    for j in 0..=parts.len() {
                        any |= reach[j];
                        next[j] = any;
                    }
                }
                Segment::Glob(glob) => {
                    for j in 0..parts.len() {
                        if reach[j] && glob_matches(glob, parts[j]) {
                            next[j + 1] = true;
                        }
                    }
                }
            }
            reach = next;
        }
        reach[parts.len()]
    }
}

/// `*`-only wildcard match of one segment, linear with one backtrack point.
fn glob_matches(glob: &str, text: &str) -> bool {
    let (g, t) = (glob.as_bytes(), text.as_bytes());
    let (mut gi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if gi < g.len() && g[gi] == b'*' {
            star = Some((gi, ti));
            gi += 1;
        } else if gi < g.len() && g[gi] == t[ti] {
            gi += 1;
            ti += 1;
        } else if let Some((sg, st)) = star {
            gi = sg + 1;
            ti = st + 1;
            star = Some((sg, st + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&b| b == b'*')
}

/// Why a request path cannot be matched against path patterns safely, or `None` when it is
/// canonical: starts with `/`; no `.`/`..` segment (percent-encoded dots included); no empty
/// segment except a trailing slash; no `\`, `%2f`, `%5c` or `%00`; no control characters.
pub fn path_problem(path: &str) -> Option<&'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Some("path does not start with '/'");
    };
    if path.bytes().any(|b| b.is_ascii_control() || b == b'\\') {
        return Some("path contains a control character or a backslash");
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") || lower.contains("%00") {
        return Some("path contains an encoded slash, backslash or NUL");
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        if seg.is_empty() && i != last {
            return Some("path contains an empty segment ('//')");
        }
        let decoded = seg.to_ascii_lowercase().replace("%2e", ".");
        if decoded == "." || decoded == ".." {
            return Some("path contains a dot segment");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        PathPattern::parse(pattern).unwrap().matches(path)
    }

    #[test]
    fn literal_and_star() {
        assert!(m("/v1/models", "/v1/models"));
        assert!(!m("/v1/models", "/v1/models/x"));
        assert!(!m("/v1/models", "/v1/Models"));
        assert!(m("/v1/*/messages", "/v1/abc/messages"));
        assert!(!m("/v1/*/messages", "/v1/a/b/messages"));
        assert!(m("/v1/chat*", "/v1/chat"));
        assert!(m("/v1/chat*", "/v1/chat.completions"));
        assert!(m("/v1/*.json", "/v1/a.b.json"));
        assert!(!m("/v1/*.json", "/v1/a.jso"));
        assert!(m("/", "/"));
        assert!(!m("/", "/a"));
    }

    #[test]
    fn double_star() {
        assert!(m("/repos/**", "/repos"));
        assert!(m("/repos/**", "/repos/"));
        assert!(m("/repos/**", "/repos/a/b/c"));
        assert!(!m("/repos/**", "/reposx"));
        assert!(m("/**/issues", "/a/b/issues"));
        assert!(m("/**/issues", "/issues"));
        assert!(m("/a/**/b/**/c", "/a/x/b/y/z/c"));
        assert!(!m("/a/**/b/**/c", "/a/x/y/z/c"));
        assert!(m("/**", "/anything/at/all"));
    }

    #[test]
    fn bad_patterns() {
        for bad in [
            "v1",
            "/v1/**x",
            "/v1/../x",
            "/v1?x=1",
            "/a b",
            "/a\\b",
            &format!("/{}", "a".repeat(MAX_PATH_PATTERN_LEN)),
            &"/a".repeat(MAX_PATH_PATTERN_SEGMENTS + 1),
        ] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn non_canonical_paths_are_named() {
        assert_eq!(path_problem("/v1/models/"), None);
        assert_eq!(path_problem("/"), None);
        assert_eq!(path_problem("/v1/a%20b"), None);
        for bad in [
            "v1",
            "/v1/../admin",
            "/v1/./x",
            "/v1/%2e%2e/admin",
            "/v1/%2E./admin",
            "/v1//x",
            "/v1%2fadmin",
            "/v1\\admin",
            "/v1/%00",
            "/v1/\u{7f}",
            "/..",
        ] {
            assert!(path_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn long_paths_do_not_match_and_do_not_blow_up() {
        let pattern = PathPattern::parse("/**/*a*/**/*b*/**").unwrap();
        let path = "/a".repeat(MAX_MATCHED_PATH_SEGMENTS - 1) + "/b";
        assert!(pattern.matches(&path));
        let too_long = "/a".repeat(MAX_MATCHED_PATH_SEGMENTS + 1);
        assert!(!pattern.matches(&too_long));
    }
}

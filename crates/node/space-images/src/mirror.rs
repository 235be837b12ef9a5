//! The default Debian mirror for debootstrap: the host's own apt source for the suite.

use std::path::Path;

/// Used when the host's apt sources name no http mirror for the suite.
pub const FALLBACK_MIRROR: &str = "http://deb.debian.org/debian";

/// The first `http://` URI of a `deb` source for `suite` in one-line (`sources.list`) text.
pub fn from_one_line(text: &str, suite: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace().peekable();
        if words.next() != Some("deb") {
            return None;
        }
        // Options: "[arch=amd64 signed-by=…]", possibly spanning words.
        if words.peek().is_some_and(|w| w.starts_with('[')) {
            for w in words.by_ref() {
                if w.ends_with(']') {
                    break;
                }
            }
        }
        let uri = words.next()?;
        let s = words.next()?;
        (s == suite && uri.starts_with("http://")).then(|| uri.trim_end_matches('/').to_owned())
    })
}

/// The first `http://` URI of a `deb` source for `suite` in deb822 (`*.sources`) text.
pub fn from_deb822(text: &str, suite: &str) -> Option<String> {
    text.split("\n\n").find_map(|para| {
        let mut types = "";
        let mut uris = "";
        let mut suites = "";
        let mut enabled = true;
        for line in para.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            match k.trim().to_ascii_lowercase().as_str() {
                "types" => types = v.trim(),
                "uris" => uris = v.trim(),
                "suites" => suites = v.trim(),
                "enabled" => enabled = v.trim() != "no",
                _ => {}
            }
        }
        if !enabled
            || !types.split_whitespace().any(|t| t == "deb")
            || !suites.split_whitespace().any(|s| s == suite)
        {
            return None;
        }
        uris.split_whitespace()
            .find(|u| u.starts_with("http://"))
            .map(|u| u.trim_end_matches('/').to_owned())
    })
}

/// The host's mirror for `suite`: `/etc/apt/sources.list`, then `/etc/apt/sources.list.d/*.list`
/// and `*.sources` in name order; [`FALLBACK_MIRROR`] if none names one.
pub fn default_mirror(apt_dir: &Path, suite: &str) -> String {
    if let Ok(text) = std::fs::read_to_string(apt_dir.join("sources.list")) {
        if let Some(m) = from_one_line(&text, suite) {
            return m;
        }
    }
    let mut files: Vec<_> = std::fs::read_dir(apt_dir.join("sources.list.d"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let found = match f.extension().and_then(|e| e.to_str()) {
            Some("list") => from_one_line(&text, suite),
            Some("sources") => from_deb822(&text, suite),
            _ => None,
        };
        if let Some(m) = found {
            return m;
        }
    }
    FALLBACK_MIRROR.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_format() {
        let text = "# comment\ndeb https://secure.example/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n";
        assert_eq!(
            from_one_line(text, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            from_one_line("deb http://m/debian bookworm-updates main", "bookworm"),
            None
        );
        assert_eq!(
            from_one_line("deb-src http://m/debian bookworm main", "bookworm"),
            None
        );
    }

    #[test]
    fn deb822_format() {
        let text = "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://deb.example/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            from_deb822(text, "bookworm").as_deref(),
            Some("http://deb.example/debian")
        );
        assert_eq!(from_deb822(text, "trixie"), None);
        assert_eq!(
            from_deb822(
                "Types: deb\nEnabled: no\nURIs: http://x/\nSuites: bookworm\n",
                "bookworm"
            ),
            None
        );
    }
}

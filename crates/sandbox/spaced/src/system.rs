//! Machine-wide settings the node configures: hostname, wall clock, `/etc/hosts`.

use std::io::{self, Read, Write};

/// Largest `/etc/hosts` we look at.
const MAX_HOSTS_BYTES: u64 = 1024 * 1024;

/// A hostname the kernel and resolvers accept: 1-64 bytes of letters, digits, `-` and `.`.
pub fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// Sets the kernel hostname (of this UTS namespace).
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: name is valid for name.len() bytes.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the wall clock.
pub fn set_clock(unix_ms: i64) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: unix_ms.div_euclid(1000) as libc::time_t,
        tv_nsec: (unix_ms.rem_euclid(1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: ts is a valid timespec.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `/etc/hosts` text already maps `name`.
pub fn hosts_has(text: &str, name: &str) -> bool {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .any(|l| l.split_whitespace().skip(1).any(|h| h == name))
}

/// Appends `127.0.1.1 name` to `/etc/hosts` unless the name is already there, so programs
/// that resolve their own hostname (sudo, many servers) do not stall or warn.
pub fn ensure_hosts_entry(name: &str) -> io::Result<()> {
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open("/etc/hosts") {
        f.take(MAX_HOSTS_BYTES).read_to_string(&mut text)?;
    }
    if hosts_has(&text, name) {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open("/etc/hosts")?;
    let sep = if text.is_empty() || text.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    writeln!(f, "{sep}127.0.1.1\t{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostname_rules() {
        assert!(valid_hostname("sbx-abc.local"));
        assert!(!valid_hostname(""));
        assert!(!valid_hostname("-x"));
        assert!(!valid_hostname("a b"));
        assert!(!valid_hostname(&"a".repeat(65)));
    }

    #[test]
    fn finds_hosts_entries() {
        let t = "127.0.0.1 localhost\n# 127.0.1.1 box\n127.0.1.1\tother box2 # c\n";
        assert!(hosts_has(t, "localhost"));
        assert!(hosts_has(t, "box2"));
        assert!(!hosts_has(t, "box"));
        assert!(!hosts_has(t, "127.0.0.1"));
    }
}

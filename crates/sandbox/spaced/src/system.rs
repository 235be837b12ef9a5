//! Machine-wide settings the node configures: hostname, wall clock, `/etc/hosts`, and the
//! kernel RNG (reseeded with host entropy after a snapshot restore or fork).

use std::io::{self, Read};
use std::os::fd::AsRawFd;

/// Largest `/etc/hosts` we look at.
const MAX_HOSTS_BYTES: u64 = 1024 * 1024;

/// Sets the kernel hostname (of this UTS namespace).
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: name is valid for name.len() bytes.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the hostname and maps it in `/etc/hosts` (best effort: a failure there is only
/// logged). Blocking: `/etc/hosts` is on the root disk, which may be frozen.
pub fn apply_hostname(name: &str) -> io::Result<()> {
    // One at a time, so the kernel's name and the file agree: a restore and a configure
    // can both set it, and two truncating writes of `/etc/hosts` that interleave leave the
    // longer one's tail behind (a second hostname line).
    static APPLYING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = APPLYING.lock().unwrap_or_else(|p| p.into_inner());
    set_hostname(name)?;
    if let Err(e) = ensure_hosts_entry(name) {
        tracing::warn!(error = %e, "cannot add hostname to /etc/hosts");
    }
    Ok(())
}

// RNDADDENTROPY is _IOW('R', 0x03, int[2]): the size covers the header of
// `struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }`.
nix::ioctl_write_ptr!(rnd_add_entropy, b'R', 0x03, [libc::c_int; 2]);
nix::ioctl_none!(rnd_reseed_crng, b'R', 0x07);

/// Mixes `entropy` into the kernel RNG, credited at 8 bits a byte (RNDADDENTROPY), then
/// makes the RNG reseed from it now (RNDRESEEDCRNG), so a restored or forked guest stops
/// producing the same random bytes as its siblings. Needs CAP_SYS_ADMIN.
pub fn reseed_rng(entropy: &[u8]) -> io::Result<()> {
    let len = libc::c_int::try_from(entropy.len())
        .ok()
        .filter(|l| l.checked_mul(8).is_some())
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    // rand_pool_info as u32 words: entropy_count, buf_size, then the bytes (padded).
    let mut info = vec![0u32; 2 + entropy.len().div_ceil(4)];
    info[0] = (len * 8) as u32;
    info[1] = len as u32;
    for (i, chunk) in entropy.chunks(4).enumerate() {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        info[2 + i] = u32::from_ne_bytes(word);
    }
    let random = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/random")?;
    // SAFETY: `info` is a complete rand_pool_info whose buf holds buf_size bytes.
    unsafe { rnd_add_entropy(random.as_raw_fd(), info.as_ptr().cast()) }
        .map_err(io::Error::from)?;
    // SAFETY: RNDRESEEDCRNG takes no argument.
    unsafe { rnd_reseed_crng(random.as_raw_fd()) }.map_err(io::Error::from)?;
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

/// Marks the `/etc/hosts` line this daemon owns, so a new hostname (after a fork or a
/// pool claim) replaces the old one instead of adding a line per name ever used.
const HOSTS_MARKER: &str = "# space hostname";

/// `/etc/hosts` text with `name` mapped to 127.0.1.1 on the line we own (replaced, or
/// appended), or `None` when the name is mapped already. Lines the user wrote stay as they are.
pub fn hosts_with_hostname(text: &str, name: &str) -> Option<String> {
    if hosts_has(text, name) {
        return None;
    }
    let ours = format!("127.0.1.1\t{name}\t{HOSTS_MARKER}");
    let mut out = String::with_capacity(text.len() + ours.len() + 1);
    let mut replaced = false;
    for line in text.lines() {
        if !replaced && line.trim_end().ends_with(HOSTS_MARKER) {
            out.push_str(&ours);
            replaced = true;
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if !replaced {
        out.push_str(&ours);
        out.push('\n');
    }
    Some(out)
}

/// Maps `name` in `/etc/hosts` (see [`hosts_with_hostname`]), so programs that resolve
/// their own hostname (sudo, many servers) do not stall or warn.
pub fn ensure_hosts_entry(name: &str) -> io::Result<()> {
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open("/etc/hosts") {
        f.take(MAX_HOSTS_BYTES).read_to_string(&mut text)?;
    }
    match hosts_with_hostname(&text, name) {
        Some(new) => std::fs::write("/etc/hosts", new),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hosts_entries() {
        let t = "127.0.0.1 localhost\n# 127.0.1.1 box\n127.0.1.1\tother box2 # c\n";
        assert!(hosts_has(t, "localhost"));
        assert!(hosts_has(t, "box2"));
        assert!(!hosts_has(t, "box"));
        assert!(!hosts_has(t, "127.0.0.1"));
    }

    #[test]
    fn hostname_line_is_replaced_not_accumulated() {
        let t = "127.0.0.1 localhost\n127.0.1.1 mine # user's own\n";
        assert_eq!(hosts_with_hostname(t, "localhost"), None);
        let one = hosts_with_hostname(t, "pool-a").expect("added");
        assert_eq!(
            one,
            "127.0.0.1 localhost\n127.0.1.1 mine # user's own\n127.0.1.1\tpool-a\t# space hostname\n"
        );
        let two = hosts_with_hostname(&one, "sbx-b").expect("replaced");
        assert_eq!(
            two,
            "127.0.0.1 localhost\n127.0.1.1 mine # user's own\n127.0.1.1\tsbx-b\t# space hostname\n"
        );
        assert_eq!(hosts_with_hostname(&two, "sbx-b"), None);
        assert_eq!(
            hosts_with_hostname("", "x-1").as_deref(),
            Some("127.0.1.1\tx-1\t# space hostname\n")
        );
    }
}

//! Reading what we need from pidfiles and /proc: bounded reads plus pure parsers, so the
//! "is this pid really our QEMU?" decision can be tested without processes.

use std::io::{self, Read};
use std::path::Path;

/// Upper bound for /proc/<pid>/cmdline; QEMU command lines are a few KiB.
const MAX_CMDLINE_BYTES: u64 = 256 * 1024;

/// Reads at most `max` bytes of a file.
pub(crate) fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)?.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The pid in a QEMU pidfile ("1234\n").
pub(crate) fn parse_pidfile(contents: &[u8]) -> Option<u32> {
    let pid: u32 = std::str::from_utf8(contents).ok()?.trim().parse().ok()?;
    (pid > 0).then_some(pid)
}

/// Reads and parses a pidfile.
pub(crate) fn read_pidfile(path: &Path) -> io::Result<u32> {
    let contents = read_bounded(path, 64)?;
    parse_pidfile(&contents).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} does not hold a pid", path.display()),
        )
    })
}

/// Why a process's command line is not that of our QEMU for a given VM name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CmdlineMismatch {
    /// Kernel threads and zombies have an empty cmdline.
    Empty,
    NotQemu(String),
    NoName,
    OtherName(String),
}

impl std::fmt::Display for CmdlineMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CmdlineMismatch::Empty => {
                f.write_str("process has no command line (zombie or kernel thread)")
            }
            CmdlineMismatch::NotQemu(argv0) => write!(f, "process is {argv0:?}, not qemu-system-*"),
            CmdlineMismatch::NoName => f.write_str("QEMU command line has no -name"),
            CmdlineMismatch::OtherName(other) => write!(f, "QEMU runs VM {other:?}"),
        }
    }
}

/// Checks a raw /proc/<pid>/cmdline (NUL-separated) is `qemu-system-*` with `-name <name>,…`.
pub(crate) fn check_cmdline(raw: &[u8], name: &str) -> Result<(), CmdlineMismatch> {
    let args: Vec<&[u8]> = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
    let Some(argv0) = args.first() else {
        return Err(CmdlineMismatch::Empty);
    };
    let argv0 = String::from_utf8_lossy(argv0);
    let base = argv0.rsplit('/').next().unwrap_or(&argv0);
    if !base.starts_with("qemu-system-") {
        return Err(CmdlineMismatch::NotQemu(argv0.into_owned()));
    }
    let value = args
        .windows(2)
        .find(|w| w[0] == b"-name")
        .map(|w| String::from_utf8_lossy(w[1]))
        .ok_or(CmdlineMismatch::NoName)?;
    let found = name_from_name_option(&value);
    if found == name {
        Ok(())
    } else {
        Err(CmdlineMismatch::OtherName(found.to_owned()))
    }
}

/// The guest name in a `-name` value: `NAME,opt=…` or `guest=NAME,opt=…`.
fn name_from_name_option(value: &str) -> &str {
    for (i, part) in value.split(',').enumerate() {
        if let Some(n) = part.strip_prefix("guest=") {
            return n;
        }
        if i == 0 && !part.contains('=') {
            return part;
        }
    }
    ""
}

/// Reads /proc/<pid>/cmdline and checks it (see [`check_cmdline`]).
pub(crate) fn verify_our_qemu(pid: u32, name: &str) -> io::Result<Result<(), CmdlineMismatch>> {
    let raw = read_bounded(
        Path::new(&format!("/proc/{pid}/cmdline")),
        MAX_CMDLINE_BYTES,
    )?;
    Ok(check_cmdline(&raw, name))
}

/// VmRSS from the text of /proc/<pid>/status, in bytes.
pub(crate) fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut fields = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        _ => None,
    }
}

/// Resident set size of a live process.
pub(crate) fn rss_bytes(pid: u32) -> Option<u64> {
    let raw = read_bounded(Path::new(&format!("/proc/{pid}/status")), 64 * 1024).ok()?;
    parse_vm_rss(&String::from_utf8_lossy(&raw))
}

/// True when /proc/<pid> exists and is not a zombie (used only without pidfd support).
pub(crate) fn is_alive(pid: u32) -> bool {
    match read_bounded(Path::new(&format!("/proc/{pid}/stat")), 4096) {
        // Format: "pid (comm) S …"; comm may contain spaces and parens, so use the last ')'.
        Ok(stat) => match stat.iter().rposition(|&b| b == b')') {
            Some(i) => !matches!(stat.get(i + 2), Some(b'Z') | Some(b'X')),
            None => false,
        },
        Err(_) => false,
    }
}

/// Pids of every live QEMU of ours started for VM `name` (by its command line), however
/// it was started: used to find a VMM whose pidfile or control socket is not there yet.
pub(crate) fn our_qemus(name: &str, run_root: &Path) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            matches!(verify_our_qemu(pid, name), Ok(Ok(())))
                && started_under(pid, run_root)
                && is_alive(pid)
        })
        .collect()
}

/// Whether live QEMU `pid`'s run-dir marker lies under `run_root`.
pub(crate) fn started_under(pid: u32, run_root: &Path) -> bool {
    let Ok(raw) = read_bounded(
        Path::new(&format!("/proc/{pid}/cmdline")),
        MAX_CMDLINE_BYTES,
    ) else {
        return false;
    };
    let prefix = run_dir_marker_prefix(run_root);
    let args: Vec<&[u8]> = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
    args.windows(2)
        .any(|w| w[0] == b"-object" && run_dir_under(w[1], &prefix))
}

/// Names (`-name`) of every live QEMU whose pidfile lies under `run_root`: all the VMs a
/// node with that run directory ever started, adoptable or not.
pub(crate) fn qemu_names_under(run_root: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let marker_prefix = run_dir_marker_prefix(run_root);
    let mut names = Vec::new();
    for pid in dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Ok(raw) = read_bounded(Path::new(&format!("/proc/{pid}/cmdline")), 64 * 1024) else {
            continue;
        };
        let args: Vec<&[u8]> = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
        let is_qemu = args.first().is_some_and(|a| {
            let a = String::from_utf8_lossy(a);
            a.rsplit('/')
                .next()
                .unwrap_or(&a)
                .starts_with("qemu-system-")
        });
        let under = args
            .windows(2)
            .any(|w| w[0] == b"-object" && run_dir_under(w[1], &marker_prefix));
        if !is_qemu || !under {
            continue;
        }
        if let Some(w) = args.windows(2).find(|w| w[0] == b"-name") {
            let value = String::from_utf8_lossy(w[1]);
            let name = name_from_name_option(&value);
            if !name.is_empty() && is_alive(pid) {
                names.push(name.to_owned());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// `secret,id=<marker>,data=<run_root>/` as it appears on the command line (commas doubled).
fn run_dir_marker_prefix(run_root: &Path) -> Vec<u8> {
    let mut prefix = format!("secret,id={},data=", crate::qemu_args::RUN_DIR_MARKER).into_bytes();
    for &b in run_root.as_os_str().as_encoded_bytes() {
        prefix.push(b);
        if b == b',' {
            prefix.push(b',');
        }
    }
    prefix.push(b'/');
    prefix
}

/// True when an `-object` value is the run-dir marker of a run directory under the root
/// `prefix` names.
fn run_dir_under(value: &[u8], prefix: &[u8]) -> bool {
    value.starts_with(prefix) && value.len() > prefix.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_dir_marker_matches_only_below_the_root() {
        let prefix = run_dir_marker_prefix(Path::new("/data/run"));
        assert!(run_dir_under(
            b"secret,id=space-run-dir,data=/data/run/sbx-1",
            &prefix
        ));
        assert!(!run_dir_under(
            b"secret,id=space-run-dir,data=/data/run2/sbx-1",
            &prefix
        ));
        assert!(!run_dir_under(
            b"secret,id=space-run-dir,data=/data/run/",
            &prefix
        ));
        let comma = run_dir_marker_prefix(Path::new("/a,b"));
        assert!(run_dir_under(
            b"secret,id=space-run-dir,data=/a,,b/x",
            &comma
        ));
    }

    fn raw(args: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for a in args {
            v.extend_from_slice(a.as_bytes());
            v.push(0);
        }
        v
    }

    #[test]
    fn pidfiles() {
        assert_eq!(parse_pidfile(b"1234\n"), Some(1234));
        assert_eq!(parse_pidfile(b"  7 "), Some(7));
        assert_eq!(parse_pidfile(b"0\n"), None);
        assert_eq!(parse_pidfile(b"-1"), None);
        assert_eq!(parse_pidfile(b"abc"), None);
        assert_eq!(parse_pidfile(b""), None);
    }

    #[test]
    fn cmdline_matching() {
        let ours = raw(&[
            "/usr/bin/qemu-system-x86_64",
            "-name",
            "sbx-1,debug-threads=off",
            "-S",
        ]);
        assert_eq!(check_cmdline(&ours, "sbx-1"), Ok(()));
        assert_eq!(
            check_cmdline(&ours, "sbx-2"),
            Err(CmdlineMismatch::OtherName("sbx-1".into()))
        );
        let guest_form = raw(&[
            "qemu-system-x86_64",
            "-name",
            "guest=sbx-1,debug-threads=on",
        ]);
        assert_eq!(check_cmdline(&guest_form, "sbx-1"), Ok(()));
        let other = raw(&["/bin/sleep", "-name", "sbx-1"]);
        assert!(matches!(
            check_cmdline(&other, "sbx-1"),
            Err(CmdlineMismatch::NotQemu(_))
        ));
        let unnamed = raw(&["qemu-system-x86_64", "-m", "256"]);
        assert_eq!(
            check_cmdline(&unnamed, "sbx-1"),
            Err(CmdlineMismatch::NoName)
        );
        assert_eq!(check_cmdline(b"", "sbx-1"), Err(CmdlineMismatch::Empty));
        // A prefix of our name is not our name.
        let prefix = raw(&["qemu-system-x86_64", "-name", "sbx-10,debug-threads=off"]);
        assert!(check_cmdline(&prefix, "sbx-1").is_err());
    }

    #[test]
    fn vm_rss() {
        let status = "Name:\tqemu\nVmPeak:\t 1 kB\nVmRSS:\t  166116 kB\nThreads: 3\n";
        assert_eq!(parse_vm_rss(status), Some(166_116 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert_eq!(parse_vm_rss("VmRSS: 12 MB\n"), None);
    }

    #[test]
    fn this_process_is_alive_and_not_qemu() {
        let me = std::process::id();
        assert!(is_alive(me));
        assert!(rss_bytes(me).is_some());
        assert!(matches!(
            verify_our_qemu(me, "sbx-1").unwrap(),
            Err(CmdlineMismatch::NotQemu(_))
        ));
    }
}

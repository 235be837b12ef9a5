//! An escape probe, run by the jail tests in exactly the jail a VMM gets
//! (`QemuVmm::run_in_jail`). Each argument is one attempt; each prints one line,
//! `<attempt> denied: <why>` or `<attempt> ESCAPED: <what worked>`, and the test asserts that
//! none escaped. Attempts:
//!
//! - `read:PATH`, `write:PATH`: open a host path (another sandbox's disk, the data directory,
//!   a template) for reading or writing;
//! - `create:PATH`: create a file (outside the jail's own files);
//! - `write-fd:N`: write through a descriptor the jail passed (the sealed memory image), and
//!   through a read-write reopen of it;
//! - `connect-unix:PATH`, `connect-tcp:ADDR`: reach a socket of the node or the API;
//! - `signal:PID`, `ptrace:PID`: touch another VMM, by the pid the host sees;
//! - `mount`, `unshare-user`, `unshare-net`, `chroot`: regain namespace or mount powers;
//! - `setuid-exec`: run this program again, setuid root (the test makes it so), and see
//!   whether it runs as root;
//! - `fork-bomb`: fork until refused; escaped if more than the limit given as `fork-bomb:N`;
//! - `memory:MIB`: touch that much memory (the cgroup's OOM killer should end the probe).
//!
//! `report-euid` (internal) prints the effective uid.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("report-euid") {
        // SAFETY: geteuid has no preconditions.
        print!("{}", unsafe { libc::geteuid() });
        return;
    }
    for attempt in &args {
        let outcome = run(attempt);
        match outcome {
            Ok(what) => println!("{attempt} ESCAPED: {what}"),
            Err(why) => println!("{attempt} denied: {why}"),
        }
        let _ = std::io::stdout().flush();
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn run(attempt: &str) -> Result<String, String> {
    let (kind, arg) = attempt.split_once(':').unwrap_or((attempt, ""));
    match kind {
        "read" => {
            let mut f = std::fs::File::open(arg).map_err(|e| e.to_string())?;
            let mut buf = [0u8; 16];
            let n = f.read(&mut buf).map_err(|e| e.to_string())?;
            Ok(format!("read {n} bytes"))
        }
        "write" => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(arg)
                .map_err(|e| e.to_string())?;
            f.write_all(b"x").map_err(|e| e.to_string())?;
            Ok("wrote a byte".into())
        }
        "create" => {
            std::fs::write(arg, b"x").map_err(|e| e.to_string())?;
            Ok("created".into())
        }
        "write-fd" => {
            let fd: i32 = arg.parse().map_err(|_| "bad fd".to_string())?;
            // SAFETY: the descriptor is the jail's; the File is forgotten, never closed.
            let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
            if f.write_all(b"poison").is_ok() {
                return Ok("wrote through the descriptor".into());
            }
            let reopened = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/self/fd/{fd}"));
            match reopened {
                Ok(mut r) => match r.write_all(b"poison") {
                    Ok(()) => Ok("wrote through a reopen".into()),
                    Err(e) => Err(format!("reopened but {e}")),
                },
                Err(e) => Err(e.to_string()),
            }
        }
        "connect-unix" => std::os::unix::net::UnixStream::connect(arg)
            .map(|_| "connected".to_string())
            .map_err(|e| e.to_string()),
        "connect-tcp" => std::net::TcpStream::connect_timeout(
            &arg.parse().map_err(|_| "bad address".to_string())?,
            std::time::Duration::from_secs(2),
        )
        .map(|_| "connected".to_string())
        .map_err(|e| e.to_string()),
        "signal" => {
            let pid: i32 = arg.parse().map_err(|_| "bad pid".to_string())?;
            // SAFETY: kill with signal 0 only checks whether a signal could be sent.
            if unsafe { libc::kill(pid, 0) } == 0 {
                Ok("could signal it".into())
            } else {
                Err(errno().to_string())
            }
        }
        "ptrace" => {
            let pid: i32 = arg.parse().map_err(|_| "bad pid".to_string())?;
            // SAFETY: PTRACE_ATTACH takes no pointers.
            let rc = unsafe {
                libc::ptrace(
                    libc::PTRACE_ATTACH,
                    pid,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            if rc == 0 {
                Ok("attached".into())
            } else {
                Err(errno().to_string())
            }
        }
        "mount" => {
            let _ = std::fs::create_dir("/tmp");
            // SAFETY: static C strings.
            let rc = unsafe {
                libc::mount(
                    c"none".as_ptr(),
                    c"/proc".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if rc == 0 {
                Ok("mounted a tmpfs".into())
            } else {
                Err(errno().to_string())
            }
        }
        "unshare-user" | "unshare-net" => {
            let flag = if kind == "unshare-user" {
                libc::CLONE_NEWUSER
            } else {
                libc::CLONE_NEWNET
            };
            // SAFETY: unshare takes flags only.
            if unsafe { libc::unshare(flag) } == 0 {
                return Ok("made a namespace".into());
            }
            let e = errno();
            // The same through clone (what fork-like calls use).
            // SAFETY: a raw clone with a namespace flag and SIGCHLD: the child exits at once.
            let pid = unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    (flag | libc::SIGCHLD) as libc::c_ulong,
                    0usize,
                    0usize,
                    0usize,
                    0usize,
                )
            };
            if pid == 0 {
                // SAFETY: the child leaves at once.
                unsafe { libc::_exit(0) };
            }
            if pid > 0 {
                return Ok("cloned into a namespace".into());
            }
            Err(format!("unshare: {e}; clone: {}", errno()))
        }
        "chroot" => {
            // SAFETY: static C string.
            if unsafe { libc::chroot(c"/usr".as_ptr()) } == 0 {
                Ok("chrooted".into())
            } else {
                Err(errno().to_string())
            }
        }
        "setuid-exec" => {
            let out = std::process::Command::new("/probe")
                .arg("report-euid")
                .output()
                .map_err(|e| e.to_string())?;
            let euid = String::from_utf8_lossy(&out.stdout).into_owned();
            if euid.trim() == "0" {
                Ok("ran as root".into())
            } else {
                Err(format!("ran as uid {}", euid.trim()))
            }
        }
        "fork-bomb" => {
            let limit: usize = arg.parse().map_err(|_| "bad limit".to_string())?;
            let mut children = Vec::new();
            let refusal = loop {
                // SAFETY: the child only pauses until it is killed.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    loop {
                        // SAFETY: pause has no preconditions.
                        unsafe { libc::pause() };
                    }
                }
                if pid < 0 {
                    break errno();
                }
                children.push(pid);
                // Past the limit it has escaped; no need to take the machine down to show it.
                if children.len() > limit {
                    break std::io::Error::other("no limit");
                }
            };
            let made = children.len();
            for pid in children {
                // SAFETY: our own children.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
            }
            if made > limit {
                Ok(format!("made {made} processes"))
            } else {
                Err(format!("stopped after {made} processes: {refusal}"))
            }
        }
        "memory" => {
            let mib: usize = arg.parse().map_err(|_| "bad size".to_string())?;
            let mut blocks = Vec::new();
            for _ in 0..mib {
                let mut block = vec![0u8; 1 << 20];
                for i in (0..block.len()).step_by(4096) {
                    block[i] = 1;
                }
                blocks.push(block);
            }
            Ok(format!("touched {} MiB", blocks.len()))
        }
        _ => Err(format!("unknown attempt {attempt:?}")),
    }
}

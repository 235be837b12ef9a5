//! `spaced init`: the daemon as PID 1.
//!
//! Deliberately small and synchronous (no async runtime, no allocation-heavy work): mount
//! the pseudo file systems, set a default hostname, bring up loopback, start `spaced agent`,
//! then wait for signals: reap every zombie, forward SIGTERM/SIGINT to the agent, and power
//! the VM off when the agent exits, so the VMM exits and the host sees the failure. A PID 1
//! that exits or panics panics the kernel, so nothing here returns or unwraps.

use std::ffi::CString;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::channel::ChannelSpec;

/// Hostname until the node configures one.
const DEFAULT_HOSTNAME: &str = "sandbox";
/// Where the agent binary is expected when `/proc/self/exe` cannot be read.
const FALLBACK_EXE: &str = "/run/space/spaced";
/// How long processes get to exit after SIGTERM at power-off.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(1000);

/// Writes a line to the console (falling back to stderr). Never fails.
fn console(msg: &str) {
    let line = format!("{msg}\n");
    match std::fs::OpenOptions::new().write(true).open("/dev/console") {
        Ok(mut c) => {
            let _ = c.write_all(line.as_bytes());
        }
        Err(_) => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

fn cstr(s: &str) -> CString {
    // Only called with our own constant strings, which contain no NUL.
    CString::new(s).unwrap_or_default()
}

fn mount(source: &str, target: &str, fstype: &str, flags: libc::c_ulong, data: &str) {
    let (s, t, f, d) = (cstr(source), cstr(target), cstr(fstype), cstr(data));
    let _ = std::fs::create_dir_all(target);
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, d.as_ptr().cast()) };
    if rc < 0 {
        console(&format!(
            "spaced: mount {fstype} on {target}: {}",
            std::io::Error::last_os_error()
        ));
    }
}

fn mounted_points() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(str::to_owned)
        .collect()
}

fn setup_mounts() {
    if !Path::new("/proc/self").exists() {
        mount(
            "proc",
            "/proc",
            "proc",
            libc::MS_NOSUID | libc::MS_NOEXEC | libc::MS_NODEV,
            "",
        );
    }
    let have = mounted_points();
    let has = |p: &str| have.iter().any(|m| m == p);
    if !has("/sys") {
        mount(
            "sysfs",
            "/sys",
            "sysfs",
            libc::MS_NOSUID | libc::MS_NOEXEC | libc::MS_NODEV,
            "",
        );
    }
    if !has("/dev") {
        mount("devtmpfs", "/dev", "devtmpfs", libc::MS_NOSUID, "mode=0755");
    }
    if !has("/dev/pts") {
        let tty = crate::users::lookup_group("tty")
            .map(|g| format!(",gid={g}"))
            .unwrap_or_default();
        mount(
            "devpts",
            "/dev/pts",
            "devpts",
            libc::MS_NOSUID | libc::MS_NOEXEC,
            &format!("newinstance,ptmxmode=0666,mode=0620{tty}"),
        );
    }
    if !has("/dev/shm") {
        mount(
            "shm",
            "/dev/shm",
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            "mode=1777",
        );
    }
    if !has("/tmp") {
        mount(
            "tmpfs",
            "/tmp",
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            "mode=1777",
        );
    }
    if !has("/sys/fs/cgroup") && Path::new("/sys/fs/cgroup").is_dir() {
        mount(
            "cgroup2",
            "/sys/fs/cgroup",
            "cgroup2",
            libc::MS_NOSUID | libc::MS_NOEXEC | libc::MS_NODEV,
            "",
        );
    }
    // What udev would normally create.
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
        ("/dev/ptmx", "pts/ptmx"),
    ] {
        if std::fs::symlink_metadata(link).is_err() {
            let _ = std::os::unix::fs::symlink(target, link);
        }
    }
}

/// Makes sure fds 0-2 are open (on the console if possible) so children never get a
/// random descriptor as their stdio.
fn ensure_stdio() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            let path = if Path::new("/dev/console").exists() {
                c"/dev/console"
            } else {
                c"/dev/null"
            };
            // SAFETY: valid path; the new descriptor takes the lowest free number, i.e. fd.
            unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
        }
    }
}

fn loopback_up() {
    // SAFETY: plain socket and ioctls on a zeroed, correctly sized ifreq.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return;
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr) == 0 {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr) < 0 {
                console(&format!(
                    "spaced: cannot bring up lo: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        libc::close(s);
    }
}

fn describe(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("signal {}", libc::WTERMSIG(status))
    } else {
        format!("wait status {status}")
    }
}

/// Reaps every exited child; returns the agent's status if it was among them.
fn reap(agent: libc::pid_t) -> Option<libc::c_int> {
    let mut agent_status = None;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status int.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return agent_status;
        }
        if pid == agent {
            agent_status = Some(status);
        }
    }
}

/// Stops everything and powers off. Never returns.
fn power_off(reason: &str) -> ! {
    console(reason);
    // A file system left frozen (by a host that vanished mid-snapshot, or by fsfreeze in
    // the guest) would keep its writers unkillable and hang the final sync forever.
    crate::fsfreeze::thaw_everything();
    // SAFETY: signalling all processes (except us) and reaping them.
    unsafe {
        libc::kill(-1, libc::SIGTERM);
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while Instant::now() < deadline {
            reap(0);
            let mut status = 0;
            if libc::waitpid(-1, &mut status, libc::WNOHANG) < 0 {
                break; // ECHILD: nobody left
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        libc::kill(-1, libc::SIGKILL);
        reap(0);
        libc::sync();
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_RDONLY,
            std::ptr::null(),
        );
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    // Only reached if reboot failed: PID 1 must not exit.
    console(&format!(
        "spaced: power off failed: {}",
        std::io::Error::last_os_error()
    ));
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}

/// Entry point of `spaced init`.
pub fn run(channel: &ChannelSpec) -> ExitCode {
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != 1 {
        // Refuse: this would power off the machine it runs on.
        eprintln!("spaced init must run as PID 1 inside a sandbox VM");
        return ExitCode::FAILURE;
    }
    std::panic::set_hook(Box::new(|info| {
        power_off(&format!("spaced: init panicked: {info}; powering off"))
    }));
    ensure_stdio();
    setup_mounts();
    // SAFETY: the name is valid for its length.
    unsafe { libc::sethostname(DEFAULT_HOSTNAME.as_ptr().cast(), DEFAULT_HOSTNAME.len()) };
    loopback_up();

    // Block the signals we handle so they queue for sigwait; children get an empty mask
    // (std::process resets it before exec).
    // SAFETY: sigset manipulation on a local set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [
            libc::SIGCHLD,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGPWR,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::sigaddset(&mut set, sig);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };

    let exe = std::env::current_exe().unwrap_or_else(|_| FALLBACK_EXE.into());
    let agent = match std::process::Command::new(&exe)
        .arg("agent")
        .arg("--channel")
        .arg(channel.to_string())
        .spawn()
    {
        Ok(child) => child.id() as libc::pid_t,
        Err(e) => power_off(&format!(
            "spaced: cannot start agent ({}): {e}; powering off",
            exe.display()
        )),
    };

    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: set is initialised; sig is written.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        match sig {
            libc::SIGCHLD => {
                if let Some(status) = reap(agent) {
                    power_off(&format!(
                        "spaced: agent exited ({}); powering off",
                        describe(status)
                    ));
                }
            }
            libc::SIGTERM | libc::SIGINT | libc::SIGPWR => {
                // SAFETY: signal our child.
                unsafe { libc::kill(agent, libc::SIGTERM) };
            }
            _ => {}
        }
    }
}

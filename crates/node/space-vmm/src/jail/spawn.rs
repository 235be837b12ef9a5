//! Starting a process in a jail: one `clone3` into fresh mount, pid, ipc and uts namespaces,
//! then, in the child, the steps of [`Confinement`] and `execve`.
//!
//! Why not `std::process::Command` with `pre_exec`: a new pid namespace only applies to the
//! children of the process that asks for it, so the program must itself be the first child
//! made in the namespace (its PID 1). `clone3` makes that child directly and hands back a
//! pidfd, so no intermediate process and no pid reuse race exist.
//!
//! The child is a copy of a multi-threaded process: until `execve` it may only make
//! async-signal-safe system calls, and no glibc call that takes a lock (the uid and group
//! changes are raw system calls for that reason), so everything it needs (C strings,
//! pointer arrays, `ifreq`, rlimits) is prepared by the parent beforehand, and a failure is
//! reported as a step number and an errno over a close-on-exec pipe. The parent waits for
//! the child's `execve` for a bounded time and kills a child that does not get there. The child also waits for the parent's
//! go byte: the parent first records the pid and moves the child into its cgroup, so no
//! program ever runs unrecorded or unconfined (a parent that dies first leaves a child that
//! reads EOF and exits without running anything).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What the child does to itself between `clone3` and `execve`, prepared by the parent.
pub(crate) struct Confinement {
    /// New mount, pid, ipc and uts namespaces, the mounts below, `pivot_root`, a uid change,
    /// no capabilities and `no_new_privs`. Without it the program runs as this process's
    /// user in this process's namespaces (the unjailed mode benchmarks compare against).
    pub(crate) jail: Option<JailSteps>,
    /// Network namespace to enter (an open `/run/netns/<name>` file).
    pub(crate) netns: Option<OwnedFd>,
    /// TAP device opened inside that namespace, passed to the program as fd `tap_fd`.
    pub(crate) tap: Option<(String, RawFd)>,
    /// Descriptors the program gets, at the given numbers (0, 1 and 2 included). Every other
    /// descriptor is closed by `execve`.
    pub(crate) fds: Vec<(OwnedFd, RawFd)>,
}

/// The confinement of a jailed program.
pub(crate) struct JailSteps {
    /// Host directory that becomes `/`.
    pub(crate) root: CString,
    /// Mounts made under `root` before `pivot_root`, in order.
    pub(crate) mounts: Vec<JailMount>,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) hostname: CString,
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    /// seccomp-bpf programs installed last, in order (see [`super::seccomp`]).
    pub(crate) seccomp: &'static [seccompiler::BpfProgram],
    /// No network namespace is given: make an empty one, so the program reaches no network.
    pub(crate) empty_network: bool,
}

/// One mount inside the jail.
pub(crate) struct JailMount {
    pub(crate) source: CString,
    /// Host path of the mount point (under the jail root, already created).
    pub(crate) target: CString,
    pub(crate) fstype: Option<CString>,
    pub(crate) flags: libc::c_ulong,
    pub(crate) data: Option<CString>,
    /// For bind mounts: flags of the remount that follows (a bind mount ignores `MS_RDONLY`
    /// and friends on its first call).
    pub(crate) remount: Option<libc::c_ulong>,
}

/// A started child: its pid (in our namespace), a pidfd for it, and the gate it waits at.
pub(crate) struct Spawned {
    pub(crate) pid: u32,
    pub(crate) pidfd: OwnedFd,
    pub(crate) gate: Gate,
}

/// Where the child waits before it does anything. Dropping the gate unreleased makes the
/// child exit without running the program.
pub(crate) struct Gate {
    /// Writing one byte lets the child go on.
    go: OwnedFd,
    /// Closed by the child's `execve`; carries a [`ChildFailure`] otherwise.
    status: OwnedFd,
}

/// The step of the child that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Step {
    Setsid = 1,
    Netns,
    Tap,
    Hostname,
    MountPrivate,
    BindRoot,
    Mount,
    Remount,
    RemountRoot,
    PivotRoot,
    CapabilityBound,
    Groups,
    Gid,
    Uid,
    NoNewPrivs,
    Rlimit,
    Seccomp,
    Fds,
    Exec,
}

impl Step {
    fn from_u8(v: u8) -> Option<Step> {
        // SAFETY: Step is repr(u8) with the contiguous discriminants 1..=Exec, checked here.
        (1..=Step::Exec as u8)
            .contains(&v)
            .then(|| unsafe { std::mem::transmute::<u8, Step>(v) })
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Step::Setsid => "setsid",
            Step::Netns => "entering the network namespace",
            Step::Tap => "opening the TAP device",
            Step::Hostname => "setting the hostname",
            Step::MountPrivate => "making mounts private",
            Step::BindRoot => "binding the jail root",
            Step::Mount => "mounting into the jail",
            Step::Remount => "remounting a jail mount",
            Step::RemountRoot => "remounting the jail root read-only",
            Step::PivotRoot => "pivot_root into the jail",
            Step::CapabilityBound => "dropping the capability bounding set",
            Step::Groups => "dropping supplementary groups",
            Step::Gid => "changing gid",
            Step::Uid => "changing uid",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::Rlimit => "setting resource limits",
            Step::Seccomp => "installing the seccomp filter",
            Step::Fds => "arranging file descriptors",
            Step::Exec => "execve",
        }
    }
}

/// Why the child did not reach `execve`.
#[derive(Debug)]
pub(crate) struct ChildFailure {
    pub(crate) step: Option<Step>,
    /// Which mount, for the mount steps (index into [`JailSteps::mounts`]).
    pub(crate) index: u16,
    pub(crate) error: io::Error,
}

/// `struct clone_args` of `clone3(2)` (not in the libc crate for x86_64 glibc).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `struct ifreq` as `TUNSETIFF` reads it: the name, then the flags.
#[repr(C)]
struct TunRequest {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// How long the child may take from the gate to `execve` (mounts and a few system calls:
/// milliseconds; the bound is for a child stuck anyway, which is then killed).
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Highest capability number we drop from the bounding set; unknown ones fail with EINVAL,
/// which is ignored.
const MAX_CAPABILITY: libc::c_ulong = 63;

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A C string from a path or argument; interior NULs cannot come from paths we derive, but
/// an argument could hold one.
pub(crate) fn c_string(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?} contains a NUL byte", s),
        )
    })
}

pub(crate) fn c_path(p: &Path) -> io::Result<CString> {
    c_string(p.as_os_str())
}

/// Starts `program` (a path valid inside the jail, or on the host without one) with `argv`
/// and an empty environment. The child waits until [`Spawned::release`].
pub(crate) fn spawn(
    program: &Path,
    argv: &[std::ffi::OsString],
    conf: Confinement,
) -> io::Result<Spawned> {
    let exe = c_path(program)?;
    let args = argv
        .iter()
        .map(|a| c_string(a))
        .collect::<io::Result<Vec<_>>>()?;
    let mut arg_ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    arg_ptrs.push(std::ptr::null());
    let env_ptrs: [*const libc::c_char; 1] = [std::ptr::null()];

    let tap_request = match &conf.tap {
        Some((name, _)) => {
            let bytes = name.as_bytes();
            if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("TAP name {name:?} must be 1..{} bytes", libc::IFNAMSIZ),
                ));
            }
            let mut req = TunRequest {
                name: [0; libc::IFNAMSIZ],
                flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
                _pad: [0; 22],
            };
            for (dst, src) in req.name.iter_mut().zip(bytes) {
                *dst = *src as libc::c_char;
            }
            Some(req)
        }
        None => None,
    };
    // The child moves every passed descriptor above all targets before dup2-ing it into
    // place, so no target overwrites a source not yet moved.
    let max_target = conf
        .fds
        .iter()
        .map(|(_, t)| *t)
        .chain(conf.tap.as_ref().map(|(_, t)| *t))
        .max()
        .unwrap_or(2);
    let sources: Vec<(RawFd, RawFd)> = conf
        .fds
        .iter()
        .map(|(fd, target)| (fd.as_raw_fd(), *target))
        .collect();
    let (go_read, go_write) = pipe()?;
    let (status_read, status_write) = pipe()?;

    let mut flags: u64 = libc::CLONE_PIDFD as u64;
    if let Some(j) = &conf.jail {
        flags |= (libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS)
            as u64;
        if j.empty_network && conf.netns.is_none() {
            flags |= libc::CLONE_NEWNET as u64;
        }
    }
    let mut pidfd: RawFd = -1;
    let args = CloneArgs {
        flags,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    let child = ChildPlan {
        exe: &exe,
        argv: arg_ptrs.as_ptr(),
        envp: env_ptrs.as_ptr(),
        jail: conf.jail.as_ref(),
        netns: conf.netns.as_ref().map(AsRawFd::as_raw_fd),
        tap: tap_request.as_ref().zip(conf.tap.as_ref().map(|(_, t)| *t)),
        sources: &sources,
        max_target,
        go: go_read.as_raw_fd(),
        status: status_write.as_raw_fd(),
    };
    // SAFETY: clone3 without CLONE_VM is fork: the child gets a copy of this address space
    // and runs only `child_main`, which makes async-signal-safe system calls on memory
    // prepared above and never returns.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if rc == 0 {
        // SAFETY: we are the child (see above).
        unsafe { child_main(&child) }
    }
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(go_read);
    drop(status_write);
    // SAFETY: clone3 succeeded with CLONE_PIDFD, so `pidfd` is a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Spawned {
        pid: rc as u32,
        pidfd,
        gate: Gate {
            go: go_write,
            status: status_read,
        },
    })
}

impl Gate {
    /// Lets the child go on and waits until it has called `execve` (Ok) or failed before.
    /// Blocks for as long as the child's preparation takes (milliseconds).
    pub(crate) fn release(self) -> Result<(), ChildFailure> {
        let fail = |error| ChildFailure {
            step: None,
            index: 0,
            error,
        };
        // SAFETY: writing one byte from a valid buffer to a pipe we own.
        let n = unsafe { libc::write(self.go.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        if n != 1 {
            return Err(fail(io::Error::last_os_error()));
        }
        drop(self.go);
        let mut report = [0u8; 7];
        let mut got = 0;
        let deadline = std::time::Instant::now() + RELEASE_TIMEOUT;
        while got < report.len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.status.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one pollfd we own.
            let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as libc::c_int) };
            if ready == 0 {
                return Err(ChildFailure {
                    step: None,
                    index: 0,
                    error: io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the child did not reach execve within {RELEASE_TIMEOUT:?}"),
                    ),
                });
            }
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(fail(e));
            }
            // SAFETY: reading into the unfilled part of a local buffer.
            let n = unsafe {
                libc::read(
                    self.status.as_raw_fd(),
                    report[got..].as_mut_ptr().cast(),
                    report.len() - got,
                )
            };
            match n {
                0 => break,
                n if n > 0 => got += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(fail(e));
                    }
                }
            }
        }
        if got == 0 {
            return Ok(());
        }
        let errno = i32::from_le_bytes([report[3], report[4], report[5], report[6]]);
        Err(ChildFailure {
            step: Step::from_u8(report[0]),
            index: u16::from_le_bytes([report[1], report[2]]),
            error: io::Error::from_raw_os_error(errno),
        })
    }
}

/// What the child reads; raw pointers into the parent's prepared memory (copied by fork).
struct ChildPlan<'a> {
    exe: &'a CString,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    jail: Option<&'a JailSteps>,
    netns: Option<RawFd>,
    tap: Option<(&'a TunRequest, RawFd)>,
    sources: &'a [(RawFd, RawFd)],
    max_target: RawFd,
    go: RawFd,
    status: RawFd,
}

/// Reports a failed step to the parent and exits. Async-signal-safe.
unsafe fn fail(status: RawFd, step: Step, index: usize) -> ! {
    let errno = *libc::__errno_location();
    let idx = (index.min(u16::MAX as usize) as u16).to_le_bytes();
    let e = errno.to_le_bytes();
    let report = [step as u8, idx[0], idx[1], e[0], e[1], e[2], e[3]];
    libc::write(status, report.as_ptr().cast(), report.len());
    libc::_exit(127)
}

/// The child between clone3 and execve. Only async-signal-safe calls; never returns.
unsafe fn child_main(p: &ChildPlan<'_>) -> ! {
    let st = p.status;
    let mut byte = 0u8;
    loop {
        let n = libc::read(p.go, std::ptr::addr_of_mut!(byte).cast(), 1);
        if n == 1 {
            break;
        }
        if n < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        // The parent gave up (or died) before releasing us: run nothing.
        libc::_exit(126);
    }
    if libc::setsid() < 0 {
        fail(st, Step::Setsid, 0);
    }
    if let Some(ns) = p.netns {
        if libc::setns(ns, libc::CLONE_NEWNET) < 0 {
            fail(st, Step::Netns, 0);
        }
    }
    // Opened inside the sandbox's namespace, before the uid change: the program gets the
    // device as a descriptor and never needs /dev/net/tun or CAP_NET_ADMIN.
    let mut tap_fd = -1;
    if let Some((req, _)) = p.tap {
        tap_fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if tap_fd < 0 || libc::ioctl(tap_fd, libc::TUNSETIFF, req as *const TunRequest) < 0 {
            fail(st, Step::Tap, 0);
        }
    }
    if let Some(j) = p.jail {
        jail_self(st, j);
    }
    // Every passed descriptor first goes above all targets, then into place.
    let mut moved = [(-1 as RawFd, -1 as RawFd); 16];
    let mut count = 0;
    let all = p
        .sources
        .iter()
        .copied()
        .chain(p.tap.map(|(_, target)| (tap_fd, target)));
    for (src, target) in all {
        if count == moved.len() {
            *libc::__errno_location() = libc::EMFILE;
            fail(st, Step::Fds, count);
        }
        let high = libc::fcntl(src, libc::F_DUPFD_CLOEXEC, p.max_target + 1);
        if high < 0 {
            fail(st, Step::Fds, count);
        }
        moved[count] = (high, target);
        count += 1;
    }
    for &(high, target) in &moved[..count] {
        // dup2 clears close-on-exec on the target.
        if libc::dup2(high, target) < 0 {
            fail(st, Step::Fds, 0);
        }
    }
    // Everything else closes at execve, including the status pipe, whose EOF tells the
    // parent the exec succeeded.
    if libc::close_range(
        (p.max_target + 1) as libc::c_uint,
        libc::c_uint::MAX,
        libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
    ) < 0
    {
        fail(st, Step::Fds, 0);
    }
    libc::execve(p.exe.as_ptr(), p.argv, p.envp);
    fail(st, Step::Exec, 0)
}

/// Mounts, pivot_root, uid change, capabilities, no_new_privs, rlimits.
unsafe fn jail_self(st: RawFd, j: &JailSteps) {
    let null = std::ptr::null::<libc::c_char>();
    if libc::sethostname(j.hostname.as_ptr(), j.hostname.as_bytes().len()) < 0 {
        fail(st, Step::Hostname, 0);
    }
    // Nothing mounted here may propagate back to the host's namespace.
    if libc::mount(
        null,
        c"/".as_ptr(),
        null,
        libc::MS_REC | libc::MS_PRIVATE,
        std::ptr::null(),
    ) < 0
    {
        fail(st, Step::MountPrivate, 0);
    }
    // pivot_root needs the new root to be a mount point.
    if libc::mount(
        j.root.as_ptr(),
        j.root.as_ptr(),
        null,
        libc::MS_BIND,
        std::ptr::null(),
    ) < 0
    {
        fail(st, Step::BindRoot, 0);
    }
    for (i, m) in j.mounts.iter().enumerate() {
        let fstype = m.fstype.as_ref().map_or(null, |s| s.as_ptr());
        let data = m
            .data
            .as_ref()
            .map_or(std::ptr::null(), |s| s.as_ptr().cast());
        if libc::mount(m.source.as_ptr(), m.target.as_ptr(), fstype, m.flags, data) < 0 {
            fail(st, Step::Mount, i);
        }
        if let Some(flags) = m.remount {
            if libc::mount(
                null,
                m.target.as_ptr(),
                null,
                libc::MS_REMOUNT | libc::MS_BIND | flags,
                std::ptr::null(),
            ) < 0
            {
                fail(st, Step::Remount, i);
            }
        }
    }
    // The jail's own directory tree is read-only; only the mounts made writable above are not.
    if libc::mount(
        null,
        j.root.as_ptr(),
        null,
        libc::MS_REMOUNT
            | libc::MS_BIND
            | libc::MS_RDONLY
            | libc::MS_NOSUID
            | libc::MS_NODEV
            | libc::MS_NOEXEC,
        std::ptr::null(),
    ) < 0
    {
        fail(st, Step::RemountRoot, 0);
    }
    // pivot_root(".", ".") stacks the old root under the new one; detaching it leaves
    // nothing of the host's tree reachable.
    if libc::chdir(j.root.as_ptr()) < 0
        || libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) < 0
        || libc::umount2(c".".as_ptr(), libc::MNT_DETACH) < 0
        || libc::chdir(c"/".as_ptr()) < 0
    {
        fail(st, Step::PivotRoot, 0);
    }
    for cap in 0..=MAX_CAPABILITY {
        if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0
            && *libc::__errno_location() != libc::EINVAL
        {
            fail(st, Step::CapabilityBound, cap as usize);
        }
    }
    // Raw system calls, not glibc's wrappers: those broadcast the change to every thread
    // glibc believes exists, under a lock another thread of the parent may have held at
    // clone time, and then wait forever (seen: children stuck in a futex as root).
    if libc::syscall(
        libc::SYS_setgroups,
        0 as libc::c_long,
        std::ptr::null::<libc::gid_t>(),
    ) < 0
    {
        fail(st, Step::Groups, 0);
    }
    if libc::syscall(
        libc::SYS_setresgid,
        j.gid as libc::c_long,
        j.gid as libc::c_long,
        j.gid as libc::c_long,
    ) < 0
    {
        fail(st, Step::Gid, 0);
    }
    // From root to a non-zero uid in all three: the kernel clears every capability.
    if libc::syscall(
        libc::SYS_setresuid,
        j.uid as libc::c_long,
        j.uid as libc::c_long,
        j.uid as libc::c_long,
    ) < 0
    {
        fail(st, Step::Uid, 0);
    }
    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 {
        fail(st, Step::NoNewPrivs, 0);
    }
    for (i, &(resource, value)) in j.rlimits.iter().enumerate() {
        let limit = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        if libc::setrlimit(resource, &limit) < 0 {
            fail(st, Step::Rlimit, i);
        }
    }
    for (i, prog) in j.seccomp.iter().enumerate() {
        let fprog = libc::sock_fprog {
            len: prog.len() as libc::c_ushort,
            // seccompiler's sock_filter has the kernel's layout.
            filter: prog.as_ptr() as *mut libc::sock_filter,
        };
        if libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            std::ptr::addr_of!(fprog),
        ) < 0
        {
            fail(st, Step::Seccomp, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_round_trip() {
        for v in 1..=19u8 {
            let step = Step::from_u8(v).expect("every step number decodes");
            assert_eq!(step as u8, v);
            assert!(!step.describe().is_empty());
        }
        assert_eq!(Step::from_u8(0), None);
        assert_eq!(Step::from_u8(20), None);
    }
}

//! The image unpacker's jail: layers are applied and the ext4 image written by a child
//! process that is root only inside user, mount, network, IPC and UTS namespaces of its
//! own. Its uid 0-65535 are host uids `UNPACK_UID_BASE + k * 65536 + …` for a range `k`
//! claimed with a lock file, so the image's owners and setuid bits are real inside the
//! tree while the process has no privilege over any file outside its range: it reaches the
//! work directory only through the descriptor it was given (fd 3), it has no network, and
//! `no_new_privs` is set. A layer that fools the unpacker (a kernel resolution bug aside,
//! every path is resolved beneath the tree) can do what an unprivileged user could.
//!
//! The parent (root) runs the child as `PROGRAM __unpack-image` (the `space` binary calls
//! [`child_main`] first thing, while it has one thread, as `unshare(CLONE_NEWUSER)`
//! requires), sends the [`UnpackJob`] on stdin, waits for `ready` (the namespaces exist),
//! writes the uid and gid maps, sends `go`, passes the child's stderr lines to the progress
//! callback and reads the [`UnpackOutcome`] from its stdout. Afterwards the image is given
//! to root, read-only, and the tree removed.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::oci::plumbing::{self, Plumbed};
use crate::oci::unpack::{UnpackError, UnpackLimits, Unpacker};
use crate::oci::{OciError, UNPACK_RANGE, UNPACK_RANGES, UNPACK_UID_BASE};

/// The hidden subcommand the child runs as.
pub const CHILD_ARG: &str = "__unpack-image";
/// Where range locks live.
const LOCK_DIR: &str = "/run/space/unpack-ranges";
/// The work directory's descriptor in the child.
const WORK_FD: i32 = 3;
/// The staged image's directory's descriptor in the child (layers are read beneath it).
const INPUT_FD: i32 = 4;
/// Longest a job may take (a multi-GiB image on a slow disk takes minutes).
const DEADLINE: Duration = Duration::from_secs(3600);

/// What the child is to do; layer paths are relative to the staged image's directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnpackJob {
    /// Layer blobs, lowest first, with the config's `diff_id` of each.
    pub layers: Vec<(String, String)>,
    /// Bounds.
    pub limits: UnpackLimits,
    /// The image config's `User`.
    pub image_user: Option<String>,
    /// The image config's `WorkingDir`.
    #[serde(default)]
    pub workdir: Option<String>,
    /// The smallest image to make, MiB (0: sized to the tree).
    pub min_image_mib: u64,
}

/// What the child made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnpackReport {
    /// The plumbing's result.
    pub plumbed: Plumbed,
    /// Bytes of file content in the tree.
    pub bytes: u64,
    /// Inodes in the tree.
    pub inodes: u64,
    /// Size of the image written (`rootfs.ext4` in the work directory), MiB.
    pub image_size_mib: u64,
    /// xattrs the image had that were not applied.
    pub skipped_xattrs: Vec<String>,
}

/// The child's last line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnpackOutcome {
    /// Done.
    Done(UnpackReport),
    /// Refused or failed.
    Failed(UnpackError),
}

/// The tree and image inside the work directory.
pub const TREE: &str = "tree";
/// The image the child writes.
pub const IMAGE: &str = "rootfs.ext4";

/// A claimed uid range: held while the lock file is.
struct Range {
    base: u32,
    _lock: std::fs::File,
}

fn claim_range() -> Result<Range, OciError> {
    std::fs::create_dir_all(LOCK_DIR)
        .map_err(|e| OciError::Unpacker(format!("{LOCK_DIR}: {e}")))?;
    for k in 0..UNPACK_RANGES {
        let path = Path::new(LOCK_DIR).join(k.to_string());
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| OciError::Unpacker(format!("{}: {e}", path.display())))?;
        if fs4::fs_std::FileExt::try_lock_exclusive(&f).unwrap_or(false) {
            return Ok(Range {
                base: UNPACK_UID_BASE + k * UNPACK_RANGE,
                _lock: f,
            });
        }
    }
    Err(OciError::Unpacker(format!(
        "all {UNPACK_RANGES} unpacker uid ranges are in use; try again when a build ends"
    )))
}

/// Runs `job` in a jailed child of `program` on work directory `work`, reading the layers
/// it names beneath directory `input`, leaving `work/rootfs.ext4` (root's, 0644) and no
/// tree. Needs root.
pub fn run_jailed(
    program: &Path,
    work: &Path,
    input: &impl AsFd,
    job: &UnpackJob,
    progress: &dyn Fn(&str),
) -> Result<UnpackReport, OciError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(OciError::Unpacker("unpacking an image needs root".into()));
    }
    let fail = |what: &str, e: &dyn std::fmt::Display| OciError::Unpacker(format!("{what}: {e}"));
    let range = claim_range()?;
    let owner = Some(nix::unistd::Uid::from_raw(range.base));
    let group = Some(nix::unistd::Gid::from_raw(range.base));
    let tree = work.join(TREE);
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir(&tree).map_err(|e| fail("make the tree", &e))?;
    nix::unistd::chown(&tree, owner, group).map_err(|e| fail("chown the tree", &e))?;
    nix::unistd::chown(work, owner, group).map_err(|e| fail("chown the work directory", &e))?;
    let dir: OwnedFd = std::fs::File::open(work)
        .map_err(|e| fail("open the work directory", &e))?
        .into();
    let raw = dir.as_raw_fd();
    let input_raw = input.as_fd().as_raw_fd();
    let mut cmd = Command::new(program);
    cmd.arg(CHILD_ARG)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: dup2 is async-signal-safe; it runs in the forked child before exec and gives
    // the child the work directory as fd 3 and the input as fd 4 (dup2 clears
    // close-on-exec). The input is moved out of the way first should it be fd 3.
    unsafe {
        cmd.pre_exec(move || {
            let input = libc::fcntl(input_raw, libc::F_DUPFD_CLOEXEC, 10);
            if input < 0 || libc::dup2(raw, WORK_FD) < 0 || libc::dup2(input, INPUT_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| fail("start", &e))?;
    drop(dir);
    let pid = child.id();
    let result = (|| -> Result<UnpackReport, OciError> {
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| OciError::Unpacker("no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| OciError::Unpacker("no stdout".into()))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| OciError::Unpacker("no stderr".into()))?;
        let mut out = BufReader::new(stdout.take(16 << 20));
        let line = serde_json::to_string(job).map_err(|e| fail("encode the job", &e))?;
        writeln!(stdin, "{line}").map_err(|e| fail("send the job", &e))?;
        let mut ready = String::new();
        out.read_line(&mut ready).map_err(|e| fail("read", &e))?;
        if ready.trim() != "ready" {
            return Err(OciError::Unpacker(format!(
                "did not start its namespaces: {}",
                drain(stderr)
            )));
        }
        let map = format!("0 {} {UNPACK_RANGE}\n", range.base);
        for file in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{pid}/{file}"), &map)
                .map_err(|e| fail(&format!("write {file}"), &e))?;
        }
        writeln!(stdin, "go").map_err(|e| fail("start the job", &e))?;
        drop(stdin);
        // stderr: progress lines, passed on here (the callback need not be Send); stdout:
        // the outcome, read on a thread of its own so neither pipe can fill and block it.
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let lines = crate::run::forward(stderr, tx);
        let result = std::thread::spawn(move || {
            let mut result = String::new();
            let _ = out.read_to_string(&mut result);
            result
        });
        let deadline = std::time::Instant::now() + DEADLINE;
        let mut tail = std::collections::VecDeque::with_capacity(10);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => {
                    progress(&l);
                    if tail.len() == 10 {
                        tail.pop_front();
                    }
                    tail.push_back(l);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    return Err(OciError::Unpacker(format!(
                        "took longer than {} s and was killed",
                        DEADLINE.as_secs()
                    )));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = lines.join();
        let result = result.join().unwrap_or_default();
        let outcome: UnpackOutcome = serde_json::from_str(result.trim()).map_err(|_| {
            OciError::Unpacker(format!(
                "ended without a result; its last lines:\n{}",
                Vec::from(tail).join("\n")
            ))
        })?;
        match outcome {
            UnpackOutcome::Done(r) => Ok(r),
            UnpackOutcome::Failed(e) => Err(OciError::Unpack(e)),
        }
    })();
    let status = child.wait();
    // The work directory is taken back first, on every path: from then on nothing of the
    // range can add, rename or replace a name in it.
    let reclaimed = nix::unistd::chown(
        work,
        Some(nix::unistd::Uid::from_raw(0)),
        Some(nix::unistd::Gid::from_raw(0)),
    );
    let _ = space_storage::mountinfo::remove_tree(&tree);
    reclaimed.map_err(|e| fail("chown the work directory", &e))?;
    let report = result?;
    let status = status.map_err(|e| fail("wait", &e))?;
    if !status.success() {
        return Err(OciError::Unpacker(format!("exited with {status}")));
    }
    take_image(&work.join(IMAGE))?;
    Ok(report)
}

/// Gives the image the child wrote to root (0644), through a descriptor opened without
/// following links: the child could have left a symlink or a hard link there instead, and
/// root must not chown or chmod whatever it points at.
fn take_image(path: &Path) -> Result<(), OciError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        OciError::Unpacker(format!("{what} {}: {e}", path.display()))
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| fail("open", &e))?;
    let meta = f.metadata().map_err(|e| fail("stat", &e))?;
    if !meta.file_type().is_file() || meta.nlink() != 1 {
        return Err(fail("take", &"not a regular file with one name"));
    }
    std::os::unix::fs::fchown(&f, Some(0), Some(0)).map_err(|e| fail("chown", &e))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(|e| fail("chmod", &e))
}

fn drain(stderr: impl Read) -> String {
    let mut s = String::new();
    let _ = stderr.take(64 * 1024).read_to_string(&mut s);
    s.trim().to_owned()
}

/// The child's side: call it first thing in `main` when `argv[1]` is [`CHILD_ARG`], before
/// any thread exists. Returns the exit code.
pub fn child_main() -> i32 {
    let outcome = match child_run() {
        Ok(report) => UnpackOutcome::Done(report),
        Err(e) => UnpackOutcome::Failed(e),
    };
    match serde_json::to_string(&outcome) {
        Ok(line) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            i32::from(!matches!(outcome, UnpackOutcome::Done(_)))
        }
        Err(_) => 2,
    }
}

fn setup_err(what: &str, e: impl std::fmt::Display) -> UnpackError {
    UnpackError::Io {
        action: what.to_owned(),
        path: "(unpacker)".into(),
        detail: e.to_string(),
    }
}

fn child_run() -> Result<UnpackReport, UnpackError> {
    use nix::sched::CloneFlags;
    let mut stdin = BufReader::new(std::io::stdin().lock().take(1 << 20));
    let mut line = String::new();
    stdin
        .read_line(&mut line)
        .map_err(|e| setup_err("read the job", e))?;
    let job: UnpackJob = serde_json::from_str(&line).map_err(|e| setup_err("parse the job", e))?;
    nix::sched::unshare(
        CloneFlags::CLONE_NEWUSER
            | CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWUTS,
    )
    .map_err(|e| setup_err("unshare", e))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready").map_err(|e| setup_err("signal ready", e))?;
        out.flush().map_err(|e| setup_err("signal ready", e))?;
    }
    line.clear();
    stdin
        .read_line(&mut line)
        .map_err(|e| setup_err("wait for the maps", e))?;
    if line.trim() != "go" {
        return Err(setup_err("wait for the maps", "the parent gave up"));
    }
    // Become the namespace's root: uid 0 here is the range's first host uid.
    let root_gid = nix::unistd::Gid::from_raw(0);
    let root_uid = nix::unistd::Uid::from_raw(0);
    nix::unistd::setgroups(&[]).map_err(|e| setup_err("setgroups", e))?;
    nix::unistd::setresgid(root_gid, root_gid, root_gid).map_err(|e| setup_err("setresgid", e))?;
    nix::unistd::setresuid(root_uid, root_uid, root_uid).map_err(|e| setup_err("setresuid", e))?;
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(setup_err(
            "set no_new_privs",
            std::io::Error::last_os_error(),
        ));
    }
    let work = PathBuf::from(format!("/proc/self/fd/{WORK_FD}"));
    let say = |msg: &str| {
        let mut e = std::io::stderr().lock();
        let _ = writeln!(e, "{msg}");
    };
    let mut unpacker = Unpacker::open(&work.join(TREE), job.limits)?;
    let n = job.layers.len();
    for (i, (blob, diff_id)) in job.layers.iter().enumerate() {
        say(&format!("applying layer {}/{n}", i + 1));
        let rel = Path::new(blob);
        if !rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return Err(setup_err("open a layer", "not a relative path"));
        }
        // SAFETY: fd 4 is the input directory the parent gave this process; it stays open
        // for the whole run.
        let input = unsafe { BorrowedFd::borrow_raw(INPUT_FD) };
        let f = crate::oci::staged::open_beneath(&input, blob)
            .map_err(|e| setup_err(&format!("open layer {}", i + 1), e))?;
        unpacker.apply_layer(i + 1, f, diff_id)?;
    }
    say("adding the sandbox plumbing");
    let plumbed = plumbing::apply(&unpacker, job.image_user.as_deref(), job.workdir.as_deref())?;
    let tree = work.join(TREE);
    let usage = crate::ext4::tree_usage(&tree).map_err(|e| setup_err("measure the tree", e))?;
    let size_mib = crate::ext4::image_size_mib(usage.bytes).max(job.min_image_mib);
    say(&format!(
        "root filesystem: {} MiB in {} inodes",
        usage.bytes >> 20,
        usage.inodes
    ));
    crate::ext4::make_image(
        &tree,
        &work.join(IMAGE),
        size_mib,
        crate::ext4::inode_count(usage.inodes, size_mib),
        &say,
    )
    .map_err(|e| setup_err("write the ext4 image", e))?;
    Ok(UnpackReport {
        plumbed,
        bytes: unpacker.bytes(),
        inodes: usage.inodes,
        image_size_mib: size_mib,
        skipped_xattrs: unpacker.skipped_xattrs.iter().cloned().collect(),
    })
}

//! Acting as a user for file operations: per-thread fs uid/gid and supplementary groups.
//!
//! On Linux, `setfsuid`, `setfsgid` and the raw `setgroups` system call change only the
//! calling thread's credentials (glibc's `setgroups` wrapper would change every thread, so
//! we use the raw syscall). Permission checks then see exactly what the user would see,
//! and a non-zero fs uid drops the file-system capabilities of root for that thread. The
//! guard restores root's credentials when dropped, so pooled threads are safe to reuse.

use std::io;

use crate::users::UserInfo;

/// Restores the thread's file-system credentials on drop.
#[derive(Debug)]
pub struct FsUserGuard {
    saved_groups: Option<Vec<libc::gid_t>>,
}

fn current_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: with size 0, getgroups only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0 as libc::gid_t; n as usize];
    // SAFETY: the buffer holds n entries.
    let n = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    Ok(groups)
}

fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: raw setgroups on this thread with a valid array of groups.len() entries.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_fs_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setfsgid/setfsuid take plain ids; they return the previous id. An invalid id
    // (u32::MAX) changes nothing and returns the current one, which we use to verify.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
        let cur_gid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        let cur_uid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        if cur_uid != uid || cur_gid != gid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("cannot switch file-system ids to {uid}:{gid}"),
            ));
        }
    }
    Ok(())
}

impl FsUserGuard {
    /// Switches this thread to `user`'s file-system identity. For root it changes nothing.
    pub fn act_as(user: &UserInfo) -> io::Result<FsUserGuard> {
        if user.uid == 0 && user.gid == 0 {
            return Ok(FsUserGuard { saved_groups: None });
        }
        let saved = current_groups()?;
        let guard = FsUserGuard {
            saved_groups: Some(saved),
        };
        set_thread_groups(&user.groups)?;
        set_fs_ids(user.uid, user.gid)?;
        Ok(guard)
    }
}

impl Drop for FsUserGuard {
    fn drop(&mut self) {
        if let Some(groups) = self.saved_groups.take() {
            // Returning to 0 always succeeds for a root process: only the fs ids changed.
            if let Err(e) = set_fs_ids(0, 0).and_then(|()| set_thread_groups(&groups)) {
                // A pooled thread with the wrong identity would be a security bug; better dead.
                tracing::error!(error = %e, "cannot restore file-system credentials; exiting");
                std::process::abort();
            }
        }
    }
}

/// Runs `f` with the thread acting as `user`. Call on a blocking thread.
pub fn with_user<T>(user: &UserInfo, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let _guard = FsUserGuard::act_as(user)?;
    f()
}

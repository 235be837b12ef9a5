//! File operations inside the guest, run on blocking threads as the acting user, files'
//! metadata (extended attributes), and directory watches (inotify) on threads of their own.

pub mod archive;
pub mod inotify;
pub mod metadata;
pub mod ops;
pub mod paths;
pub mod watch;

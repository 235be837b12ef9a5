//! Processes the daemon runs for the platform: spawning, output capture and replay, stdin,
//! signals, timeouts, and reaping.

pub mod env;
pub mod manager;
pub mod output_buffer;
pub mod pty;
pub mod reaper;
pub mod spawn;

pub use manager::ProcessManager;

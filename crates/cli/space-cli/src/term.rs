//! The local terminal: size, raw mode (restored on drop), tty checks.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg, Termios};
use space_core::process::PtySize;

/// Whether stdin is a terminal.
pub fn stdin_is_tty() -> bool {
    std::io::stdin().is_terminal()
}

/// Whether stderr is a terminal (progress bars go there).
pub fn stderr_is_tty() -> bool {
    std::io::stderr().is_terminal()
}

/// The size of the terminal on stdout (or stdin), clamped to what a pty accepts.
pub fn size() -> PtySize {
    for fd in [libc::STDOUT_FILENO, libc::STDIN_FILENO] {
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the pointer we pass, which is valid.
        let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
        if rc == 0 && ws.ws_row > 0 && ws.ws_col > 0 {
            return PtySize {
                rows: ws.ws_row.min(1000),
                cols: ws.ws_col.min(1000),
            };
        }
    }
    PtySize { rows: 24, cols: 80 }
}

/// Puts stdin in raw mode until dropped.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Enters raw mode (keys are passed through unprocessed, no local echo).
    pub fn enter() -> anyhow::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = tcgetattr(stdin.as_fd())?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

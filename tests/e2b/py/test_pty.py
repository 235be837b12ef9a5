"""PTY (process.Process Start with a pty, SendInput, Update, SendSignal, Connect)."""

import pytest
from conftest import PtyReader
from e2b import CommandExitException, PtySize, Sandbox


@pytest.fixture
def pty(sandbox):
    """An interactive login bash on a 24x80 PTY, read on a thread; killed at the end."""
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    reader = PtyReader(handle)
    yield reader
    sandbox.pty.kill(handle.pid)


def test_pty_runs_an_interactive_shell(sandbox, pty):
    sandbox.pty.send_stdin(pty.handle.pid, b"echo $((6*7)) $TERM\n")
    # The typed line is echoed back too; only the output has the computed value.
    pty.wait_for("42 xterm-256color")


def test_pty_resize(sandbox, pty):
    sandbox.pty.send_stdin(pty.handle.pid, b"stty size\n")
    pty.wait_for("24 80")
    sandbox.pty.resize(pty.handle.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(pty.handle.pid, b"stty size\n")
    pty.wait_for("40 120")


def test_pty_exit_code(sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    reader = PtyReader(handle)
    sandbox.pty.send_stdin(handle.pid, b"exit 5\n")
    reader.join()
    assert isinstance(reader.error, CommandExitException), reader.error
    assert reader.error.exit_code == 5


def test_pty_kill_true_then_false(sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    reader = PtyReader(handle)
    assert sandbox.pty.kill(handle.pid) is True
    reader.join()
    assert isinstance(reader.error, CommandExitException), reader.error
    assert reader.error.exit_code == -1
    assert sandbox.pty.kill(handle.pid) is False


def test_pty_connect_from_a_second_sandbox_object(sandbox, pty):
    other = Sandbox.connect(sandbox.sandbox_id)
    second = PtyReader(other.pty.connect(pty.handle.pid, timeout=0))
    other.pty.send_stdin(pty.handle.pid, b"echo $((7*6))-again\n")
    second.wait_for("42-again")
    # The first connection sees it too.
    pty.wait_for("42-again")


def test_pty_is_listed_as_a_process(sandbox, pty):
    info = next(p for p in sandbox.commands.list() if p.pid == pty.handle.pid)
    assert (info.cmd, info.args) == ("/bin/bash", ["-i", "-l"])
    assert info.envs.get("TERM") == "xterm-256color"

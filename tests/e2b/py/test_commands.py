"""Commands (process.Process over Connect, sync SDK): foreground and background runs,
exit codes, output callbacks, env/cwd/user, timeouts, list/connect/kill, stdin, keepalives."""

import threading
import time

import pytest
from conftest import (
    access_token,
    connect_stream,
    envelope,
    process_events,
    skip_unless_sdk_has,
    stdout_of,
    wait_until,
)
from e2b import (
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    TimeoutException,
)
from sdk_compat import UNSET_STR

SILENT_SECS = 60


@pytest.fixture(scope="module")
def silent_command(sandbox):
    """`sleep 60; echo x` with no timeout, started on a thread when the module begins and
    checked by its last test, so the other tests run meanwhile. Output-less for 60 s, it
    needs the server's keepalives (or at least no idle cut-off) to finish."""
    outcome = {}

    def run():
        try:
            outcome["result"] = sandbox.commands.run(f"sleep {SILENT_SECS}; echo x", timeout=0)
        except BaseException as e:  # noqa: BLE001 - checked by the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    yield thread, started, outcome


def process_by_pid(sandbox, pid):
    return next((p for p in sandbox.commands.list() if p.pid == pid), None)


def test_run_true(sandbox, silent_command):
    r = sandbox.commands.run("true")
    assert (r.exit_code, r.stdout, r.stderr, r.error) == (0, "", "", UNSET_STR)


def test_run_echo(sandbox):
    assert sandbox.commands.run("echo hello").stdout == "hello\n"


def test_commands_run_in_real_bash(sandbox):
    r = sandbox.commands.run("echo ${BASH_VERSION%%.*}; shopt -q login_shell && echo login")
    assert r.stdout == "5\nlogin\n"


def test_nonzero_exit_raises_command_exit_exception(sandbox):
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo out; echo err >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.error == "exit status 3"
    assert e.value.stdout == "out\n"
    assert e.value.stderr == "err\n"


def test_on_stdout_and_on_stderr_get_chunks_in_order(sandbox):
    seen = []
    r = sandbox.commands.run(
        "echo o1; sleep 0.3; echo e1 >&2; sleep 0.3; echo o2; sleep 0.3; echo e2 >&2",
        on_stdout=lambda s: seen.append(("out", s)),
        on_stderr=lambda s: seen.append(("err", s)),
    )
    assert seen == [("out", "o1\n"), ("err", "e1\n"), ("out", "o2\n"), ("err", "e2\n")]
    assert (r.stdout, r.stderr) == ("o1\no2\n", "e1\ne2\n")


def test_output_is_streamed_before_the_command_ends(sandbox):
    first_at = []
    started = time.monotonic()
    sandbox.commands.run("echo early; sleep 2; echo late",
                         on_stdout=lambda s: first_at.append(time.monotonic() - started))
    assert first_at and first_at[0] < 1.8, first_at


def test_binary_and_large_output(sandbox):
    r = sandbox.commands.run("head -c 300000 /dev/zero | tr '\\0' a")
    assert r.stdout == "a" * 300000
    r = sandbox.commands.run("printf 'caf\\303\\251\\n'")
    assert r.stdout == "café\n"


def test_envs_cwd_and_default_user(sandbox):
    assert sandbox.commands.run("echo $FOO", envs={"FOO": "bar baz"}).stdout == "bar baz\n"
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    r = sandbox.commands.run("id -u; id -un; pwd; echo $HOME")
    assert r.stdout == "1000\nuser\n/home/user\n/home/user\n"


def test_user_root(sandbox):
    assert sandbox.commands.run("id -u; echo $HOME", user="root").stdout == "0\n/root\n"


def test_unknown_user_is_refused(sandbox):
    with pytest.raises(AuthenticationException):
        sandbox.commands.run("true", user="nobody-here")


def test_missing_cwd_is_an_invalid_argument(sandbox):
    with pytest.raises(InvalidArgumentException):
        sandbox.commands.run("true", cwd="/no/such/dir")


def test_timeout_raises_and_kills_the_command(sandbox):
    # envd bounds the process by Connect-Timeout-Ms: at the deadline the stream ends and the
    # process is killed (unlike a disconnect, which leaves it running).
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30 # timeout-test", timeout=1)
    assert time.monotonic() - started < 10
    wait_until("the timed-out command to be killed",
               lambda: not [p for p in sandbox.commands.list() if p.args == ["-l", "-c", "sleep 30 # timeout-test"]],
               timeout=10)


def test_background_run_list_and_kill(sandbox):
    handle = sandbox.commands.run("sleep 120", background=True, timeout=0)
    assert handle.pid > 0
    info = wait_until("the command in the list", lambda: process_by_pid(sandbox, handle.pid))
    assert (info.cmd, info.args) == ("/bin/bash", ["-l", "-c", "sleep 120"])
    assert info.tag is UNSET_STR or info.tag == UNSET_STR
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as e:
        handle.wait()
    assert e.value.exit_code == -1
    wait_until("the killed command to leave the list", lambda: process_by_pid(sandbox, handle.pid) is None)
    assert sandbox.commands.kill(handle.pid) is False


def test_handle_kill(sandbox):
    handle = sandbox.commands.run("sleep 120", background=True, timeout=0)
    assert handle.kill() is True
    with pytest.raises(CommandExitException):
        handle.wait()


def test_the_pid_is_the_guest_pid(sandbox):
    handle = sandbox.commands.run("echo $$; exec sleep 120", background=True, timeout=0)
    try:
        first = next(iter(handle))
        assert first[0] == f"{handle.pid}\n"
        # A shell in the guest can signal it by that pid.
        sandbox.commands.run(f"kill -TERM {handle.pid}")
        with pytest.raises(CommandExitException):
            handle.wait()
    finally:
        sandbox.commands.kill(handle.pid)


def test_connect_to_a_running_command(sandbox):
    handle = sandbox.commands.run("sleep 2; echo done", background=True, timeout=0)
    other = sandbox.commands.connect(handle.pid, timeout=0)
    assert other.pid == handle.pid
    result = other.wait()
    assert (result.exit_code, result.stdout) == (0, "done\n")


def test_connect_to_an_unknown_pid_raises_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999999)


def test_disconnect_leaves_the_command_running(sandbox):
    handle = sandbox.commands.run("sleep 3; echo late", background=True, timeout=0)
    handle.disconnect()
    assert process_by_pid(sandbox, handle.pid) is not None
    result = sandbox.commands.connect(handle.pid, timeout=0).wait()
    assert result.stdout == "late\n"


def test_a_command_survives_another_sandbox_object(sandbox):
    handle = sandbox.commands.run("sleep 2; echo across", background=True, timeout=0)
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.commands.connect(handle.pid, timeout=0).wait().stdout == "across\n"


def test_stdin_send_and_close(sandbox):
    skip_unless_sdk_has(hasattr(sandbox.commands, "send_stdin") and hasattr(sandbox.commands, "close_stdin"),
                        "commands.send_stdin/close_stdin")
    handle = sandbox.commands.run("cat", background=True, stdin=True, timeout=0)
    sandbox.commands.send_stdin(handle.pid, "hello ")
    handle.send_stdin(b"world")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert (result.exit_code, result.stdout) == (0, "hello world")


def test_without_stdin_a_command_reads_eof(sandbox):
    # stdin defaults to False: the process gets /dev/null, so `cat` ends at once.
    assert sandbox.commands.run("cat", timeout=10).stdout == ""


def test_send_stdin_to_an_unknown_pid_raises_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.send_stdin(999999, "x")


def test_stream_input(sandbox):
    skip_unless_sdk_has(hasattr(sandbox.commands, "stream_input"), "commands.stream_input")
    handle = sandbox.commands.run("cat", background=True, stdin=True, timeout=0)
    sandbox.commands.stream_input(handle.pid, [b"a", "b", b"c\n"])
    sandbox.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "abc\n"


def test_stream_input_to_an_unknown_pid_raises_not_found(sandbox):
    skip_unless_sdk_has(hasattr(sandbox.commands, "stream_input"), "commands.stream_input")
    with pytest.raises(NotFoundException):
        sandbox.commands.stream_input(999999, [b"x"])


def test_keepalives_at_the_requested_interval(sandbox, http, env):
    # The SDKs ask for a keepalive every 50 s; the same request with 1 s shows the server
    # sends them while a command is silent.
    body = envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 3.5; echo end"]}})
    r = connect_stream(http, env, "process.Process/Start", body, sandbox.sandbox_id, access_token(sandbox),
                       **{"Keepalive-Ping-Interval": "1"})
    events = process_events(r)
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "start"
    assert kinds[-1] == "end"
    assert 2 <= kinds.count("keepalive") <= 5, kinds
    assert events[-1]["end"].get("exitCode", 0) == 0
    assert events[-1]["end"]["exited"] is True


def test_start_stream_events_in_the_json_mapping(sandbox, http, env):
    body = envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi; exit 4"]}})
    r = connect_stream(http, env, "process.Process/Start", body, sandbox.sandbox_id, access_token(sandbox))
    events = process_events(r)
    assert isinstance(events[0]["start"]["pid"], int)
    assert stdout_of(events) == b"hi\n"
    assert events[-1]["end"]["exitCode"] == 4
    assert events[-1]["end"]["exited"] is True
    assert events[-1]["end"]["status"] == "exit status 4"


def test_silent_for_60_s_still_finishes(silent_command):
    thread, started, outcome = silent_command
    thread.join(timeout=max(0.0, SILENT_SECS + 30 - (time.monotonic() - started)))
    assert not thread.is_alive(), "the silent command did not finish"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].stdout == "x\n"

"""The async SDK (`AsyncSandbox`) where it differs from the sync one: streaming
`WatchDir`, the long-lived `StreamInput` handle (client streaming with keepalives), and
async output callbacks."""

import asyncio

import pytest
from conftest import WATCHED_EVENTS, sdk_accepts, skip_unless_sdk_has, unique, watched_changes
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FilesystemEventType,
    NotFoundException,
    SandboxState,
)
from sdk_compat import FileNotFoundException

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def wait_for(what, check, timeout=20.0, interval=0.2):
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


async def test_async_create_run_and_info(async_sandbox, env):
    r = await async_sandbox.commands.run("echo async")
    assert (r.exit_code, r.stdout) == (0, "async\n")
    info = await async_sandbox.get_info()
    assert (info.state, info.template_id) == (SandboxState.RUNNING, env.template)


async def test_async_output_callbacks(async_sandbox):
    seen = []

    async def on_stdout(s):
        seen.append(s)

    r = await async_sandbox.commands.run("echo a; sleep 0.3; echo b", on_stdout=on_stdout)
    assert seen == ["a\n", "b\n"]
    assert r.stdout == "a\nb\n"


async def test_async_exit_code(async_sandbox):
    with pytest.raises(CommandExitException) as e:
        await async_sandbox.commands.run("exit 7")
    assert e.value.exit_code == 7


async def test_stream_input_handle_with_keepalives(async_sandbox):
    skip_unless_sdk_has(hasattr(async_sandbox.commands, "stream_input"), "commands.stream_input")
    handle = await async_sandbox.commands.run("cat", background=True, stdin=True, timeout=0)
    inp = async_sandbox.commands.stream_input(handle.pid, timeout=30)
    # The SDK sends a keepalive frame after 50 s without input; a shorter interval (set
    # before the stream's task first runs) puts several keepalives between the data frames.
    inp._keepalive_interval = 0.2
    await inp.send(b"first ")
    await asyncio.sleep(1.0)
    await inp.send("second")
    await inp.close()
    await async_sandbox.commands.close_stdin(handle.pid)
    result = await handle.wait()
    assert result.stdout == "first second"


async def test_stream_input_as_a_context_manager(async_sandbox):
    skip_unless_sdk_has(hasattr(async_sandbox.commands, "stream_input"), "commands.stream_input")
    handle = await async_sandbox.commands.run("cat", background=True, stdin=True, timeout=0)
    async with async_sandbox.commands.stream_input(handle.pid) as inp:
        await inp.send(b"x")
        await inp.send(b"y")
    await async_sandbox.commands.close_stdin(handle.pid)
    assert (await handle.wait()).stdout == "xy"


async def test_stream_input_to_an_unknown_pid_raises_not_found(async_sandbox):
    skip_unless_sdk_has(hasattr(async_sandbox.commands, "stream_input"), "commands.stream_input")
    inp = async_sandbox.commands.stream_input(999999)
    await inp.send(b"x")
    with pytest.raises(NotFoundException):
        await inp.close()


async def test_watch_dir_streams_events(async_sandbox):
    path = f"/home/user/{unique('w')}"
    await async_sandbox.files.make_dir(path)
    events = []
    exits = []
    handle = await async_sandbox.files.watch_dir(
        path, on_event=lambda e: events.append((e.name, e.type)), on_exit=exits.append, recursive=True,
        timeout=60,
    )
    try:
        await async_sandbox.commands.run(watched_changes(path))
        await wait_for(f"watch events {sorted(WATCHED_EVENTS, key=str)}", lambda: WATCHED_EVENTS <= set(events))
        assert all(not name.startswith("/") for name, _ in events), events
    finally:
        await handle.stop()
    assert exits in ([], [None]), exits


async def test_watch_dir_with_entries(async_sandbox):
    skip_unless_sdk_has(sdk_accepts(async_sandbox.files.watch_dir, "include_entry"), "watch_dir(include_entry=...)")
    path = f"/home/user/{unique('we')}"
    await async_sandbox.files.make_dir(path)
    entries = []
    handle = await async_sandbox.files.watch_dir(
        path, on_event=lambda e: entries.append(e), include_entry=True, timeout=60,
    )
    try:
        await async_sandbox.files.write(f"{path}/e.txt", "entry")
        await wait_for("a create event with its entry",
                       lambda: any(e.type == FilesystemEventType.CREATE and e.entry for e in entries))
        created = next(e for e in entries if e.type == FilesystemEventType.CREATE and e.entry)
        assert created.name == "e.txt"
        assert created.entry.path == f"{path}/e.txt"
    finally:
        await handle.stop()


async def test_watch_dir_of_a_missing_directory_raises_file_not_found(async_sandbox):
    with pytest.raises(FileNotFoundException):
        await async_sandbox.files.watch_dir("/no/such/dir", on_event=lambda e: None)


async def test_async_connect_and_kill(env):
    sbx = await AsyncSandbox.create(template=env.template, timeout=600)
    try:
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        assert (await again.commands.run("echo same")).stdout == "same\n"
    finally:
        assert await sbx.kill() is True
    assert await AsyncSandbox.kill(sbx.sandbox_id) is False

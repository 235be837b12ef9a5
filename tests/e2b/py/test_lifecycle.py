"""Sandbox lifecycle through the E2B REST API: create, connect, info, kill, timeout,
pause and resume, auto-pause on timeout, and the create options SPACE refuses."""

from datetime import datetime, timedelta, timezone

import pytest
from conftest import (
    ENVD_VERSION,
    api_request,
    sdk_accepts,
    skip_unless_sdk_has,
    status_of,
    unique,
    wait_until,
)
from e2b import (
    Sandbox,
    SandboxException,
    SandboxState,
)
from sdk_compat import (
    PAUSE_ANSWERS,
    SandboxNotFoundException,
    make_pausing_on_timeout,
    pause,
    pause_answer,
)


def seconds_between(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def test_create_applies_template_timeout_metadata_and_envs(make_sandbox, env):
    sbx = make_sandbox(timeout=120, metadata={"a": "1"}, envs={"X": "y"})
    assert sbx.sandbox_id.startswith("sbx-")
    assert sbx.commands.run("echo $X").stdout == "y\n"
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.template_id == env.template
    assert info.metadata == {"a": "1"}
    assert info.state == SandboxState.RUNNING
    assert info.envd_version == ENVD_VERSION
    # The busybox template's default resources.
    assert (info.cpu_count, info.memory_mb) == (1, 256)
    assert abs(seconds_between(info.started_at, info.end_at) - 120) <= 5
    assert abs(seconds_between(datetime.now(timezone.utc), info.started_at)) <= 60


def test_create_returns_an_access_token_and_sandbox_domain(make_sandbox, env):
    sbx = make_sandbox()
    assert isinstance(sbx._envd_access_token, str) and len(sbx._envd_access_token) >= 16
    assert sbx.sandbox_domain == env.domain


def test_create_with_secure_is_accepted(make_sandbox):
    # `secure` is deprecated and ignored by the SDK; every SPACE sandbox has a token.
    sbx = make_sandbox(secure=True)
    assert sbx.commands.run("echo ok").stdout == "ok\n"


def test_create_with_the_same_idempotency_key_returns_the_same_sandbox(make_sandbox):
    skip_unless_sdk_has(sdk_accepts(Sandbox.create, "idempotency_key"), "idempotency_key")
    key = unique("idem")
    first = make_sandbox(idempotency_key=key)
    second = make_sandbox(idempotency_key=key)
    assert second.sandbox_id == first.sandbox_id


def test_default_timeout_is_300_seconds(make_sandbox, env):
    sbx = Sandbox.create(template=env.template)
    make_sandbox.adopt(sbx)
    info = sbx.get_info()
    assert abs(seconds_between(info.started_at, info.end_at) - 300) <= 5


def test_mcp_is_refused_as_not_supported(env):
    with pytest.raises(SandboxException) as e:
        Sandbox.create(template=env.template, mcp={"exa": {"apiKey": "k"}})
    assert status_of(e.value) == 400
    assert "not supported" in str(e.value)


def test_volume_mounts_are_refused_as_not_supported(env):
    skip_unless_sdk_has(sdk_accepts(Sandbox.create, "volume_mounts"), "create(volume_mounts=...)")
    with pytest.raises(SandboxException) as e:
        Sandbox.create(template=env.template, volume_mounts={"/mnt/data": "vol-1"})
    assert status_of(e.value) == 400
    assert "not supported" in str(e.value)


def test_create_from_an_unknown_template_fails(env):
    with pytest.raises(SandboxException) as e:
        Sandbox.create(template=unique("no-such-template"))
    assert status_of(e.value) in (400, 404)


def test_get_info_of_an_unknown_sandbox_raises_not_found():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info("sbx-00000000000000000000")


def test_kill_returns_true_then_false(make_sandbox):
    sbx = make_sandbox()
    assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        sbx.get_info()
    with pytest.raises(SandboxNotFoundException):
        sbx.set_timeout(30)
    with pytest.raises(SandboxNotFoundException):
        pause(sbx)


def test_is_running_follows_the_sandbox(make_sandbox):
    sbx = make_sandbox()
    assert sbx.is_running() is True
    sbx.kill()
    assert sbx.is_running() is False


def test_set_timeout_of_zero_times_the_sandbox_out_now(make_sandbox, env):
    # As on E2B (KeepAliveFor of zero): the deadline is now, and the reconciler's next pass
    # (one a second) does the timeout action as at any deadline; by default a kill.
    sbx = make_sandbox()
    sbx.set_timeout(0)

    def killed():
        try:
            sbx.get_info()
        except SandboxNotFoundException:
            return True
        return False

    wait_until("the timeout to kill the sandbox", killed, timeout=10, interval=0.2)
    with pytest.raises(SandboxNotFoundException):
        sbx.get_info()
    paused = make_pausing_on_timeout(make_sandbox, env.template)
    paused.set_timeout(0)
    wait_until("the timeout to pause the sandbox",
               lambda: paused.get_info().state == SandboxState.PAUSED, timeout=10, interval=0.2)
    assert paused.get_info().state == SandboxState.PAUSED
    Sandbox.connect(paused.sandbox_id)
    assert paused.commands.run("echo back").stdout == "back\n"


def test_set_timeout_moves_end_at(make_sandbox):
    sbx = make_sandbox(timeout=300)
    sbx.set_timeout(30)
    info = sbx.get_info()
    expected = datetime.now(timezone.utc) + timedelta(seconds=30)
    assert abs(seconds_between(info.end_at, expected)) <= 5
    sbx.set_timeout(900)
    later = sbx.get_info().end_at
    assert abs(seconds_between(later, datetime.now(timezone.utc) + timedelta(seconds=900))) <= 5


def is_gone(sandbox_id: str) -> bool:
    try:
        Sandbox.get_info(sandbox_id)
    except SandboxNotFoundException:
        return True
    return False


def test_an_expired_sandbox_is_gone(make_sandbox):
    sbx = make_sandbox()
    sbx.set_timeout(1)
    wait_until("the sandbox to expire", lambda: is_gone(sbx.sandbox_id), timeout=30, interval=0.5)
    assert Sandbox.kill(sbx.sandbox_id) is False


def test_connect_to_a_running_sandbox(make_sandbox, http, env):
    sbx = make_sandbox()
    sbx.files.write("/tmp/mark", "m")
    same = Sandbox.connect(sbx.sandbox_id)
    assert same.sandbox_id == sbx.sandbox_id
    # The same token as at create: it is derived, not stored (section 3.6).
    assert same._envd_access_token == sbx._envd_access_token
    assert same.files.read("/tmp/mark") == "m"
    # E2B answers 200 for a sandbox that was running.
    r = api_request(http, env, "POST", f"/v2/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 300})
    assert r.status_code == 200, r.text
    assert r.json()["sandboxID"] == sbx.sandbox_id


def test_connect_to_a_killed_sandbox_raises_not_found(make_sandbox):
    sbx = make_sandbox()
    sbx.kill()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)


def test_pause_true_then_false_and_connect_resumes_with_memory(make_sandbox):
    sbx = make_sandbox()
    bg = sbx.commands.run("sleep 600", background=True, timeout=0)
    sbx.files.write("/tmp/before-pause", "kept")
    assert pause(sbx) is pause_answer(True)
    assert sbx.get_info().state == SandboxState.PAUSED
    # Already paused: E2B answers 409, which the SDK returns as False.
    assert pause(sbx) is pause_answer(False)
    assert sbx.get_info().state == SandboxState.PAUSED
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.get_info().state == SandboxState.RUNNING
    assert resumed.files.read("/tmp/before-pause") == "kept"
    # A memory pause keeps the processes.
    assert bg.pid in [p.pid for p in resumed.commands.list()]


def test_connect_to_a_paused_sandbox_answers_201(make_sandbox, http, env):
    sbx = make_sandbox()
    assert pause(sbx) is pause_answer(True)
    r = api_request(http, env, "POST", f"/v2/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 300})
    assert r.status_code == 201, r.text
    assert r.json()["envdAccessToken"] == sbx._envd_access_token
    assert sbx.commands.run("echo back").stdout == "back\n"


def test_pause_filesystem_mode_stops_and_connect_cold_boots(make_sandbox):
    skip_unless_sdk_has(PAUSE_ANSWERS and sdk_accepts(Sandbox.pause, "mode"), "pause(mode=...)")
    sbx = make_sandbox()
    bg = sbx.commands.run("sleep 600", background=True, timeout=0)
    sbx.commands.run("echo disk > /home/user/kept.txt && sync")
    assert sbx.pause(mode="filesystem") is True
    assert sbx.get_info().state == SandboxState.PAUSED
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.files.read("/home/user/kept.txt") == "disk\n"
    # Only the disk was kept: the process is gone.
    assert [p for p in resumed.commands.list() if p.pid == bg.pid and p.args == ["-l", "-c", "sleep 600"]] == []


def test_connect_with_reboot_cold_boots_a_paused_sandbox(make_sandbox):
    skip_unless_sdk_has(sdk_accepts(Sandbox.connect, "on_resume"), "connect(on_resume=...)")
    sbx = make_sandbox()
    bg = sbx.commands.run("sleep 600", background=True, timeout=0)
    sbx.commands.run("echo disk > /home/user/kept.txt && sync")
    assert pause(sbx) is pause_answer(True)
    resumed = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")
    assert resumed.files.read("/home/user/kept.txt") == "disk\n"
    assert [p for p in resumed.commands.list() if p.pid == bg.pid and p.args == ["-l", "-c", "sleep 600"]] == []


def test_connect_with_a_timeout_sets_the_new_end(make_sandbox):
    sbx = make_sandbox(timeout=60)
    assert pause(sbx) is pause_answer(True)
    Sandbox.connect(sbx.sandbox_id, timeout=900)
    info = sbx.get_info()
    assert info.state == SandboxState.RUNNING
    assert abs(seconds_between(info.end_at, datetime.now(timezone.utc) + timedelta(seconds=900))) <= 5


def test_connect_to_a_running_sandbox_never_shortens_its_timeout(make_sandbox):
    # As on E2B (its connect keeps the later end): an agent reconnecting with a short
    # timeout does not cut short a sandbox someone extended; a longer one extends it.
    sbx = make_sandbox(timeout=600)
    Sandbox.connect(sbx.sandbox_id, timeout=30)
    end = sbx.get_info().end_at
    assert abs(seconds_between(end, datetime.now(timezone.utc) + timedelta(seconds=600))) <= 10
    Sandbox.connect(sbx.sandbox_id, timeout=1200)
    end = sbx.get_info().end_at
    assert abs(seconds_between(end, datetime.now(timezone.utc) + timedelta(seconds=1200))) <= 10


def test_on_timeout_pause_then_auto_resume(make_sandbox):
    skip_unless_sdk_has(sdk_accepts(Sandbox.create, "lifecycle"), "create(lifecycle=...)")
    sbx = make_sandbox(lifecycle={"on_timeout": "pause", "auto_resume": True})
    info = sbx.get_info()
    assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
    sbx.files.write("/tmp/survives", "yes")
    sbx.set_timeout(2)
    wait_until("the timeout to pause the sandbox",
               lambda: sbx.get_info().state == SandboxState.PAUSED, timeout=30, interval=0.5)
    # Paused, not killed: it is still listed, and the next envd request wakes it.
    assert sbx.commands.run("cat /tmp/survives").stdout == "yes"
    assert sbx.get_info().state == SandboxState.RUNNING


def test_on_timeout_pause_without_auto_resume_needs_connect(make_sandbox, env):
    sbx = make_pausing_on_timeout(make_sandbox, env.template)
    sbx.set_timeout(2)
    wait_until("the timeout to pause the sandbox",
               lambda: sbx.get_info().state == SandboxState.PAUSED, timeout=30, interval=0.5)
    assert sbx.is_running() is False
    Sandbox.connect(sbx.sandbox_id)
    assert sbx.commands.run("echo up").stdout == "up\n"



def test_logs_are_the_lifecycle_log(make_sandbox, http, env):
    # Neither SDK's Sandbox reads logs; the E2B CLI and dashboards call these routes.
    sbx = make_sandbox()
    assert pause(sbx) is pause_answer(True)
    Sandbox.connect(sbx.sandbox_id)
    r = api_request(http, env, "GET", f"/v2/sandboxes/{sbx.sandbox_id}/logs")
    assert r.status_code == 200, r.text
    messages = [e["message"] for e in r.json()["logs"]]
    assert any(m.startswith("creating → running") for m in messages), messages
    # The E2B pause is SPACE's suspend (the test server has an object store).
    assert any(m.startswith("running → suspending") for m in messages), messages
    assert all(e["level"] in ("info", "warn") for e in r.json()["logs"])
    newest = api_request(http, env, "GET", f"/v2/sandboxes/{sbx.sandbox_id}/logs?direction=backward&limit=1")
    assert newest.json()["logs"][0]["message"].startswith("resuming → running")
    old = api_request(http, env, "GET", f"/sandboxes/{sbx.sandbox_id}/logs")
    assert [l["line"] for l in old.json()["logs"]] == messages
    assert api_request(http, env, "GET", f"/v2/sandboxes/{sbx.sandbox_id}/logs?limit=0").status_code == 400

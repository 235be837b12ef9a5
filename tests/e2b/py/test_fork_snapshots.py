"""Fork, snapshots (create, list, delete, create a sandbox from one) and metrics."""

import time

import pytest
from conftest import SDK_VERSION, access_token, all_items, connect_unary, kill_quietly, status_of, unique, wait_until
from e2b import Sandbox, SandboxException
from sdk_compat import SandboxNotFoundException


requires_fork = pytest.mark.skipif(not hasattr(Sandbox, "fork"), reason=f"e2b {SDK_VERSION} has no fork")
requires_snapshots = pytest.mark.skipif(
    not hasattr(Sandbox, "create_snapshot"), reason=f"e2b {SDK_VERSION} has no create_snapshot"
)


@requires_fork
def test_fork_gives_independent_copies_with_their_own_tokens(make_sandbox, http, env):
    src = make_sandbox()
    src.files.write("/home/user/before-fork.txt", "forked")
    forks = src.fork(count=2)
    for f in forks:
        if isinstance(f, Sandbox):
            make_sandbox.adopt(f)
    assert all(isinstance(f, Sandbox) for f in forks), forks
    ids = {f.sandbox_id for f in forks}
    assert len(ids) == 2 and src.sandbox_id not in ids
    tokens = {access_token(f) for f in forks}
    assert len(tokens) == 2 and access_token(src) not in tokens
    for f in forks:
        assert f.files.read("/home/user/before-fork.txt") == "forked"
    # Copies, not shared disks: a write in one fork is not seen by the other or the source.
    forks[0].files.write("/home/user/only-in-fork.txt", "0")
    assert forks[1].files.exists("/home/user/only-in-fork.txt") is False
    assert src.files.exists("/home/user/only-in-fork.txt") is False
    # A fork's token opens only that fork.
    r = connect_unary(http, env, "process.Process/List", {}, src.sandbox_id, access_token(forks[0]))
    assert r.status_code == 401, r.text
    assert src.commands.run("echo src").stdout == "src\n"


@requires_fork
def test_fork_of_a_killed_sandbox_raises_not_found(make_sandbox):
    src = make_sandbox()
    src.kill()
    with pytest.raises(SandboxNotFoundException):
        src.fork(count=1)


@pytest.fixture(scope="module")
def snapshotted(env):
    """A sandbox with a file, snapshotted once as `name`; the sandbox and the snapshot are
    removed at the end."""
    sbx = Sandbox.create(template=env.template, timeout=600)
    name = unique("s1")
    snap = None
    try:
        sbx.files.write("/home/user/in-snapshot.txt", "from the snapshot")
        snap = sbx.create_snapshot(name=name)
        yield sbx, name, snap
    finally:
        kill_quietly(sbx)
        if snap is not None:
            try:
                Sandbox.delete_snapshot(snap.snapshot_id)
            except Exception:
                pass


@requires_snapshots
def test_create_snapshot_returns_its_id_and_name(snapshotted):
    sbx, name, snap = snapshotted
    assert snap.snapshot_id
    assert snap.names == [name]
    # The source keeps running.
    assert sbx.commands.run("echo running").stdout == "running\n"


@requires_snapshots
def test_create_from_a_snapshot_sees_its_files(snapshotted, make_sandbox):
    _, _, snap = snapshotted
    child = make_sandbox(template=snap.snapshot_id, envs={"FROM": "snap"}, metadata={"k": "v"})
    assert child.files.read("/home/user/in-snapshot.txt") == "from the snapshot"
    assert child.commands.run("echo $FROM").stdout == "snap\n"
    assert child.get_info().metadata == {"k": "v"}


@requires_snapshots
def test_list_snapshots_of_the_sandbox_and_of_the_tenant(snapshotted):
    sbx, _, snap = snapshotted
    of_sandbox = [s.snapshot_id for s in all_items(sbx.list_snapshots())]
    assert snap.snapshot_id in of_sandbox
    of_tenant = [s.snapshot_id for s in all_items(Sandbox.list_snapshots())]
    assert snap.snapshot_id in of_tenant


@requires_snapshots
def test_delete_snapshot_true_then_false(make_sandbox):
    sbx = make_sandbox()
    snap = sbx.create_snapshot(name=unique("gone"))
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    assert snap.snapshot_id not in [s.snapshot_id for s in all_items(sbx.list_snapshots())]


@requires_snapshots
def test_a_snapshot_outlives_its_sandbox(make_sandbox):
    sbx = make_sandbox()
    sbx.files.write("/home/user/orphan.txt", "still here")
    snap = sbx.create_snapshot(name=unique("orphan"))
    try:
        sbx.kill()
        child = make_sandbox(template=snap.snapshot_id)
        assert child.files.read("/home/user/orphan.txt") == "still here"
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)


@requires_snapshots
def test_create_snapshot_of_a_killed_sandbox_raises_not_found(make_sandbox):
    sbx = make_sandbox()
    sbx.kill()
    with pytest.raises(SandboxNotFoundException):
        sbx.create_snapshot(name=unique("none"))


def test_metrics_after_a_few_samples(sandbox):
    started = time.time()
    metrics = wait_until("metrics samples", lambda: sandbox.get_metrics(), timeout=30, interval=1)
    assert time.time() - started <= 30
    m = metrics[-1]
    assert m.cpu_count == 1
    assert 0 <= m.cpu_used_pct <= 100
    assert 0 < m.mem_used <= m.mem_total
    assert m.mem_total <= 256 * 1024 * 1024
    if hasattr(m, "mem_cache"):  # reported by later releases
        assert 0 <= m.mem_cache <= m.mem_total
    assert 0 < m.disk_used <= m.disk_total
    stamps = [x.timestamp for x in metrics]
    assert stamps == sorted(stamps)


def test_metrics_of_a_killed_sandbox_raise_not_found(make_sandbox):
    sbx = make_sandbox()
    sbx.kill()
    # 2.9 reads the 404 as a plain SandboxException ("404: ..."), later releases as not found.
    with pytest.raises(SandboxException) as e:
        sbx.get_metrics()
    assert isinstance(e.value, SandboxNotFoundException) or status_of(e.value) == 404, e.value

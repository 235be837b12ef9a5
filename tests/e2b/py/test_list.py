"""`Sandbox.list`: metadata, state, start-time and template filters, order, and cursor
pagination (`x-next-token`)."""

import time

import pytest
from conftest import all_items, kill_quietly, sdk_accepts, skip_unless_sdk_has, unique
from e2b import Sandbox, SandboxQuery, SandboxState
from sdk_compat import pause, pause_answer


@pytest.fixture(scope="module")
def listed(env):
    """Three sandboxes tagged with this run's label, the third created over a second
    after the others (for `started_after`); the second is paused."""
    run = unique("list")
    made = []
    try:
        for i in range(3):
            if i == 2:
                time.sleep(1.1)
            made.append(Sandbox.create(template=env.template, timeout=600, metadata={"suite": run, "n": str(i)}))
        assert pause(made[1]) is pause_answer(True)
        yield run, made
    finally:
        for sbx in made:
            kill_quietly(sbx)


def ids(items):
    return [i.sandbox_id for i in items]


def test_list_pages_by_limit_with_next_token(listed):
    run, made = listed
    paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": run}), limit=2)
    first = paginator.next_items()
    assert len(first) == 2
    assert paginator.has_next is True
    assert paginator.next_token
    second = paginator.next_items()
    assert len(second) == 1
    assert paginator.has_next is False
    assert sorted(ids(first + second)) == sorted(ids(made))


def test_list_filters_by_metadata_and_running_state(listed):
    run, made = listed
    items = all_items(Sandbox.list(query=SandboxQuery(metadata={"suite": run}, state=[SandboxState.RUNNING]), limit=2))
    assert sorted(ids(items)) == sorted([made[0].sandbox_id, made[2].sandbox_id])
    assert {i.state for i in items} == {SandboxState.RUNNING}
    by_id = {i.sandbox_id: i for i in items}
    assert by_id[made[0].sandbox_id].metadata == {"suite": run, "n": "0"}


def test_list_shows_paused_sandboxes_with_the_paused_state(listed):
    run, made = listed
    items = Sandbox.list(query=SandboxQuery(metadata={"suite": run}, state=[SandboxState.PAUSED])).next_items()
    assert ids(items) == [made[1].sandbox_id]
    assert items[0].state == SandboxState.PAUSED


def test_list_without_a_state_shows_running_and_paused(listed):
    run, made = listed
    items = Sandbox.list(query=SandboxQuery(metadata={"suite": run})).next_items()
    assert sorted(ids(items)) == sorted(ids(made))


def test_list_metadata_filter_needs_every_pair(listed):
    run, made = listed
    items = Sandbox.list(query=SandboxQuery(metadata={"suite": run, "n": "2"})).next_items()
    assert ids(items) == [made[2].sandbox_id]
    assert Sandbox.list(query=SandboxQuery(metadata={"suite": run, "n": "9"})).next_items() == []


def test_list_orders_by_start_time(listed):
    skip_unless_sdk_has(sdk_accepts(Sandbox.list, "order"), "list(order=...)")
    run, made = listed
    query = SandboxQuery(metadata={"suite": run})
    asc = all_items(Sandbox.list(query=query, order="asc", limit=1))
    assert ids(asc) == ids(made)
    desc = Sandbox.list(query=query, order="desc").next_items()
    assert ids(desc) == list(reversed(ids(made)))


def test_list_filters_by_started_after(listed):
    skip_unless_sdk_has(sdk_accepts(SandboxQuery, "started_after"), "SandboxQuery(started_after=...)")
    run, made = listed
    third = made[2].get_info()
    items = Sandbox.list(query=SandboxQuery(metadata={"suite": run}, started_after=third.started_at)).next_items()
    assert ids(items) == [made[2].sandbox_id]


def test_list_filters_by_template(listed, env):
    skip_unless_sdk_has(sdk_accepts(SandboxQuery, "template"), "SandboxQuery(template=...)")
    run, made = listed
    items = Sandbox.list(query=SandboxQuery(metadata={"suite": run}, template=env.template)).next_items()
    assert sorted(ids(items)) == sorted(ids(made))
    assert Sandbox.list(query=SandboxQuery(metadata={"suite": run}, template=unique("other"))).next_items() == []


def test_list_items_carry_the_detail_fields(listed, env):
    run, made = listed
    items = Sandbox.list(query=SandboxQuery(metadata={"suite": run, "n": "0"})).next_items()
    assert len(items) == 1
    item = items[0]
    assert item.template_id == env.template
    assert (item.cpu_count, item.memory_mb) == (1, 256)
    assert item.end_at > item.started_at


def test_list_of_another_tenant_does_not_show_these_sandboxes(listed, env):
    run, _ = listed
    assert Sandbox.list(query=SandboxQuery(metadata={"suite": run}), api_key=env.other_api_key).next_items() == []

"""E2B template builds with the Python SDK's own builder (`Template().from_template()...`,
`Template.build`): steps, a `COPY` with a mode, a `RUN` as root, a start command with a ready
check; the files uploaded by the SDK's hash to the signed URL SPACE hands out; the build
log followed by `logsOffset`; a sandbox of the template has it all; a failing step is the
SDK's BuildException."""

import pytest
from conftest import sdk_accepts, unique
from e2b import BuildException, Sandbox, Template, wait_for_file


def build(template, name, **opts):
    """`Template.build(t, name)`; releases before the name argument (2.9) take `alias=`."""
    if sdk_accepts(Template.build, "name"):
        return Template.build(template, name, **opts)
    return Template.build(template, alias=name, **opts)


def test_a_template_from_steps_files_and_a_start_command(env, tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "hello.txt").write_text("hello from python\n")
    (tmp_path / "notes.txt").write_text("notes\n")
    template = (
        Template(file_context_path=str(tmp_path))
        .from_template(env.template)
        .set_envs({"APP_MODE": "py"})
        .copy("app", "/home/user/app")
        .copy("notes.txt", "/home/user/notes.txt", mode=0o640)
        .run_cmd('echo "$APP_MODE $(id -un)" > /home/user/built.txt')
        .run_cmd("touch /made-by-root", user="root")
        .set_start_cmd("touch /tmp/py-ready; while :; do sleep 1; done", wait_for_file("/tmp/py-ready"))
    )
    name = unique("py-tpl")
    logs = []
    build(template, name, on_build_logs=lambda e: logs.append(str(getattr(e, "message", e))))
    assert any("start command ready after" in line for line in logs), logs
    sbx = Sandbox.create(name)
    try:
        out = sbx.commands.run(
            "cat /home/user/app/hello.txt /home/user/built.txt; stat -c %a /home/user/notes.txt; "
            "ls /made-by-root; test -f /tmp/py-ready && echo ready"
        )
        assert out.stdout == "hello from python\npy user\n640\n/made-by-root\nready\n"
    finally:
        sbx.kill()


def test_a_failing_step_is_a_build_exception(env):
    template = Template().from_template(env.template).run_cmd("exit 4")
    with pytest.raises(BuildException) as e:
        build(template, unique("py-bad"))
    assert "exited with code 4" in str(e.value)


def test_a_teams_template_is_its_own(env, tmp_path):
    """Another team's build makes a template of its own (its `COPY` uploaded with its own
    key): it starts sandboxes from it by name; the first team's key does not find it."""
    (tmp_path / "hello.txt").write_text("hello, team\n")
    template = (
        Template(file_context_path=str(tmp_path))
        .from_template(env.template)
        .set_envs({"TEAM": "other"})
        .copy("hello.txt", "/home/user/hello.txt")
    )
    name = unique("py-team")
    build(template, name, api_key=env.other_api_key)
    sbx = Sandbox.create(name, api_key=env.other_api_key)
    try:
        out = sbx.commands.run('echo "$TEAM"; cat /home/user/hello.txt')
        assert out.stdout == "other\nhello, team\n"
    finally:
        sbx.kill()
    with pytest.raises(Exception) as e:
        Sandbox.create(name)
    assert "not found" in str(e.value).lower(), e.value

"""What older E2B SDK releases name or read otherwise than the pinned one: exception
classes, calls (`pause` and `beta_pause`), and how they read some answers. Everything is
found by looking the class, call or code up, never by the version.

Newer releases raise a subclass where older ones raise its parent (a missing file is a
`FileNotFoundException(NotFoundException)` since 2.x, a plain `NotFoundException` in 2.9;
a sandbox gone under a request a `SandboxNotRunningException(TimeoutException)` since
2.46). Each name here is the release's own class when it has one and the parent otherwise:
SPACE's answer is the same on the wire, the SDK's reading of it is what differs. Found by
looking the class up, never by the version.
"""

import inspect

import e2b

FileNotFoundException = getattr(e2b, "FileNotFoundException", e2b.NotFoundException)
SandboxNotFoundException = getattr(e2b, "SandboxNotFoundException", e2b.NotFoundException)
SandboxNotRunningException = getattr(e2b, "SandboxNotRunningException", e2b.TimeoutException)


# Calls older releases name otherwise. 2.9 has `beta_pause` where later releases have
# `pause`: the same request, but its instance call returns nothing (later ones True, or
# False for a sandbox paused already: the 409 SPACE answers either way).
PAUSE_ANSWERS = hasattr(e2b.Sandbox, "pause")


def pause(sbx, **opts):
    """Pauses sandbox `sbx` through whichever call the release has."""
    if PAUSE_ANSWERS:
        return sbx.pause(**opts)
    return sbx.beta_pause(**opts)


def pause_by_id(sandbox_id: str, **opts):
    """Pauses the sandbox `sandbox_id` through the release's class call."""
    call = e2b.Sandbox.pause if PAUSE_ANSWERS else e2b.Sandbox.beta_pause
    return call(sandbox_id, **opts)


def pause_answer(expected: bool):
    """What `pause` returns on this release when SPACE answered `expected`."""
    return expected if PAUSE_ANSWERS else None


def file_type(t) -> str:
    """A file type as its name: later releases give a `FileType`, 2.9 a write's as a str."""
    return getattr(t, "value", t)


def _reads_field_presence() -> bool:
    from e2b.sandbox_sync.commands import command_handle

    return "has_field(" in inspect.getsource(command_handle)


# What a string field SPACE leaves unset (a command's `error`, a process's `tag`) reads as:
# later releases check the field's presence (None), 2.9 reads the proto default ("").
UNSET_STR = None if _reads_field_presence() else ""


def make_pausing_on_timeout(make_sandbox, template: str):
    """A sandbox (made through conftest's `make_sandbox`) that its timeout pauses, without
    auto-resume: `lifecycle` in later releases; 2.9 sends `autoPause` (`beta_create`),
    which SPACE reads as the same rule."""
    from conftest import sdk_accepts

    if sdk_accepts(e2b.Sandbox.create, "lifecycle"):
        return make_sandbox(lifecycle={"on_timeout": "pause", "auto_resume": False})
    sbx = e2b.Sandbox.beta_create(template=template, timeout=600, auto_pause=True)
    make_sandbox.adopt(sbx)
    return sbx


def _reads_is_symlink() -> bool:
    from e2b.sandbox.filesystem import filesystem

    return "is_symlink" in inspect.getsource(filesystem)


# How a release shows a symlink: envd reports the target's type and marks the link with
# `is_symlink`; releases that read the mark show `FileType.SYMLINK`, older ones the type
# of what the link points to (as E2B's envd of their time reported it).
READS_IS_SYMLINK = _reads_is_symlink()

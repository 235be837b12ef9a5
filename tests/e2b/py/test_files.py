"""Files (sync SDK): `/files` uploads and downloads (multipart, octet-stream, gzip), the
filesystem.Filesystem RPCs (list, stat, mkdir, move, remove) and the polling watcher
(CreateWatcher / GetWatcherEvents / RemoveWatcher)."""

import io

import pytest
from conftest import (
    WATCHED_EVENTS,
    access_token,
    connect_unary,
    sdk_accepts,
    skip_unless_sdk_has,
    unique,
    wait_until,
    watched_changes,
)
from e2b import (
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
)
from sdk_compat import READS_IS_SYMLINK, FileNotFoundException, file_type


@pytest.fixture
def workdir(sandbox):
    """A fresh directory under the user's home for one test."""
    path = f"/home/user/{unique('t')}"
    assert sandbox.files.make_dir(path) is True
    return path


def test_write_and_read_text_bytes_and_stream(sandbox, workdir):
    info = sandbox.files.write(f"{workdir}/a.txt", "x")
    assert (info.name, info.path, file_type(info.type)) == ("a.txt", f"{workdir}/a.txt", "file")
    assert sandbox.files.read(f"{workdir}/a.txt") == "x"
    assert sandbox.files.read(f"{workdir}/a.txt", format="bytes") == bytearray(b"x")
    stream = sandbox.files.read(f"{workdir}/a.txt", format="stream")
    # Later releases give a closable stream, 2.9 a plain generator of chunks.
    if hasattr(stream, "__enter__"):
        with stream:
            assert b"".join(stream) == b"x"
    else:
        assert b"".join(stream) == b"x"


def test_a_relative_path_is_under_the_home_directory(sandbox):
    name = f"{unique('rel')}.txt"
    info = sandbox.files.write(name, "relative")
    assert info.path == f"/home/user/{name}"
    assert sandbox.commands.run(f"cat /home/user/{name}").stdout == "relative"
    assert sandbox.files.read(name) == "relative"


def test_binary_content_round_trips(sandbox, workdir):
    data = bytes(range(256)) * 64
    sandbox.files.write(f"{workdir}/bin", data)
    assert bytes(sandbox.files.read(f"{workdir}/bin", format="bytes")) == data
    assert sandbox.commands.run(f"wc -c < {workdir}/bin").stdout.strip() == str(len(data))


def test_write_overwrites_and_creates_parents(sandbox, workdir):
    sandbox.files.write(f"{workdir}/deep/er/f.txt", "first version, longer")
    sandbox.files.write(f"{workdir}/deep/er/f.txt", "second")
    assert sandbox.files.read(f"{workdir}/deep/er/f.txt") == "second"


def test_written_files_belong_to_the_user(sandbox, workdir):
    sandbox.files.write(f"{workdir}/owned.txt", "o")
    assert sandbox.commands.run(f"stat -c %U:%G {workdir}/owned.txt").stdout == "user:user\n"


def test_write_as_root(sandbox):
    path = f"/root/{unique('r')}.txt"
    sandbox.files.write(path, "root's", user="root")
    info = sandbox.files.get_info(path, user="root")
    assert (info.owner, info.group) == ("root", "root")
    assert sandbox.files.read(path, user="root") == "root's"


def test_write_files_sends_several_parts(sandbox, workdir):
    infos = sandbox.files.write_files([
        {"path": f"{workdir}/m/one.txt", "data": "1"},
        {"path": f"{workdir}/m/two.bin", "data": b"\x00\x01\x02"},
        {"path": f"{workdir}/three.txt", "data": "3"},
    ])
    assert [i.path for i in infos] == [f"{workdir}/m/one.txt", f"{workdir}/m/two.bin", f"{workdir}/three.txt"]
    assert sandbox.files.read(f"{workdir}/m/one.txt") == "1"
    assert bytes(sandbox.files.read(f"{workdir}/m/two.bin", format="bytes")) == b"\x00\x01\x02"
    assert sandbox.files.read(f"{workdir}/three.txt") == "3"


def test_a_file_like_object_is_sent_as_octet_stream(sandbox, workdir):
    info = sandbox.files.write(f"{workdir}/stream.bin", io.BytesIO(b"streamed " * 1000))
    assert info.path == f"{workdir}/stream.bin"
    assert sandbox.files.read(f"{workdir}/stream.bin") == "streamed " * 1000


def test_octet_stream_of_a_generator(sandbox, workdir):
    skip_unless_sdk_has(sdk_accepts(sandbox.files.write, "use_octet_stream"), "write(use_octet_stream=...)")
    chunks = (bytes([i]) * 4096 for i in range(64))
    try:
        sandbox.files.write(f"{workdir}/gen.bin", chunks, use_octet_stream=True)
    except InvalidArgumentException as e:
        # Raised by the SDK before sending: the release takes no generator.
        skip_unless_sdk_has("Unsupported data type" not in str(e), "uploads from a generator")
        raise
    expected = b"".join(bytes([i]) * 4096 for i in range(64))
    assert bytes(sandbox.files.read(f"{workdir}/gen.bin", format="bytes")) == expected


def test_gzip_upload_and_download(sandbox, workdir):
    skip_unless_sdk_has(sdk_accepts(sandbox.files.write, "gzip"), "write(gzip=...)")
    text = "compressible " * 5000
    sandbox.files.write(f"{workdir}/gz.txt", text, gzip=True)
    assert sandbox.commands.run(f"cat {workdir}/gz.txt").stdout == text
    assert sandbox.files.read(f"{workdir}/gz.txt", gzip=True) == text


def test_file_metadata_round_trips(sandbox, workdir):
    skip_unless_sdk_has(sdk_accepts(sandbox.files.write, "metadata"), "write(metadata=...)")
    info = sandbox.files.write(f"{workdir}/meta.txt", "m", metadata={"origin": "test", "k2": "v2"})
    assert info.path == f"{workdir}/meta.txt"
    # envd's upload answer carries the metadata read back from the file.
    assert getattr(info, "metadata", None) == {"origin": "test", "k2": "v2"}
    assert sandbox.files.get_info(f"{workdir}/meta.txt").metadata == {"origin": "test", "k2": "v2"}


def test_list_with_depth(sandbox, workdir):
    sandbox.files.write(f"{workdir}/a.txt", "a")
    sandbox.files.write(f"{workdir}/sub/b.txt", "b")
    top = sandbox.files.list(workdir)
    assert sorted((e.name, e.type) for e in top) == [("a.txt", FileType.FILE), ("sub", FileType.DIR)]
    assert {e.path for e in top} == {f"{workdir}/a.txt", f"{workdir}/sub"}
    deep = sandbox.files.list(workdir, depth=2)
    assert sorted(e.path for e in deep) == [f"{workdir}/a.txt", f"{workdir}/sub", f"{workdir}/sub/b.txt"]


def test_list_of_a_missing_directory_raises_file_not_found(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("/no/such/dir")


def test_exists(sandbox, workdir):
    sandbox.files.write(f"{workdir}/here", "")
    assert sandbox.files.exists(f"{workdir}/here") is True
    assert sandbox.files.exists(workdir) is True
    assert sandbox.files.exists(f"{workdir}/not-here") is False


def test_get_info_of_a_file_and_a_directory(sandbox, workdir):
    sandbox.files.write(f"{workdir}/f.txt", "12345")
    sandbox.commands.run(f"chmod 640 {workdir}/f.txt")
    f = sandbox.files.get_info(f"{workdir}/f.txt")
    assert (f.name, f.path, f.type, f.size) == ("f.txt", f"{workdir}/f.txt", FileType.FILE, 5)
    assert (f.mode, f.permissions) == (0o640, "-rw-r-----")
    assert (f.owner, f.group) == ("user", "user")
    assert f.modified_time is not None
    assert f.symlink_target is None
    d = sandbox.files.get_info(workdir)
    assert d.type == FileType.DIR
    assert d.permissions == "drwxr-xr-x"


def test_get_info_of_a_symlink(sandbox, workdir):
    sandbox.commands.run(f"echo t > {workdir}/target && ln -s {workdir}/target {workdir}/link")
    info = sandbox.files.get_info(f"{workdir}/link")
    assert info.symlink_target == f"{workdir}/target"


def test_a_symlink_reports_its_target_as_envd_does(sandbox, workdir):
    # envd (shared/pkg/filesystem/entry.go): the target's type and permission bits, the
    # fully resolved path, and the link's own Go mode string; a broken link has no type.
    sandbox.commands.run(
        f"cd {workdir} && mkdir real && echo t > real/f && chmod 751 real/f"
        f" && ln -s real/f rel && ln -s rel chain && ln -s real dirlink && ln -s nowhere broken"
    )
    link_type = FileType.SYMLINK if READS_IS_SYMLINK else FileType.FILE
    for name in ["rel", "chain"]:
        info = sandbox.files.get_info(f"{workdir}/{name}")
        assert (info.type, info.mode, info.permissions) == (link_type, 0o751, "Lrwxrwxrwx"), name
        assert info.symlink_target == f"{workdir}/real/f", name
    d = sandbox.files.get_info(f"{workdir}/dirlink")
    assert d.type == (FileType.SYMLINK if READS_IS_SYMLINK else FileType.DIR)
    assert d.symlink_target == f"{workdir}/real"
    broken = sandbox.files.get_info(f"{workdir}/broken")
    assert broken.symlink_target == f"{workdir}/broken"
    assert broken.mode == 0
    listed = {e.name: e for e in sandbox.files.list(workdir)}
    assert (listed["rel"].type, listed["rel"].symlink_target) == (link_type, f"{workdir}/real/f")
    # A root that is a link to a directory is listed through it, named under the link.
    inside = sandbox.files.list(f"{workdir}/dirlink")
    assert [(e.name, e.path) for e in inside] == [("f", f"{workdir}/dirlink/f")]


def test_a_write_lands_where_a_symlink_leads_and_keeps_mode_and_owner(sandbox, workdir):
    # envd writes in place (O_TRUNC): through a link, keeping the file's mode and owner.
    # SPACE's writes stay atomic (a reader never sees half a file) and keep both too.
    sandbox.files.write(f"{workdir}/run.sh", "#!/bin/sh\necho one\n")
    sandbox.commands.run(f"chmod 750 {workdir}/run.sh && ln -s run.sh {workdir}/current")
    sandbox.files.write(f"{workdir}/current", "#!/bin/sh\necho two\n", user="root")
    assert sandbox.commands.run(f"{workdir}/run.sh").stdout == "two\n"
    link = sandbox.files.get_info(f"{workdir}/current")
    assert link.permissions.startswith("L")
    f = sandbox.files.get_info(f"{workdir}/run.sh")
    assert (f.mode, f.owner, f.group) == (0o750, "user", "user")
    # A dangling link's target is created, as an in-place write through it would.
    sandbox.commands.run(f"ln -s made.txt {workdir}/dangling")
    sandbox.files.write(f"{workdir}/dangling", "new")
    assert sandbox.files.read(f"{workdir}/made.txt") == "new"


def test_rename_creates_the_parents_of_its_destination(sandbox, workdir):
    # envd's Move ensures the destination's directories.
    sandbox.files.write(f"{workdir}/m.txt", "m")
    info = sandbox.files.rename(f"{workdir}/m.txt", f"{workdir}/new/deep/m.txt")
    assert info.path == f"{workdir}/new/deep/m.txt"
    assert sandbox.files.read(f"{workdir}/new/deep/m.txt") == "m"


def test_get_info_of_a_missing_file_raises_file_not_found(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("/no/such/file")


def test_make_dir_true_then_false(sandbox, workdir):
    assert sandbox.files.make_dir(f"{workdir}/x/y") is True
    assert sandbox.files.make_dir(f"{workdir}/x/y") is False
    assert sandbox.files.get_info(f"{workdir}/x/y").type == FileType.DIR


def test_make_dir_over_a_file_raises(sandbox, workdir):
    # envd: `invalid_argument`, "already exists but it is not a directory" (the SDKs raise,
    # where a directory already there is `false`).
    sandbox.files.write(f"{workdir}/plain", "x")
    with pytest.raises(InvalidArgumentException, match="not a directory"):
        sandbox.files.make_dir(f"{workdir}/plain")


def test_remove_of_a_missing_path_succeeds(sandbox, workdir):
    # envd removes with os.RemoveAll: what is not there is removed already.
    sandbox.files.remove(f"{workdir}/never-was")
    sandbox.files.remove(f"{workdir}/no/such/dir")


def test_rename(sandbox, workdir):
    sandbox.files.write(f"{workdir}/old.txt", "moved")
    info = sandbox.files.rename(f"{workdir}/old.txt", f"{workdir}/new.txt")
    assert (info.name, info.path) == ("new.txt", f"{workdir}/new.txt")
    assert sandbox.files.exists(f"{workdir}/old.txt") is False
    assert sandbox.files.read(f"{workdir}/new.txt") == "moved"


def test_rename_of_a_missing_file_raises_file_not_found(sandbox, workdir):
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename(f"{workdir}/nope", f"{workdir}/nope2")


def test_remove_a_file_and_a_directory_tree(sandbox, workdir):
    sandbox.files.write(f"{workdir}/f", "f")
    sandbox.files.write(f"{workdir}/tree/a/b", "b")
    sandbox.files.remove(f"{workdir}/f")
    sandbox.files.remove(f"{workdir}/tree")
    assert sandbox.files.exists(f"{workdir}/f") is False
    assert sandbox.files.exists(f"{workdir}/tree") is False


def test_read_of_a_missing_file_raises_file_not_found(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/no/such/file")


def test_read_of_a_directory_is_an_invalid_argument(sandbox, workdir):
    with pytest.raises(InvalidArgumentException):
        sandbox.files.read(workdir)


def test_paths_with_dot_dot_are_resolved_as_envd_does(sandbox, workdir):
    sandbox.files.write(f"{workdir}/sub/../dotdot.txt", "resolved")
    assert sandbox.commands.run(f"cat {workdir}/dotdot.txt").stdout == "resolved"
    assert sandbox.files.read(f"{workdir}/sub/../dotdot.txt") == "resolved"


def events_of(handle, want, timeout=20.0):
    """Polls a sync WatchHandle until every (name, type) in `want` was seen."""
    seen = []

    def check():
        seen.extend((e.name, e.type) for e in handle.get_new_events())
        return want <= set(seen)

    def missing():
        return f"watch events {sorted(want - set(seen), key=str)} (seen: {seen})"

    wait_until(missing, check, timeout=timeout, interval=0.3)
    return seen


def test_watch_dir_recursive_by_polling(sandbox, workdir):
    handle = sandbox.files.watch_dir(workdir, recursive=True)
    try:
        sandbox.commands.run(watched_changes(workdir))
        seen = events_of(handle, WATCHED_EVENTS)
        assert all(not name.startswith("/") for name, _ in seen), seen
    finally:
        handle.stop()


def test_watch_dir_non_recursive_ignores_subdirectories(sandbox, workdir):
    sandbox.files.make_dir(f"{workdir}/sub")
    handle = sandbox.files.watch_dir(workdir)
    try:
        sandbox.commands.run(f"echo x > {workdir}/sub/inner.txt && echo y > {workdir}/outer.txt")
        seen = events_of(handle, {("outer.txt", FilesystemEventType.CREATE)})
        assert [s for s in seen if s[0].startswith("sub/")] == []
    finally:
        handle.stop()


def test_watch_dir_of_a_missing_directory_raises_file_not_found(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir("/no/such/dir")


def test_a_removed_watcher_is_gone(sandbox, workdir, http, env):
    handle = sandbox.files.watch_dir(workdir)
    handle.stop()
    # The SDK refuses a stopped handle itself; the server must have dropped the watcher too.
    r = connect_unary(http, env, "filesystem.Filesystem/GetWatcherEvents", {"watcherId": handle._watcher_id},
                      sandbox.sandbox_id, access_token(sandbox))
    assert r.status_code == 404, r.text
    assert r.json()["code"] == "not_found"

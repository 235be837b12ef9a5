"""Bad input: forged sandbox ids, missing or wrong access tokens, another tenant's
credentials, malformed Connect requests, oversized uploads and bad API keys. After each
malformed request the server must still serve the sandbox."""

import socket
import struct
import time
import urllib.parse

import pytest
from conftest import (
    access_token,
    api_request,
    connect_stream,
    connect_unary,
    envd_headers,
    envelope,
    forged_sandbox,
    kill_quietly,
    process_events,
    sdk_accepts,
    skip_unless_sdk_has,
    stdout_of,
    stream_error_code,
)
from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxException,
)
from sdk_compat import FileNotFoundException, SandboxNotFoundException, SandboxNotRunningException, pause_by_id

FORGED_ID = "sbx-00000000000000000000"
# Shaped as SPACE's tokens are (the sandbox id, a MAC), as in tests/e2b/js/helpers.mjs.
FORGED_TOKEN = f"{FORGED_ID}.{'0' * 64}"
START = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo ok"]}}


@pytest.fixture(scope="module")
def other_tenant_sandbox(env):
    """A sandbox of the second tenant."""
    sbx = Sandbox.create(template=env.template, timeout=600, api_key=env.other_api_key)
    yield sbx
    kill_quietly(sbx)


@pytest.fixture
def still_healthy(sandbox):
    """Checks after the test that the shared sandbox still runs commands."""
    yield
    assert sandbox.commands.run("echo healthy").stdout == "healthy\n"


# --- Which sandbox: E2b-Sandbox-Id ---

def test_an_unknown_sandbox_id_answers_502_was_not_found(http, env):
    r = http.get(f"{env.url}/health", headers=envd_headers(FORGED_ID, None))
    assert r.status_code == 502
    assert r.json()["code"] == 502
    assert "was not found" in r.json()["message"]


def test_a_malformed_sandbox_id_answers_502(http, env):
    r = connect_unary(http, env, "process.Process/List", {}, "not-an-id/../x", "t")
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]


def test_the_sdk_reports_a_forged_sandbox_as_not_running():
    sbx = forged_sandbox(FORGED_ID, FORGED_TOKEN)
    assert sbx.is_running() is False
    with pytest.raises(SandboxNotRunningException):
        sbx.commands.run("true")
    with pytest.raises(SandboxNotRunningException):
        sbx.files.read("/etc/hostname")
    with pytest.raises(SandboxNotRunningException):
        sbx.files.list("/")


def test_health_of_a_running_sandbox_needs_no_token(sandbox, http, env):
    r = http.get(f"{env.url}/health", headers=envd_headers(sandbox.sandbox_id, None))
    assert r.status_code == 204


# --- Access token ---

def test_no_access_token_answers_401(sandbox, http, env):
    r = connect_unary(http, env, "process.Process/List", {}, sandbox.sandbox_id, None)
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"
    r = http.get(f"{env.url}/files", params={"path": "/etc/hostname"}, headers=envd_headers(sandbox.sandbox_id, None))
    assert r.status_code == 401
    assert r.json()["code"] == 401


def test_a_wrong_access_token_answers_401(sandbox, http, env):
    r = connect_unary(http, env, "filesystem.Filesystem/Stat", {"path": "/"}, sandbox.sandbox_id, "wrong")
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"
    r = connect_stream(http, env, "process.Process/Start", envelope(START), sandbox.sandbox_id, "wrong")
    if r.status_code == 200:
        assert stream_error_code(r) == "unauthenticated"
    else:
        assert r.status_code == 401


def test_an_upload_without_the_token_reads_401_not_a_reset_connection(sandbox, env):
    # Refused before its body is read, the server must still read the body before it
    # answers: a server that answers and closes while the client is still sending resets
    # the connection, and the client loses the answer. Sent by hand, with a pause in the
    # middle of the body, so a server that does not wait is caught every time.
    url = urllib.parse.urlsplit(env.url)
    body_len = 2 << 20
    for token in (None, "wrong"):
        headers = envd_headers(sandbox.sandbox_id, token, **{"Content-Type": "application/octet-stream"})
        head = f"POST /files?path=/tmp/refused HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: {body_len}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        with socket.create_connection((url.hostname, url.port or 80), timeout=30) as conn:
            conn.sendall(head.encode() + b"x" * (body_len // 2))
            time.sleep(0.5)
            conn.sendall(b"x" * (body_len // 2))
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = conn.recv(65536)
                assert chunk, f"connection closed before an answer: {answer!r}"
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert not sandbox.files.exists("/tmp/refused")


def test_the_sdk_raises_authentication_exception_without_the_token(sandbox):
    for token in (None, "wrong"):
        sbx = forged_sandbox(sandbox.sandbox_id, token)
        with pytest.raises(AuthenticationException):
            sbx.commands.run("true")
        with pytest.raises(AuthenticationException):
            sbx.files.read("/etc/hostname")
        with pytest.raises(AuthenticationException):
            sbx.files.write("/tmp/x", "x")
        with pytest.raises(AuthenticationException):
            sbx.files.exists("/tmp")


def test_an_authorization_header_is_not_an_api_key_for_envd(sandbox, http, env):
    # envd's Authorization is Basic "<user>:" (which user), never a credential: with the
    # real token it selects the user, without it nothing is allowed.
    basic = {"Authorization": "Basic cm9vdDo="}  # "root:"
    body = envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "id -u"]}})
    r = connect_stream(http, env, "process.Process/Start", body, sandbox.sandbox_id, access_token(sandbox), **basic)
    assert stdout_of(process_events(r)) == b"0\n"
    r = connect_unary(http, env, "process.Process/List", {}, sandbox.sandbox_id, None)
    assert r.status_code == 401
    r = http.post(f"{env.url}/process.Process/List", content="{}", headers=envd_headers(
        sandbox.sandbox_id, None, **{"Content-Type": "application/json", "Authorization": f"Bearer {env.api_key}"}))
    assert r.status_code == 401


# --- Tenancy ---

def test_another_tenants_token_does_not_open_this_sandbox(sandbox, other_tenant_sandbox, http, env):
    r = connect_unary(http, env, "process.Process/List", {}, sandbox.sandbox_id, access_token(other_tenant_sandbox))
    assert r.status_code == 401
    with pytest.raises(AuthenticationException):
        forged_sandbox(sandbox.sandbox_id, access_token(other_tenant_sandbox)).files.read("/etc/hostname")


def test_another_tenants_api_key_sees_no_such_sandbox(sandbox, env):
    other = {"api_key": env.other_api_key}
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, **other)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id, **other)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(sandbox.sandbox_id, 5, **other)
    with pytest.raises(SandboxNotFoundException):
        pause_by_id(sandbox.sandbox_id, **other)
    assert Sandbox.kill(sandbox.sandbox_id, **other) is False
    # ...and the sandbox is untouched.
    assert sandbox.commands.run("echo mine").stdout == "mine\n"


# --- REST API key ---

def test_a_bad_api_key_raises_authentication_exception(env, http):
    with pytest.raises(AuthenticationException):
        Sandbox.create(template=env.template, api_key="space_not_a_key")
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="space_not_a_key").next_items()
    r = api_request(http, env, "GET", "/v2/sandboxes", api_key="space_not_a_key")
    assert r.status_code == 401
    assert r.json()["code"] == 401
    r = http.get(f"{env.api_url}/v2/sandboxes")
    assert r.status_code == 401


def test_rest_errors_have_an_integer_code(http, env):
    r = api_request(http, env, "GET", f"/sandboxes/{FORGED_ID}")
    assert r.status_code == 404
    body = r.json()
    assert body["code"] == 404
    assert isinstance(body["message"], str) and body["message"]


# --- Malformed Connect requests ---

@pytest.mark.parametrize("body, code", [
    pytest.param(struct.pack(">BI", 0, 0xFFFFFFFF) + b"{}", "resource_exhausted", id="length 0xFFFFFFFF"),
    pytest.param(struct.pack(">BI", 0, 100) + b'{"process":', "invalid_argument", id="truncated frame"),
    pytest.param(b"\x00\x00\x00", "invalid_argument", id="truncated header"),
    pytest.param(envelope(START, flags=0x01), "invalid_argument", id="compressed flag"),
    pytest.param(envelope(b"{not json"), "invalid_argument", id="invalid JSON"),
    pytest.param(b"", "invalid_argument", id="no message"),
])
def test_malformed_start_stream(sandbox, http, env, still_healthy, body, code):
    r = connect_stream(http, env, "process.Process/Start", body, sandbox.sandbox_id, access_token(sandbox))
    assert stream_error_code(r) == code


def test_malformed_unary_json_is_an_invalid_argument(sandbox, http, env, still_healthy):
    r = connect_unary(http, env, "filesystem.Filesystem/Stat", b"{not json", sandbox.sandbox_id,
                      access_token(sandbox))
    assert r.status_code == 400
    assert r.json()["code"] == "invalid_argument"


def test_a_wrong_content_type_answers_415(sandbox, http, env, still_healthy):
    r = connect_unary(http, env, "filesystem.Filesystem/Stat", '{"path": "/"}', sandbox.sandbox_id,
                      access_token(sandbox), content_type="text/plain")
    assert r.status_code == 415


def test_the_binary_codec_is_unimplemented(sandbox, http, env, still_healthy):
    r = connect_unary(http, env, "filesystem.Filesystem/Stat", b"\x0a\x01/", sandbox.sandbox_id,
                      access_token(sandbox), content_type="application/proto")
    assert r.status_code == 501
    assert r.json()["code"] == "unimplemented"


def test_an_unknown_method_is_unimplemented(sandbox, http, env, still_healthy):
    r = connect_unary(http, env, "process.Process/NoSuchMethod", {}, sandbox.sandbox_id, access_token(sandbox))
    assert r.status_code == 501
    assert r.json()["code"] == "unimplemented"
    r = connect_unary(http, env, "nosuch.Service/Method", {}, sandbox.sandbox_id, access_token(sandbox))
    assert r.status_code == 501
    assert r.json()["code"] == "unimplemented"


def test_get_on_an_rpc_answers_405(sandbox, http, env, still_healthy):
    r = http.get(f"{env.url}/process.Process/List", headers=envd_headers(sandbox.sandbox_id, access_token(sandbox)))
    assert r.status_code == 405


def test_a_huge_stream_input_frame_is_refused(sandbox, http, env, still_healthy):
    handle = sandbox.commands.run("cat", background=True, stdin=True, timeout=0)
    try:
        start = envelope({"start": {"process": {"pid": handle.pid}}})
        huge = struct.pack(">BI", 0, 64 * 1024 * 1024) + b"x" * 1024
        r = connect_stream(http, env, "process.Process/StreamInput", start + huge, sandbox.sandbox_id,
                           access_token(sandbox))
        assert stream_error_code(r) == "resource_exhausted"
    finally:
        sandbox.commands.kill(handle.pid)


# --- Uploads over the limit ---

def over_the_limit(env) -> int:
    size = env.max_upload_bytes + 1
    assert size <= 64 * 1024 * 1024, "the harness should start the server with a small --max-upload-bytes"
    return size


def test_a_multipart_upload_over_the_limit_is_413_and_leaves_no_file(sandbox, env, still_healthy):
    with pytest.raises(SandboxException) as e:
        sandbox.files.write("/home/user/too-big.bin", b"\0" * over_the_limit(env))
    assert type(e.value) is SandboxException
    assert str(e.value).startswith("413")
    assert sandbox.files.exists("/home/user/too-big.bin") is False


def test_an_octet_stream_upload_over_the_limit_is_413_and_leaves_no_file(sandbox, env, still_healthy):
    skip_unless_sdk_has(sdk_accepts(sandbox.files.write, "use_octet_stream"), "write(use_octet_stream=...)")
    size = over_the_limit(env)
    chunks = (b"\0" * min(65536, size - i) for i in range(0, size, 65536))
    with pytest.raises(SandboxException) as e:
        sandbox.files.write("/home/user/too-big-stream.bin", chunks, use_octet_stream=True)
    # Raised by the SDK before sending: the release takes no generator.
    skip_unless_sdk_has("Unsupported data type" not in str(e.value), "uploads from a generator")
    assert type(e.value) is SandboxException
    assert str(e.value).startswith("413")
    assert sandbox.files.exists("/home/user/too-big-stream.bin") is False


def test_an_upload_at_the_limit_is_accepted(sandbox, env):
    size = over_the_limit(env) - 1
    # As an octet stream where the release can send one (the body is then the file alone).
    octet = {"use_octet_stream": True} if sdk_accepts(sandbox.files.write, "use_octet_stream") else {}
    sandbox.files.write("/home/user/at-limit.bin", b"\1" * size, **octet)
    assert sandbox.files.get_info("/home/user/at-limit.bin").size == size
    sandbox.files.remove("/home/user/at-limit.bin")
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("/home/user/at-limit.bin")

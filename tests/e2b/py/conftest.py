"""Shared fixtures and helpers of SPACE's E2B compatibility suite (an `e2b` Python SDK release).

The harness (crates/test-support/tests/e2b_sdk.rs) starts a SPACE server and runs
`target/e2b/py/<version>/bin/python -m pytest tests/e2b/py` with, in the environment:

- E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN: what the SDK reads (the key in the
  E2B format, `e2b_<hex>`; both URLs `http://127.0.0.1:PORT`, the domain `space.test:PORT`);
  never E2B_DEBUG;
- SPACE_E2B_SDK_VERSION: the SDK release the harness means (checked against the installed one);
- SPACE_E2B_TEMPLATE: the template sandboxes are created from (`busybox` in tests);
- SPACE_E2B_OTHER_API_KEY: an API key of a second tenant;
- SPACE_E2B_MAX_UPLOAD_BYTES: the server's `--max-upload-bytes`;
- SPACE_E2B_URL: the server's base URL, for raw requests.

Every sandbox a test creates is killed when the test (or, for the shared one, the
module) ends, whatever its outcome. Helpers live here, not in the test files.
"""

import base64
import importlib.metadata
import inspect
import json
import re
import os
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import httpx
import pytest
import pytest_asyncio
from e2b import AsyncSandbox, FilesystemEventType, Sandbox
from e2b.connection_config import ConnectionConfig
from packaging.version import Version

# The envd version SPACE reports (docs/e2b-compat.md, section 2): the highest the SDKs gate on.
ENVD_VERSION = "0.6.4"
ENVD_PORT = 49983
# How long a sandbox made by a test lives if its kill never comes (a crashed run).
SANDBOX_TIMEOUT_SECS = 600


# The SDK release this run drives (the suite's tests that need a call an older release lacks
# check for the call, never the version).
SDK_VERSION = importlib.metadata.version("e2b")


def pytest_sessionstart(session) -> None:
    """Fails the run when the venv holds another release than the harness asked for."""
    wanted = _required("SPACE_E2B_SDK_VERSION")
    if wanted != SDK_VERSION:
        raise pytest.UsageError(f"the harness asked for e2b {wanted}, the venv has {SDK_VERSION}")


def sdk_accepts(call, parameter: str) -> bool:
    """Whether an SDK call takes `parameter` (releases add parameters over time)."""
    return parameter in inspect.signature(call).parameters


def skip_unless_sdk_has(present: bool, what: str) -> None:
    """Skips a test of a call or parameter this SDK release does not have (not a SPACE
    behaviour: the release cannot send the request)."""
    if not present:
        pytest.skip(f"e2b {SDK_VERSION} has no {what}")


def status_of(exc) -> Optional[int]:
    """The HTTP status of an SDK API error: its `status_code` (2.46 on), else the status
    the older releases' message starts with (`"400: ..."`)."""
    code = getattr(exc, "status_code", None)
    if code is not None:
        return code
    m = re.match(r"\s*(\d{3})\b", str(exc))
    return int(m.group(1)) if m else None


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run the suite through the harness (see conftest.py)")
    return value


@dataclass(frozen=True)
class Env:
    """The suite's configuration, as the harness passes it."""

    api_key: str
    other_api_key: str
    api_url: str
    sandbox_url: str
    domain: str
    template: str
    max_upload_bytes: int
    url: str

    @staticmethod
    def from_environ() -> "Env":
        if os.environ.get("E2B_DEBUG"):
            raise RuntimeError("E2B_DEBUG must not be set: the SDK then makes no API calls")
        return Env(
            api_key=_required("E2B_API_KEY"),
            other_api_key=_required("SPACE_E2B_OTHER_API_KEY"),
            api_url=_required("E2B_API_URL"),
            sandbox_url=_required("E2B_SANDBOX_URL"),
            domain=_required("E2B_DOMAIN"),
            template=_required("SPACE_E2B_TEMPLATE"),
            max_upload_bytes=int(_required("SPACE_E2B_MAX_UPLOAD_BYTES")),
            url=_required("SPACE_E2B_URL").rstrip("/"),
        )


@pytest.fixture(scope="session")
def env() -> Env:
    return Env.from_environ()


def wait_until(what: str | Callable[[], str], check: Callable[[], object], timeout: float = 20.0,
               interval: float = 0.2):
    """Polls `check` until it returns a truthy value, which is returned; fails after `timeout`
    (`what`, or what it returns then, says what was awaited)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            what = what() if callable(what) else what
            pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def unique(prefix: str) -> str:
    """A name no other test (or earlier run) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def all_items(paginator) -> list:
    """Every item of a (sync) paginator, page after page."""
    items = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


def kill_quietly(sandbox) -> None:
    try:
        sandbox.kill()
    except Exception:
        pass


@pytest.fixture
def make_sandbox(env: Env):
    """Creates sandboxes (sync SDK) for one test; all are killed when it ends."""
    made: List[Sandbox] = []

    def make(**opts) -> Sandbox:
        opts.setdefault("template", env.template)
        opts.setdefault("timeout", SANDBOX_TIMEOUT_SECS)
        sbx = Sandbox.create(**opts)
        made.append(sbx)
        return sbx

    make.adopt = made.append  # sandboxes a test got another way (fork, snapshot)
    yield make
    for sbx in made:
        kill_quietly(sbx)


@pytest.fixture(scope="module")
def sandbox(env: Env):
    """One sandbox shared by a module's tests that leave its lifecycle alone."""
    sbx = Sandbox.create(template=env.template, timeout=SANDBOX_TIMEOUT_SECS)
    yield sbx
    kill_quietly(sbx)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def async_sandbox(env: Env):
    """The async SDK's shared sandbox for a module."""
    sbx = await AsyncSandbox.create(template=env.template, timeout=SANDBOX_TIMEOUT_SECS)
    yield sbx
    try:
        await sbx.kill()
    except Exception:
        pass


def forged_sandbox(sandbox_id: str, access_token: Optional[str]) -> Sandbox:
    """A sync `Sandbox` object for `sandbox_id` with the given envd access token, made
    without asking the API (as `Sandbox.connect` would build it from a response)."""
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT)}
    if access_token is not None:
        headers["X-Access-Token"] = access_token
    return Sandbox(
        sandbox_id=sandbox_id,
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=access_token,
        connection_config=ConnectionConfig(extra_sandbox_headers=headers),
    )


def access_token(sbx) -> str:
    """The sandbox's envd access token (the SDK keeps it private)."""
    token = sbx._envd_access_token
    assert isinstance(token, str) and token, "SPACE must return an envdAccessToken on create/connect"
    return token


# --- Raw requests (what the SDKs send, byte for byte, without them) ---

@pytest.fixture(scope="session")
def http():
    with httpx.Client(timeout=30.0) as client:
        yield client


def envd_headers(sandbox_id: str, token: Optional[str], **extra: str) -> Dict[str, str]:
    """The headers every envd request of the SDKs carries (section 1, envd addressing)."""
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT)}
    if token is not None:
        headers["X-Access-Token"] = token
    headers.update(extra)
    return headers


def connect_unary(http: httpx.Client, env: Env, method: str, body, sandbox_id: str, token: Optional[str],
                  content_type: str = "application/json") -> httpx.Response:
    """A Connect unary call with the JSON codec, e.g. method `process.Process/List`."""
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return http.post(
        f"{env.url}/{method}",
        content=data,
        headers=envd_headers(sandbox_id, token, **{
            "Content-Type": content_type,
            "Connect-Protocol-Version": "1",
        }),
    )


def envelope(message, flags: int = 0) -> bytes:
    """One Connect streaming envelope: flags byte, big-endian length, payload."""
    payload = message if isinstance(message, bytes) else json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def parse_envelopes(data: bytes) -> List[Tuple[int, dict]]:
    """The envelopes of a Connect streaming response body, payloads parsed as JSON. Fails
    on a truncated envelope."""
    out = []
    i = 0
    while i < len(data):
        assert len(data) - i >= 5, f"truncated envelope header at {i}: {data[i:]!r}"
        flags, length = struct.unpack(">BI", data[i:i + 5])
        payload = data[i + 5:i + 5 + length]
        assert len(payload) == length, f"truncated envelope payload at {i}"
        out.append((flags, json.loads(payload) if payload else {}))
        i += 5 + length
    return out


def connect_stream(http: httpx.Client, env: Env, method: str, body: bytes, sandbox_id: str,
                   token: Optional[str], **headers: str) -> httpx.Response:
    """A Connect streaming call with the JSON codec; `body` is the raw request (envelopes)."""
    return http.post(
        f"{env.url}/{method}",
        content=body,
        headers=envd_headers(sandbox_id, token, **{
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            **headers,
        }),
    )


def end_of_stream(resp: httpx.Response) -> dict:
    """A streaming response's end-of-stream message: Connect streams answer HTTP 200 and
    carry any error in the final envelope (flag 0x02), which must be there."""
    assert resp.status_code == 200, (resp.status_code, resp.content[:300])
    assert resp.headers["content-type"].startswith("application/connect+json"), resp.headers
    envelopes = parse_envelopes(resp.content)
    assert envelopes, "no end-of-stream envelope"
    flags, last = envelopes[-1]
    assert flags & 0x02, f"the stream did not end with an end-of-stream envelope: {envelopes!r}"
    assert all(not f & 0x02 for f, _ in envelopes[:-1]), envelopes
    return last


def process_events(resp: httpx.Response) -> List[dict]:
    """The `ProcessEvent`s of a successful Start or Connect stream."""
    assert end_of_stream(resp) == {}, end_of_stream(resp)
    return [payload["event"] for _, payload in parse_envelopes(resp.content)[:-1]]


def stdout_of(events: List[dict]) -> bytes:
    """The stdout bytes of a list of `ProcessEvent`s (base64 in the JSON mapping)."""
    return b"".join(base64.b64decode(e["data"]["stdout"]) for e in events if "stdout" in e.get("data", {}))


def stream_error_code(resp: httpx.Response) -> Optional[str]:
    err = end_of_stream(resp).get("error")
    return err and err.get("code")


def api_request(http: httpx.Client, env: Env, method: str, path: str, api_key: Optional[str] = None,
                **kwargs) -> httpx.Response:
    """An E2B REST request as the SDKs send it (`X-API-KEY`, no prefix)."""
    headers = kwargs.pop("headers", {})
    headers["X-API-KEY"] = env.api_key if api_key is None else api_key
    return http.request(method, f"{env.api_url}{path}", headers=headers, **kwargs)


def signature(path: str, operation: str, user: str, token: str, expiration: Optional[int] = None) -> str:
    """The v1 signature of a `/files` URL (section 3.6), computed independently of the SDK."""
    import hashlib

    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration is not None else "")
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")


# --- Directory watches ---

def watched_changes(path: str) -> str:
    """A shell line that makes, in `path`, the changes `WATCHED_EVENTS` lists."""
    return f"cd {path} && echo 1 > a.txt && mkdir sub && echo 2 > sub/b.txt && mv a.txt c.txt && rm c.txt"


# What a recursive watch of the directory reports for `watched_changes`, as envd does
# (inotify through fsnotify: a move is RENAME of the old name and CREATE of the new one);
# names are relative to the watched directory.
WATCHED_EVENTS = {
    ("a.txt", FilesystemEventType.CREATE),
    ("a.txt", FilesystemEventType.WRITE),
    ("sub", FilesystemEventType.CREATE),
    ("sub/b.txt", FilesystemEventType.CREATE),
    ("sub/b.txt", FilesystemEventType.WRITE),
    ("a.txt", FilesystemEventType.RENAME),
    ("c.txt", FilesystemEventType.CREATE),
    ("c.txt", FilesystemEventType.REMOVE),
}


# --- Streams read in the background ---

class PtyReader:
    """Collects a PTY's output (a sync `CommandHandle`) on a thread, so a test can type
    and then wait for what it expects to appear."""

    def __init__(self, handle):
        self.handle = handle
        self._chunks: List[bytes] = []
        self._lock = threading.Lock()
        self.error: Optional[BaseException] = None
        self.result = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            self.result = self.handle.wait(on_pty=self._on_pty)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def _on_pty(self, data: bytes):
        with self._lock:
            self._chunks.append(bytes(data))

    @property
    def output(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode("utf-8", "replace")

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        return wait_until(f"{text!r} in the PTY output", lambda: text in self.output and self.output, timeout)

    def join(self, timeout: float = 20.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the PTY stream did not end"

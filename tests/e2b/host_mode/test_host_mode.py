"""Host mode: the pinned Python SDK *without* `E2B_SANDBOX_URL`, as against E2B itself. The
SDK then reaches a sandbox's envd at `https://49983-{id}.{domain}` and its ports at
`https://{port}-{id}.{domain}`: SPACE's TLS listener serves both, by the request's host name.

The harness (`python_sdk_host_mode` in crates/test-support/tests/e2b_sdk.rs) starts a server
with a TLS listener presenting a `*.space.test` certificate of a CA of its own, and passes:
E2B_API_KEY, E2B_API_URL (plaintext), E2B_DOMAIN (`space.test:{TLS port}`), SSL_CERT_FILE (the
CA, which the SDK's rustls-based transport reads) and SPACE_E2B_TEMPLATE. Nothing resolves
`*.space.test`, so the module adds `/etc/hosts` lines for its sandbox's names (the suite
runs as root) and removes them when it ends, whatever its outcome. The SDK's transport
(pyqwest) resolves with hickory, which reads `/etc/hosts` once, when the SDK first builds
it: the module's one sandbox is created with a plain REST call and its names are in the
file before the SDK is used at all.
"""

import importlib.metadata
import os
import time
import uuid
from contextlib import contextmanager

import httpx
import pytest
from e2b import Sandbox

HOSTS = "/etc/hosts"
ENVD_PORT = 49983
PAGE = "hello over TLS\n"


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run the suite through the harness (see the module doc)")
    return value


if importlib.metadata.version("e2b") != env("SPACE_E2B_SDK_VERSION"):
    raise RuntimeError(f"the harness asked for e2b {env('SPACE_E2B_SDK_VERSION')}, "
                       f"the venv has {importlib.metadata.version('e2b')}")


@contextmanager
def resolvable(names):
    """`names` resolve to 127.0.0.1 while the block runs (lines tagged with a mark of
    their own, so concurrent runs and the file's other lines are left alone)."""
    mark = f"# space-e2b-host-mode {uuid.uuid4().hex}"
    with open(HOSTS, "a") as f:
        f.write(f"127.0.0.1 {' '.join(names)} {mark}\n")
    try:
        yield
    finally:
        with open(HOSTS) as f:
            kept = [line for line in f if mark not in line]
        # In place, not by rename: /etc/hosts may be a mount point.
        with open(HOSTS, "w") as f:
            f.writelines(kept)


@pytest.fixture(scope="module")
def sandbox():
    assert "E2B_SANDBOX_URL" not in os.environ, "host mode runs without E2B_SANDBOX_URL"
    r = httpx.post(f"{env('E2B_API_URL')}/sandboxes", headers={"X-API-Key": env("E2B_API_KEY")},
                   json={"templateID": env("SPACE_E2B_TEMPLATE"), "timeout": 600}, timeout=120)
    assert r.status_code == 201, r.text
    sandbox_id, domain = r.json()["sandboxID"], r.json()["domain"]
    names = [f"{port}-{sandbox_id}.{domain.split(':')[0]}" for port in (ENVD_PORT, 8000)]
    try:
        with resolvable(names):
            yield Sandbox.connect(sandbox_id)
    finally:
        Sandbox.kill(sandbox_id)


@pytest.fixture
def https():
    with httpx.Client(verify=env("SSL_CERT_FILE"), timeout=60) as client:
        yield client


def test_the_sandbox_domain_is_the_tls_listeners(sandbox):
    assert sandbox.sandbox_domain == env("E2B_DOMAIN")
    assert sandbox.get_host(8000) == f"8000-{sandbox.sandbox_id}.{env('E2B_DOMAIN')}"


def test_commands_and_files_reach_envd_by_name_over_https(sandbox):
    result = sandbox.commands.run("echo hi; id -un")
    assert result.stdout == "hi\nuser\n"
    sandbox.files.write("/home/user/a.txt", "over TLS")
    assert sandbox.files.read("/home/user/a.txt") == "over TLS"
    assert "a.txt" in [e.name for e in sandbox.files.list("/home/user")]
    big = os.urandom(1 << 20)
    sandbox.files.write("/home/user/big.bin", big)
    assert sandbox.files.read("/home/user/big.bin", format="bytes") == big
    handle = sandbox.commands.run("sleep 600", background=True)
    assert handle.pid in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid)


def test_get_host_reaches_a_server_in_the_sandbox_over_https(sandbox, https):
    sandbox.files.write("/home/user/www/index.html", PAGE)
    server = sandbox.commands.run("busybox httpd -f -p 8000 -h /home/user/www", background=True, timeout=0)
    url = f"https://{sandbox.get_host(8000)}/index.html"
    deadline = time.monotonic() + 30
    while True:
        r = https.get(url, headers={"e2b-traffic-access-token": sandbox.traffic_access_token})
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (r.status_code, r.text) == (200, PAGE)
    server.kill()


def test_signed_urls_work_as_given(sandbox, https):
    sandbox.files.write("/home/user/signed.txt", "signed content")
    url = sandbox.download_url("/home/user/signed.txt", use_signature_expiration=60)
    assert url.startswith(f"https://{ENVD_PORT}-{sandbox.sandbox_id}.")
    r = https.get(url)
    assert (r.status_code, r.content) == (200, b"signed content")
    up = sandbox.upload_url("/home/user/uploaded.txt")
    r = https.post(up, files={"file": ("uploaded.txt", b"via upload_url")})
    assert r.status_code == 200, r.text
    assert sandbox.files.read("/home/user/uploaded.txt") == "via upload_url"


def test_envd_by_name_still_wants_the_access_token(sandbox, https):
    url = f"https://{sandbox.get_host(ENVD_PORT)}/process.Process/List"
    headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    r = https.post(url, content="{}", headers=headers)
    assert r.status_code == 401
    r = https.post(url, content="{}", headers={**headers, "X-Access-Token": sandbox._envd_access_token})
    assert r.status_code == 200, r.text

"""Host routing (`{port}-{sandboxID}.{domain}`): `get_host` to a server in the sandbox, a
closed port, and signed `/files` URLs (`download_url`/`upload_url`), which only name their
sandbox in host mode. Requests go to the server's address with the `Host` header
`get_host` names, as a client resolving `*.space.test` to it would send them."""

import time

import pytest
from conftest import ENVD_PORT, signature, wait_until

PAGE = "hello from httpd\n"


@pytest.fixture(scope="module")
def httpd(sandbox):
    """busybox httpd serving a page on port 8000 of the shared sandbox."""
    sandbox.files.write("/home/user/www/index.html", PAGE)
    handle = sandbox.commands.run("busybox httpd -f -p 8000 -h /home/user/www", background=True, timeout=0)
    yield handle
    handle.kill()


def get(http, env, host: str, path: str = "/", **kwargs):
    return http.get(f"{env.url}{path}", headers={"Host": host, **kwargs.pop("headers", {})}, **kwargs)


def test_get_host_names_the_port_sandbox_and_domain(sandbox, env):
    assert sandbox.get_host(8000) == f"8000-{sandbox.sandbox_id}.{env.domain}"


def test_get_host_reaches_a_server_in_the_sandbox(sandbox, httpd, http, env):
    host = sandbox.get_host(8000)
    r = wait_until("httpd to answer through the host route",
                   lambda: (lambda r: r if r.status_code == 200 else None)(get(http, env, host, "/index.html")))
    assert r.text == PAGE
    missing = get(http, env, host, "/missing.html")
    assert missing.status_code == 404


def test_host_route_keeps_the_connection_for_several_requests(sandbox, httpd, http, env):
    host = sandbox.get_host(8000)
    wait_until("httpd", lambda: get(http, env, host, "/index.html").status_code == 200)
    for _ in range(5):
        r = get(http, env, host, "/index.html")
        assert (r.status_code, r.text) == (200, PAGE)


def test_a_closed_port_answers_502_port_is_not_open(sandbox, http, env):
    r = get(http, env, sandbox.get_host(8001))
    assert r.status_code == 502
    body = r.json()
    assert body["code"] == 502
    assert "port is not open" in body["message"]


def test_a_host_route_to_an_unknown_sandbox_answers_502_not_found(http, env):
    r = get(http, env, f"8000-sbx-00000000000000000000.{env.domain}")
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]


def test_download_url_is_signed_and_works_in_host_mode(sandbox, http, env):
    sandbox.files.write("/home/user/signed.txt", "signed content")
    url = sandbox.download_url("/home/user/signed.txt")
    assert "signature=v1_" in url
    r = http.get(url, headers={"Host": sandbox.get_host(ENVD_PORT)})
    assert r.status_code == 200, r.text
    assert r.content == b"signed content"


def test_download_url_with_expiration(sandbox, http, env):
    sandbox.files.write("/home/user/expiring.txt", "for a minute")
    url = sandbox.download_url("/home/user/expiring.txt", use_signature_expiration=60)
    assert "signature_expiration=" in url
    r = http.get(url, headers={"Host": sandbox.get_host(ENVD_PORT)})
    assert (r.status_code, r.content) == (200, b"for a minute")


def test_an_expired_signature_is_refused(sandbox, http, env):
    sandbox.files.write("/home/user/expired.txt", "x")
    expired = int(time.time()) - 10
    sig = signature("/home/user/expired.txt", "read", "", sandbox._envd_access_token, expired)
    r = http.get(f"{env.url}/files",
                 params={"path": "/home/user/expired.txt", "signature": sig, "signature_expiration": expired},
                 headers={"Host": sandbox.get_host(ENVD_PORT)})
    assert r.status_code == 401


def test_a_signature_is_for_its_path_and_operation_only(sandbox, http, env):
    sandbox.files.write("/home/user/a.txt", "a")
    sandbox.files.write("/home/user/b.txt", "b")
    token = sandbox._envd_access_token
    host = {"Host": sandbox.get_host(ENVD_PORT)}
    read_a = signature("/home/user/a.txt", "read", "", token)
    assert http.get(f"{env.url}/files", params={"path": "/home/user/a.txt", "signature": read_a},
                    headers=host).status_code == 200
    # Another path, or a write, with a read signature of a.txt.
    assert http.get(f"{env.url}/files", params={"path": "/home/user/b.txt", "signature": read_a},
                    headers=host).status_code == 401
    r = http.post(f"{env.url}/files", params={"path": "/home/user/a.txt", "signature": read_a},
                  files={"file": ("/home/user/a.txt", b"overwritten")}, headers=host)
    assert r.status_code == 401
    assert sandbox.files.read("/home/user/a.txt") == "a"
    # No signature and no token.
    assert http.get(f"{env.url}/files", params={"path": "/home/user/a.txt"}, headers=host).status_code == 401


def test_upload_url_accepts_a_multipart_post_in_host_mode(sandbox, http, env):
    url = sandbox.upload_url("/home/user/uploaded.txt")
    assert "signature=v1_" in url
    r = http.post(url, files={"file": ("uploaded.txt", b"via upload_url")},
                  headers={"Host": sandbox.get_host(ENVD_PORT)})
    assert r.status_code == 200, r.text
    assert r.json()[0]["path"] == "/home/user/uploaded.txt"
    assert sandbox.files.read("/home/user/uploaded.txt") == "via upload_url"


def test_envd_in_host_mode_with_the_access_token(sandbox, httpd, http, env):
    # Host mode without E2B_SANDBOX_URL: the SDK sends its envd requests to
    # 49983-{id}.{domain}; the token header is still required.
    host = sandbox.get_host(ENVD_PORT)
    r = http.post(f"{env.url}/process.Process/List", content="{}",
                  headers={"Host": host, "Content-Type": "application/json", "Connect-Protocol-Version": "1",
                           "X-Access-Token": sandbox._envd_access_token})
    assert r.status_code == 200, r.text
    assert httpd.pid in [p["pid"] for p in r.json()["processes"]]
    r = http.post(f"{env.url}/process.Process/List", content="{}",
                  headers={"Host": host, "Content-Type": "application/json", "Connect-Protocol-Version": "1"})
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"

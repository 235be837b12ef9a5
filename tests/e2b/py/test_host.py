"""Host routing (`{port}-{sandboxID}.{domain}`): `get_host` to a server in the sandbox, a
closed port, private ports (SPACE's default: the traffic token or an API key), and signed
`/files` URLs (`download_url`/`upload_url`), which only name their sandbox in host mode.
Requests go to the server's address with the `Host` header `get_host` names, as a client
resolving `*.space.test` to it would send them."""

import time

import pytest
from e2b import AuthenticationException, Sandbox, SandboxState
from conftest import ENVD_PORT, sdk_accepts, signature, skip_unless_sdk_has, wait_until

PAGE = "hello from httpd\n"
TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"


@pytest.fixture(scope="module")
def httpd(sandbox):
    """busybox httpd serving a page on port 8000 of the shared sandbox."""
    sandbox.files.write("/home/user/www/index.html", PAGE)
    handle = sandbox.commands.run("busybox httpd -f -p 8000 -h /home/user/www", background=True, timeout=0)
    yield handle
    handle.kill()


def get(http, env, host: str, path: str = "/", **kwargs):
    """A plain request to a host route (no credential unless `headers` has one)."""
    return http.get(f"{env.url}{path}", headers={"Host": host, **kwargs.pop("headers", {})}, **kwargs)


def get_port(http, env, sandbox, port: int, path: str = "/", **kwargs):
    """A request to port `port` of `sandbox` with its traffic token, as a client must send it."""
    headers = {TRAFFIC_TOKEN_HEADER: sandbox.traffic_access_token, **kwargs.pop("headers", {})}
    return get(http, env, sandbox.get_host(port), path, headers=headers, **kwargs)


def test_get_host_names_the_port_sandbox_and_domain(sandbox, env):
    assert sandbox.get_host(8000) == f"8000-{sandbox.sandbox_id}.{env.domain}"


def test_get_host_reaches_a_server_in_the_sandbox(sandbox, httpd, http, env):
    r = wait_until("httpd to answer through the host route",
                   lambda: (lambda r: r if r.status_code == 200 else None)(
                       get_port(http, env, sandbox, 8000, "/index.html")))
    assert r.text == PAGE
    missing = get_port(http, env, sandbox, 8000, "/missing.html")
    assert missing.status_code == 404


def test_host_route_keeps_the_connection_for_several_requests(sandbox, httpd, http, env):
    wait_until("httpd", lambda: get_port(http, env, sandbox, 8000, "/index.html").status_code == 200)
    for _ in range(5):
        r = get_port(http, env, sandbox, 8000, "/index.html")
        assert (r.status_code, r.text) == (200, PAGE)


def test_ports_are_private_without_the_traffic_token_or_an_api_key(sandbox, httpd, http, env):
    wait_until("httpd", lambda: get_port(http, env, sandbox, 8000, "/index.html").status_code == 200)
    host = sandbox.get_host(8000)
    for headers in [{}, {TRAFFIC_TOKEN_HEADER: "wrong"}, {TRAFFIC_TOKEN_HEADER: sandbox._envd_access_token},
                    {"X-API-Key": env.other_api_key}]:
        r = get(http, env, host, "/index.html", headers=headers)
        assert r.status_code == 403, (headers.keys(), r.text)
        assert "private" in r.json()["message"]
    # An API key of the sandbox's own tenant is a credential too.
    r = get(http, env, host, "/index.html", headers={"X-API-Key": env.api_key})
    assert (r.status_code, r.text) == (200, PAGE)


def test_a_server_on_the_guests_loopback_stays_private(sandbox, http, env):
    handle = sandbox.commands.run("busybox httpd -f -p 127.0.0.1:8003 -h /home/user/www", background=True,
                                  timeout=0)
    try:
        # `|| true`: until httpd listens, wget fails, which is "not yet", not an error.
        wait_until("httpd on loopback", lambda: sandbox.commands.run(
            "busybox wget -q -O - http://127.0.0.1:8003/index.html || true", timeout=10).stdout == PAGE)
        r = get_port(http, env, sandbox, 8003, "/index.html")
        assert r.status_code == 502, r.text
        assert "port is not open" in r.json()["message"]
    finally:
        handle.kill()


def test_the_platforms_credentials_never_reach_the_guest(sandbox, http, env):
    # A one-shot server that records the request head it gets, then answers it.
    sandbox.files.write("/tmp/respond.sh", "#!/bin/sh\n"
                        "while IFS= read -r line; do echo \"$line\" >> /tmp/seen-request;"
                        " [ \"$line\" = \"$(printf '\\r')\" ] && break; done\n"
                        "printf 'HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\nok'\n")
    sandbox.commands.run("chmod +x /tmp/respond.sh && busybox nc -l -p 8004 -e /tmp/respond.sh",
                         background=True, timeout=0)
    r = wait_until("nc to listen", lambda: (lambda r: r if r.status_code == 200 else None)(get_port(
        http, env, sandbox, 8004, "/", headers={"X-API-Key": env.api_key, "Authorization": f"Bearer {env.api_key}",
                                               "X-Access-Token": sandbox._envd_access_token,
                                               "X-Agent-Header": "kept"})))
    assert r.text == "ok"
    seen = wait_until("the request to be recorded", lambda: sandbox.files.read("/tmp/seen-request") or None)
    lowered = seen.lower()
    assert "x-agent-header: kept" in lowered, seen
    for secret in [env.api_key, sandbox.traffic_access_token, sandbox._envd_access_token]:
        assert secret not in seen, seen
    for header in ["x-api-key", "authorization", "x-access-token", TRAFFIC_TOKEN_HEADER]:
        assert f"{header}:" not in lowered, seen


def test_an_unauthenticated_request_does_not_wake_a_paused_sandbox(make_sandbox, http, env):
    skip_unless_sdk_has(sdk_accepts(Sandbox.create, "lifecycle"), "create(lifecycle=...)")
    sbx = make_sandbox(lifecycle={"on_timeout": "pause", "auto_resume": True})
    sbx.set_timeout(2)
    wait_until("the timeout to pause the sandbox",
               lambda: sbx.get_info().state == SandboxState.PAUSED, timeout=30, interval=0.5)
    r = get(http, env, sbx.get_host(8000), "/")
    assert r.status_code == 403, r.text
    assert sbx.get_info().state == SandboxState.PAUSED
    # With the token it wakes (nothing listens on the port: 502 from the running guest).
    r = get_port(http, env, sbx, 8000, "/")
    assert r.status_code == 502, r.text
    assert sbx.get_info().state == SandboxState.RUNNING


def test_allow_public_traffic_makes_the_ports_public(make_sandbox, http, env):
    sbx = make_sandbox(network={"allow_public_traffic": True})
    sbx.files.write("/home/user/www/index.html", PAGE)
    sbx.commands.run("busybox httpd -f -p 8000 -h /home/user/www", background=True, timeout=0)
    r = wait_until("httpd to answer without a credential", lambda: (lambda r: r if r.status_code == 200 else None)(
        get(http, env, sbx.get_host(8000), "/index.html")))
    assert r.text == PAGE


def test_a_closed_port_answers_502_port_is_not_open(sandbox, http, env):
    r = get_port(http, env, sandbox, 8001)
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
    # E2B envd's answer and words (internal/api/auth.go).
    assert (r.status_code, r.json()) == (401, {"code": 401, "message": "signature is already expired"})
    # A wrong signature is invalid, whatever its expiry.
    r = http.get(f"{env.url}/files",
                 params={"path": "/home/user/expired.txt", "signature": sig + "x", "signature_expiration": expired},
                 headers={"Host": sandbox.get_host(ENVD_PORT)})
    assert (r.status_code, r.json()["message"]) == (401, "invalid signature")


def test_a_wrong_token_in_the_header_is_refused_even_with_a_good_signature(sandbox, http, env):
    # As E2B's envd: a token in the header is checked first, and must be right.
    sandbox.files.write("/home/user/header.txt", "h")
    sig = signature("/home/user/header.txt", "read", "", sandbox._envd_access_token)
    params = {"path": "/home/user/header.txt", "signature": sig}
    host = {"Host": sandbox.get_host(ENVD_PORT)}
    assert http.get(f"{env.url}/files", params=params, headers=host).status_code == 200
    r = http.get(f"{env.url}/files", params=params, headers={**host, "X-Access-Token": "wrong"})
    assert r.status_code == 401, r.text


def test_a_signature_is_for_its_path_and_operation_only(sandbox, http, env):
    sandbox.files.write("/home/user/a.txt", "a")
    sandbox.files.write("/home/user/b.txt", "b")
    token = sandbox._envd_access_token
    host = {"Host": sandbox.get_host(ENVD_PORT)}
    read_a = signature("/home/user/a.txt", "read", "", token)
    assert http.get(f"{env.url}/files", params={"path": "/home/user/a.txt", "signature": read_a},
                    headers=host).status_code == 200
    # Another path, or a write, with a read signature of a.txt.
    r = http.get(f"{env.url}/files", params={"path": "/home/user/b.txt", "signature": read_a}, headers=host)
    assert (r.status_code, r.json()["message"]) == (401, "invalid signature")
    r = http.post(f"{env.url}/files", params={"path": "/home/user/a.txt", "signature": read_a},
                  files={"file": ("/home/user/a.txt", b"overwritten")}, headers=host)
    assert r.status_code == 401
    assert sandbox.files.read("/home/user/a.txt") == "a"
    # No signature and no token.
    r = http.get(f"{env.url}/files", params={"path": "/home/user/a.txt"}, headers=host)
    assert (r.status_code, r.json()["message"]) == (401, "missing signature query parameter")


def test_a_multipart_upload_without_a_file_writes_nothing_and_answers_an_empty_list(sandbox, http, env):
    # As envd: 200 [] (no error for a form that carries no file part).
    r = http.post(f"{env.url}/files", files={"note": (None, "no file here")},
                  headers={"Host": sandbox.get_host(ENVD_PORT), "X-Access-Token": sandbox._envd_access_token})
    assert (r.status_code, r.json()) == (200, []), r.text


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


def test_revoking_the_tokens_kills_the_old_token_and_signed_urls_at_once(make_sandbox, http, env):
    sbx = make_sandbox()
    sbx.files.write("/home/user/revoked.txt", "before")
    forever = sbx.download_url("/home/user/revoked.txt")  # no expiration: valid while the token is
    host = {"Host": sbx.get_host(ENVD_PORT)}
    assert http.get(forever, headers=host).status_code == 200
    # SPACE's own API (the SDKs have no call for it): POST /v1/sandboxes/{id}/revoke-tokens.
    r = http.post(f"{env.url}/v1/sandboxes/{sbx.sandbox_id}/revoke-tokens",
                  headers={"Authorization": f"Bearer {env.api_key}"})
    assert r.status_code == 204, r.text
    assert http.get(forever, headers=host).status_code == 401
    with pytest.raises(AuthenticationException):
        sbx.files.read("/home/user/revoked.txt")
    # Connecting hands out new tokens, and the sandbox is all there.
    again = Sandbox.connect(sbx.sandbox_id)
    assert again._envd_access_token != sbx._envd_access_token
    assert again.files.read("/home/user/revoked.txt") == "before"
    assert http.get(again.download_url("/home/user/revoked.txt"), headers=host).status_code == 200
    # Another tenant's key cannot revoke them.
    r = http.post(f"{env.url}/v1/sandboxes/{sbx.sandbox_id}/revoke-tokens",
                  headers={"Authorization": f"Bearer {env.other_api_key}"})
    assert r.status_code == 404
    assert again.files.read("/home/user/revoked.txt") == "before"

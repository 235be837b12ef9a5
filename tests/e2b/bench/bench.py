"""What the E2B compatibility layer costs: the pinned E2B Python SDK against SPACE's native
`/v1` API, from one Python process, on the same server and sandbox (docs/e2b-compat.md,
section 6, "Benchmarks"). Run by scripts/bench-e2b, which starts the server.

Figures (N runs each, interleaved so every path sees the same server state, in a shuffled
order each round so no path always follows another; p50/p90 ms):
- create: `Sandbox.create()` vs `POST /v1/sandboxes`, each from a full warm pool (an
  untimed wait for the pool to refill comes first, an untimed kill after), so every create
  claims a pool member: what a client of a provisioned server sees;
- run (`--exec-runs`, more runs: a round trip is short and its tail under TCG is noisy):
  `commands.run("true")` vs `POST /v1/sandboxes/{id}/exec` read to the end, with
  argv `["true"]` and with the SDK's own `["/bin/bash", "-l", "-c", "true"]` (same guest work);
- write and read of 10 MiB: `files.write` (multipart, and octet-stream) and `files.read`
  vs `PUT` / `GET /v1/sandboxes/{id}/files?path=`.
Each E2B figure is also measured as a *replay*: the SDK's exact HTTP requests, captured once
by pointing the SDK at a local recorder, sent again with the same httpx client as the
native requests. SDK − replay is the client's own cost; replay − native is the gateway's,
which is what the ≤ 10 % target is about.
"""

import argparse
import json
import math
import os
import random
import statistics
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional, Tuple

import httpx

TEN_MIB = 10 * 1024 * 1024
TARGET_OVERHEAD_PCT = 10.0
ENVD_VERSION = "0.6.4"


def percentile(sorted_ms: List[float], q: float) -> float:
    """Nearest rank, as `space bench` computes it (crates/cli/space-cli/src/stats.rs)."""
    rank = math.ceil(q / 100 * len(sorted_ms))
    return sorted_ms[min(max(rank, 1), len(sorted_ms)) - 1]


class Recorder:
    """A local HTTP/1.1 server that records the requests the SDK sends and answers each
    with a minimal valid envd response, so the requests can be replayed byte for byte."""

    def __init__(self):
        self.requests: List[Tuple[str, str, List[Tuple[str, str]], bytes]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def _answer(self, status: int, content_type: str, body: bytes):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = self._body()
                recorder.requests.append(("POST", self.path, list(self.headers.items()), body))
                if self.path.startswith("/process.Process/Start"):
                    self._answer(200, "application/connect+json", b"".join([
                        envelope({"event": {"start": {"pid": 1}}}),
                        envelope({"event": {"end": {"exited": True, "status": "exit status 0"}}}),
                        envelope({}, flags=0x02),
                    ]))
                elif self.path.split("?")[0] in ("/sandboxes", "/v2/sandboxes"):
                    # Enough of a sandbox for the SDK to take the create as done.
                    self._answer(201, "application/json", json.dumps({
                        "sandboxID": "recorded", "templateID": "recorded", "clientID": "space",
                        "envdVersion": ENVD_VERSION, "envdAccessToken": "recorded"}).encode())
                elif self.path.startswith("/files"):
                    self._answer(200, "application/json",
                                 json.dumps([{"name": "bench.bin", "type": "file", "path": "/home/user/bench.bin"}]).encode())
                else:
                    self._answer(404, "application/json", b'{"code":404,"message":"not recorded"}')

            def do_GET(self):
                recorder.requests.append(("GET", self.path, list(self.headers.items()), b""))
                self._answer(200, "application/octet-stream", b"recorded")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self):
        """The one request recorded since the last call."""
        assert len(self.requests) == 1, [r[:2] for r in self.requests]
        return self.requests.pop()

    def close(self):
        self.server.shutdown()


def envelope(message: dict, flags: int = 0) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


# Headers the replay must not copy: httpx sets them for its own connection and body.
HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def replayer(client: httpx.Client, url: str, recorded, status: int = 200) -> Callable[[], httpx.Response]:
    method, path, headers, body = recorded
    kept = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]

    def send() -> httpx.Response:
        r = client.request(method, url + path, headers=kept, content=body)
        r.read()
        assert r.status_code == status, (r.status_code, r.content[:300])
        return r

    return send


def stream_ok(r: httpx.Response) -> None:
    """A Connect stream that ended with an empty end-of-stream message and exit code 0."""
    data = r.content
    i, last, end = 0, None, None
    while i < len(data):
        flags, length = struct.unpack(">BI", data[i:i + 5])
        msg = json.loads(data[i + 5:i + 5 + length] or b"{}")
        if flags & 0x02:
            last = msg
        elif "end" in msg.get("event", {}):
            end = msg["event"]["end"]
        i += 5 + length
    assert last == {} and end is not None and end.get("exitCode", 0) == 0, (last, end)


class Native:
    """SPACE's own API (README.md), with one keep-alive httpx client."""

    def __init__(self, url: str, key: str):
        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120.0)

    def create(self, template: str) -> str:
        r = self.client.post("/v1/sandboxes", json={"template": template})
        assert r.status_code in (200, 201), r.text
        return r.json()["id"]

    def delete(self, sandbox_id: str) -> None:
        self.client.delete(f"/v1/sandboxes/{sandbox_id}")

    def wait_pool_full(self, timeout_s: float = 300.0) -> None:
        """Until every pool shape holds its target and nothing is being filled."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pools = self.client.get("/v1/pool").json()["pools"]
            if all(p["ready"] >= p["target"] and p["filling"] == 0 for p in pools):
                return
            time.sleep(0.2)
        raise TimeoutError("the warm pool did not refill")

    def exec(self, sandbox_id: str, argv: List[str]) -> None:
        """Runs `argv` and reads its NDJSON output to the `exit` event, which must be 0."""
        with self.client.stream("POST", f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": argv}) as r:
            assert r.status_code == 200, r.read()
            last = None
            for line in r.iter_lines():
                if line:
                    last = json.loads(line)
            assert last and last["type"] == "exit" and last.get("exit_code") == 0, last

    def write(self, sandbox_id: str, path: str, data: bytes) -> None:
        r = self.client.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": path}, content=data)
        assert r.status_code in (200, 201, 204), r.text

    def read(self, sandbox_id: str, path: str) -> httpx.Response:
        r = self.client.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": path})
        assert r.status_code == 200, r.text
        return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's base URL (native /v1 and E2B on one port)")
    ap.add_argument("--api-key-file", required=True)
    ap.add_argument("--template", default="busybox")
    ap.add_argument("--domain", help="E2B_DOMAIN (default: space.test:<port of --url>)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--exec-runs", type=int, default=150, help="runs of the round-trip figures")
    ap.add_argument("--seed", type=int, default=1, help="of the order the paths take in each round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()

    url = a.url.rstrip("/")
    key = open(a.api_key_file).read().strip()
    os.environ.update({
        "E2B_API_KEY": key,
        "E2B_API_URL": url,
        "E2B_SANDBOX_URL": url,
        "E2B_DOMAIN": a.domain or f"space.test:{httpx.URL(url).port}",
    })
    os.environ.pop("E2B_DEBUG", None)
    # Imported after the environment is set: the SDK reads it.
    from e2b import Sandbox
    from e2b.connection_config import ConnectionConfig
    from packaging.version import Version

    native = Native(url, key)

    timings: Dict[str, List[float]] = {}

    def timed(name: str, fn: Callable[[], object], record: bool) -> None:
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1000
        if record:
            timings.setdefault(name, []).append(ms)

    order = random.Random(a.seed)

    def rounds(variants: List[Tuple[str, Callable[[], object]]],
               before: Optional[Callable[[], None]] = None,
               after: Optional[Callable[[], None]] = None,
               runs: Optional[int] = None):
        for name, _ in variants:
            timings.setdefault(name, [])  # the report lists figures in this order
        for i in range(a.warmup + (runs or a.runs)):
            for name, fn in order.sample(variants, len(variants)):
                if before:
                    before()
                timed(name, fn, record=i >= a.warmup)
                if after:
                    after()

    print(f"# {a.runs} runs per figure, {a.exec_runs} of the round trips (+{a.warmup} warm-up), "
          f"template {a.template}, server {url}", file=sys.stderr)

    # --- create ---
    made: List[str] = []

    def sdk_create():
        made.append(Sandbox.create(template=a.template).sandbox_id)

    def v1_create():
        made.append(native.create(a.template))

    def kill_made():
        while made:
            native.delete(made.pop())

    replay_client = httpx.Client(timeout=120.0)
    recorder = Recorder()
    Sandbox.create(template=a.template, api_url=recorder.url)
    replay_create_request = replayer(replay_client, url, recorder.take(), status=201)

    def replay_create():
        made.append(replay_create_request().json()["sandboxID"])

    print("# create", file=sys.stderr)
    rounds([
        ("create e2b sdk", sdk_create),
        ("create e2b replay", replay_create),
        ("create native", v1_create),
    ], before=native.wait_pool_full, after=kill_made)

    # --- one sandbox for commands and files, reached by both APIs ---
    sbx = Sandbox.create(template=a.template, timeout=3600)
    try:
        token = sbx._envd_access_token
        captured = Sandbox(
            sandbox_id=sbx.sandbox_id,
            sandbox_domain=None,
            envd_version=Version(ENVD_VERSION),
            envd_access_token=token,
            connection_config=ConnectionConfig(sandbox_url=recorder.url, extra_sandbox_headers={
                "E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}),
        )
        data = os.urandom(TEN_MIB)
        path = "/home/user/bench.bin"

        captured.commands.run("true")
        replay_run = replayer(replay_client, url, recorder.take())
        captured.files.write(path, data)
        replay_write = replayer(replay_client, url, recorder.take())
        captured.files.read(path, format="bytes")
        replay_read = replayer(replay_client, url, recorder.take())
        recorder.close()

        print("# run", file=sys.stderr)
        rounds([
            ("run true e2b sdk", lambda: sbx.commands.run("true")),
            ("run true e2b replay", lambda: stream_ok(replay_run())),
            ("run true native argv true", lambda: native.exec(sbx.sandbox_id, ["true"])),
            ("run true native bash -l -c true", lambda: native.exec(sbx.sandbox_id, ["/bin/bash", "-l", "-c", "true"])),
        ], runs=a.exec_runs)

        def sdk_read():
            assert len(sbx.files.read(path, format="bytes")) == TEN_MIB

        print("# files", file=sys.stderr)
        rounds([
            ("write 10 MiB e2b sdk multipart", lambda: sbx.files.write(path, data)),
            ("write 10 MiB e2b sdk octet-stream", lambda: sbx.files.write(path, data, use_octet_stream=True)),
            ("write 10 MiB e2b replay multipart", replay_write),
            ("write 10 MiB native PUT", lambda: native.write(sbx.sandbox_id, path, data)),
        ])
        rounds([
            ("read 10 MiB e2b sdk", sdk_read),
            ("read 10 MiB e2b replay", lambda: assert_len(replay_read(), TEN_MIB)),
            ("read 10 MiB native GET", lambda: assert_len(native.read(sbx.sandbox_id, path), TEN_MIB)),
        ])
    finally:
        sbx.kill()

    report(timings, a.json)
    return 0


def assert_len(r: httpx.Response, n: int) -> None:
    assert len(r.content) == n, len(r.content)


# Each E2B figure against its native baseline: (figure, baseline).
COMPARISONS = [
    ("create e2b sdk", "create native"),
    ("create e2b replay", "create native"),
    ("run true e2b sdk", "run true native bash -l -c true"),
    ("run true e2b replay", "run true native bash -l -c true"),
    ("write 10 MiB e2b sdk multipart", "write 10 MiB native PUT"),
    ("write 10 MiB e2b sdk octet-stream", "write 10 MiB native PUT"),
    ("write 10 MiB e2b replay multipart", "write 10 MiB native PUT"),
    ("read 10 MiB e2b sdk", "read 10 MiB native GET"),
    ("read 10 MiB e2b replay", "read 10 MiB native GET"),
]


def report(timings: Dict[str, List[float]], json_path: Optional[str]) -> None:
    summary = {}
    for name, ms in timings.items():
        s = sorted(ms)
        summary[name] = {"n": len(s), "p50": percentile(s, 50), "p90": percentile(s, 90),
                         "mean": statistics.fmean(s), "min": s[0], "max": s[-1]}
    width = max(len(n) for n in summary)
    print(f"{'figure':<{width}}  {'n':>3}  {'p50 ms':>9}  {'p90 ms':>9}")
    for name, s in summary.items():
        print(f"{name:<{width}}  {s['n']:>3}  {s['p50']:>9.1f}  {s['p90']:>9.1f}")
    print()
    bw = max(len(b) for _, b in COMPARISONS)
    print(f"{'overhead of':<{width}}  {'over':<{bw}}  {'p50 %':>7}  {'p90 %':>7}")
    overheads = []
    for figure, baseline in COMPARISONS:
        f, b = summary[figure], summary[baseline]
        p50 = (f["p50"] - b["p50"]) / b["p50"] * 100
        p90 = (f["p90"] - b["p90"]) / b["p90"] * 100
        # The target is about what the gateway adds: the replays.
        gated = "replay" in figure
        flag = "  over the 10 % target" if gated and p50 > TARGET_OVERHEAD_PCT else ""
        print(f"{figure:<{width}}  {baseline:<{bw}}  {p50:>7.1f}  {p90:>7.1f}{flag}")
        overheads.append({"figure": figure, "baseline": baseline, "p50_pct": p50, "p90_pct": p90})
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"figures": summary, "overheads": overheads}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())

"""The hostile part of bench/reliability.py (issue 42): every bad-client case replayed against a
running real-model `flare run`, with well-formed canary clients running throughout.

One line per case: the status(es) the bad requests got, the largest error body, the canaries'
successes, failures and worst latency during the case, and the server's RSS before and after.
The bar: 0 canary failures, 0 5xx, no error body over 4 KB, canaries' worst latency <= 5x their
median before the cases, RSS back within 10% of its start.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

ASK = [{"role": "user", "content": "Name a colour."}]


class Canaries:
    """Well-formed clients in a loop: short greedy chat completions, latency and status recorded."""

    def __init__(self, url: str, clients: int = 2):
        self.url, self.clients = url, clients
        self.samples: list[tuple[float, float, int]] = []  # (end time, latency s, status)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(clients)]

    def _loop(self):
        body = {"messages": ASK, "max_tokens": 8, "temperature": 0}
        with httpx.Client(timeout=120) as http:
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    status = http.post(self.url + "/v1/chat/completions", json=body).status_code
                except httpx.HTTPError:
                    status = 0
                self.samples.append((time.monotonic(), time.monotonic() - t0, status))

    def start(self):
        for t in self.threads:
            t.start()

    def since(self, t0: float) -> list[tuple[float, float, int]]:
        return [s for s in self.samples if s[0] >= t0]

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(180)


def _post(url: str, body, headers=None, content=None, timeout=300) -> httpx.Response:
    if content is not None:
        return httpx.post(url + "/v1/chat/completions", content=content, headers=headers or {}, timeout=timeout)
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def _nested(depth: int) -> str:
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "integer"}' + "}}" * depth


def _constraint(fields: dict):
    return lambda url: [_post(url, {"messages": ASK, "max_tokens": 4, **fields})]


def _big_prompts(url: str):
    big = "word " * 400_000  # 2,000,000 bytes: under the 2 MiB body limit
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda _: _post(url, {"messages": [{"role": "user", "content": big}]}), range(8)))


def _n_lockout(url: str):
    hog = [_post(url, {"messages": ASK, "max_tokens": 4, "n": 64})]
    with ThreadPoolExecutor(16) as pool:  # one client (user "hog") with 16 requests open at once
        hog += list(pool.map(lambda _: _post(url, {"messages": ASK, "max_tokens": 24, "user": "hog"}), range(16)))
    return hog


def _text_plain(url: str):
    return [_post(url, None, {"content-type": "text/plain"}, json.dumps({"messages": ASK}))]


def _malformed(url: str):
    return [_post(url, None, {"content-type": "application/json"}, raw) for raw in (b'{"messages": [', b"\xff\xfe")]


def _slow_connections(port: int, count: int, wait_s: float):
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # never finished
        socks.append(s)
    time.sleep(wait_s)
    open_ = 0
    for s in socks:
        s.setblocking(False)
        try:
            open_ += s.recv(1) != b""
        except BlockingIOError:
            open_ += 1  # nothing to read and not closed: still held
        except OSError:
            pass
        s.close()
    return open_


def _upload_disconnects(port: int, count: int):
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100000\r\n\r\n{\"messages\": [")
        s.close()
    time.sleep(1.0)


def _settle(canaries: Canaries, t_case: float, least: int = 2) -> None:
    # A case that is refused at once ends before any canary request; wait for a few that ran
    # across it, so that every line says how the canaries fared (bounded: a stall shows anyway).
    deadline = time.monotonic() + 120
    while len(canaries.since(t_case)) < least and time.monotonic() < deadline:
        time.sleep(0.1)


def hostile(server, figure) -> dict:
    """Run every case against `server` (a FlareServer on the real model); print one line each."""
    url, pid = server.url, server.proc.pid

    def rss_mb() -> float:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

    canaries = Canaries(url)
    canaries.start()
    t0 = time.monotonic()
    while len(canaries.since(t0)) < 12:  # the canaries' median before any hostile case
        time.sleep(0.2)
    base = statistics.median(lat for _, lat, _ in canaries.since(t0))
    rss_start = rss_mb()
    figure("hostile: canaries before", requests=len(canaries.since(t0)), median_s=f"{base:.2f}",
           rss_mb=f"{rss_start:.0f}")
    cases = [
        ("choice 2,100 labels", _constraint({"structured_outputs": {"choice": [f"l{i}" for i in range(2100)]}})),
        ("choice 70,000 labels", _constraint({"guided_choice": [f"label{i}" for i in range(70_000)]})),
        ("recursive $ref", _constraint({"response_format": {"type": "json_schema", "json_schema": {
            "name": "r", "schema": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}}})),
        ("anyOf 5,000 branches", _constraint({"structured_outputs": {"json": {
            "anyOf": [{"const": f"v{i}"} for i in range(5000)]}}})),
        ("schema text 500 deep", _constraint({"guided_json": _nested(500)})),
        ("8 x 2 MB prompts", _big_prompts),
        ("n=64 and one client x16", _n_lockout),
        ("text/plain POST", _text_plain),
        ("malformed bodies", _malformed),
    ]
    worst_ratio, failures, five_xx, biggest = 0.0, 0, 0, 0
    for name, run in cases:
        rss0, t_case = rss_mb(), time.monotonic()
        responses = run(url)
        _settle(canaries, t_case)
        seen = canaries.since(t_case)
        statuses = Counter(r.status_code for r in responses)
        errors = [len(r.content) for r in responses if r.status_code >= 400]
        bad_canaries = sum(1 for _, _, st in seen if st != 200)
        worst = max((lat for _, lat, _ in seen), default=0.0)
        failures += bad_canaries
        five_xx += sum(n for st, n in statuses.items() if st >= 500)
        biggest = max([biggest, *errors])
        worst_ratio = max(worst_ratio, worst / base)
        figure(f"hostile: {name}", status=dict(sorted(statuses.items())), max_error_body=max(errors, default=0),
               canaries_ok=sum(1 for _, _, st in seen if st == 200), canary_failures=bad_canaries,
               canary_worst_s=f"{worst:.2f}", rss_mb=f"{rss0:.0f}->{rss_mb():.0f}")
    port = int(url.rsplit(":", 1)[1])
    for name, run in (("300 slow-header connections", lambda: _slow_connections(port, 300, 12.0)),
                      ("50 clients leaving mid-upload", lambda: _upload_disconnects(port, 50))):
        rss0, t_case = rss_mb(), time.monotonic()
        stderr_before = len(server.error_text().splitlines())
        held = run()
        _settle(canaries, t_case)
        seen = canaries.since(t_case)
        worst = max((lat for _, lat, _ in seen), default=0.0)
        failures += sum(1 for _, _, st in seen if st != 200)
        worst_ratio = max(worst_ratio, worst / base)
        figure(f"hostile: {name}", still_open=held if held is not None else "-",
               server_log_lines=len(server.error_text().splitlines()) - stderr_before,
               canaries_ok=sum(1 for _, _, st in seen if st == 200),
               canary_failures=sum(1 for _, _, st in seen if st != 200), canary_worst_s=f"{worst:.2f}",
               rss_mb=f"{rss0:.0f}->{rss_mb():.0f}")
    canaries.close()
    rss_end = rss_mb()
    result = {"canary_failures": failures, "5xx": five_xx, "max_error_body": biggest,
              "worst_latency_x_median": round(worst_ratio, 1), "rss_mb": f"{rss_start:.0f}->{rss_end:.0f}",
              "rss_within_10pct": abs(rss_end - rss_start) <= 0.1 * rss_start}
    result["bar_met"] = (failures == 0 and five_xx == 0 and biggest <= 4096 and worst_ratio <= 5
                         and result["rss_within_10pct"])
    figure("hostile: summary", **result)
    return result

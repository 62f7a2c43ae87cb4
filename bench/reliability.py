"""Reliability as figures: one line per figure (requests, failures, leaks), from a simulated soak,
schema-driven fuzzing, storms against a real `flare run` process on loopback, and a drift run.

    .venv/bin/python bench/reliability.py                  # everything, full counts
    .venv/bin/python bench/reliability.py soak storms      # some parts
    .venv/bin/python bench/reliability.py --quick          # small counts (minutes)
    .venv/bin/python bench/reliability.py drift --drift-requests 200
    .venv/bin/python bench/reliability.py drift --drift-engine sim --drift-requests 5000 --drift-every 500

Parts: soak (10,000 requests through the runtime on SimCore with 10% cancellations and 1% core
faults), fuzz (schemathesis on the sim engine and on the real model), storms (1,000 random
disconnects under steady load, SIGTERM under load, slow readers, bad bodies, admission past
--max-queue; sim engine unless --storm-engine torch), drift (1,000 requests through the real
model, RSS and single-stream inter-token latency every 100), hostile (bench/hostile.py: every
bad-client case of issue 42 against the real model with canary clients running). Every load loop is bounded in
count and time, and every server it starts listens on 127.0.0.1 and is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import statistics
import sys
import threading
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hostile import hostile  # noqa: E402
from helios.sim.soak import SoakConfig, run_soak  # noqa: E402
from tests.server.schema_fuzz import fuzz  # noqa: E402
from tests.server.support import FlareServer, is_idle, metrics, raw_request, value, wait_for  # noqa: E402


def figure(name: str, **fields) -> None:
    print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in fields.items()), flush=True)


def leaks(url: str) -> str:
    try:
        snap = wait_for(lambda: s if is_idle(s := metrics(url)) else None, 120, "idle")
    except AssertionError:
        snap = metrics(url)
    return (f"slots {value(snap, 'flare_request_slots') - value(snap, 'flare_request_slots_free'):.0f}, "
            f"pages {value(snap, 'flare_kv_pages') - value(snap, 'flare_kv_pages_free'):.0f}, "
            f"live {value(snap, 'flare_requests_running') + value(snap, 'flare_requests_waiting'):.0f}")


# ---- soak ----------------------------------------------------------------------------------------

def soak(n: int) -> None:
    r = run_soak(SoakConfig(requests=n))
    rss = [kb for _, kb in r.rss_kb if kb is not None]
    figure("soak (sim, runtime)", requests=r.requests, outcomes=dict(sorted(r.outcomes.items())), lost=r.lost,
           mismatched=len(r.mismatched), frame_faults=r.frame_faults, leaked_slots=r.leaked_slots,
           leaked_pages=r.leaked_pages, core_attached=r.core_attached, idle=r.idle, wall_s=f"{r.wall_s:.0f}")
    figure("soak RSS MB every 1,000 requests", trend=[round(kb / 1024, 1) for kb in rss])


# ---- fuzz ----------------------------------------------------------------------------------------

def fuzz_figure(label: str, args: list[str], examples: int) -> None:
    server = FlareServer(*args, "--max-queue", "16", "--max-body-bytes", "65536", start_timeout=900)
    assert server.ready_line, server.error_text()
    try:
        t0 = time.monotonic()
        failure = None
        try:
            tried = fuzz(server.url, examples)
        except Exception as exc:  # a failed check: report it as the figure
            tried, failure = {}, f"{type(exc).__name__}: {str(exc)[:300]}"
        health = httpx.get(server.url + "/health", timeout=10).status_code
        status = {}
        for key, n in tried.items():
            status[key.rsplit(" ", 1)[1]] = status.get(key.rsplit(" ", 1)[1], 0) + n
        figure(f"schema fuzz ({label})", requests=sum(tried.values()), by_status=dict(sorted(status.items())),
               failure=failure, health=health, leaks=leaks(server.url), wall_s=f"{time.monotonic() - t0:.0f}")
    finally:
        server.stop()


# ---- storms --------------------------------------------------------------------------------------

def _body(rng: random.Random, max_tokens: int) -> tuple[dict, str]:
    body = {"prompt": "storm " * rng.randint(1, 60), "max_tokens": rng.randint(4, max_tokens),
            "stream": rng.random() < 0.7}
    if rng.random() < 0.3:
        return {"messages": [{"role": "user", "content": body.pop("prompt")}], **body}, "/v1/chat/completions"
    return body, "/v1/completions"


def disconnect_storm(args: list[str], clients: int, max_tokens: int, concurrency: int, leave_share: float = 0.7,
                     leave_within: float = 2.0) -> None:
    server = FlareServer(*args, "--max-queue", "64", start_timeout=900)
    assert server.ready_line, server.error_text()
    try:
        before = metrics(server.url)
        rng = random.Random(16)

        async def run():
            sem = asyncio.Semaphore(concurrency)

            async def one(seed):
                r = random.Random(seed)
                body, endpoint = _body(r, max_tokens)
                async with sem:
                    # `leave_share` of the clients leave at a random moment: queued, prefilling,
                    # mid-stream or waiting on a non-streaming answer (where: the outcome's label).
                    leave = r.random() * leave_within if r.random() < leave_share else None
                    return await raw_request(server.port, body, endpoint, leave)
            return await asyncio.gather(*(one(rng.random()) for _ in range(clients)))

        t0 = time.monotonic()
        outcomes = asyncio.run(run())
        wall = time.monotonic() - t0
        lk = leaks(server.url)
        snap = metrics(server.url)
        finished = {k: value(snap, "flare_requests_finished_total", finish_reason=k)
                    - value(before, "flare_requests_finished_total", finish_reason=k)
                    for k in ("stop", "length", "cancelled", "error")}
        admitted = value(snap, "flare_requests_submitted_total") - value(before, "flare_requests_submitted_total")
        counts = {str(o): outcomes.count(o) for o in sorted(set(outcomes), key=str)}
        figure(f"disconnect storm ({'sim' if '--engine' in args else 'real model'})", clients=clients,
               client_outcomes=counts, admitted=f"{admitted:.0f}",
               ended={k: int(v) for k, v in finished.items()}, lost=f"{admitted - sum(finished.values()):.0f}",
               server_5xx=sum(1 for o in outcomes if isinstance(o, int) and o >= 500), leaks=lk,
               health=httpx.get(server.url + "/health", timeout=10).status_code, wall_s=f"{wall:.0f}")
    finally:
        server.stop()


def sigterm_storm(args: list[str], clients: int, max_tokens: int, grace: float) -> None:
    server = FlareServer(*args, "--max-queue", str(clients), "--shutdown-grace", str(grace),
                         start_timeout=900)
    assert server.ready_line, server.error_text()
    results: list = []

    def client(i):
        try:
            with httpx.stream("POST", server.url + "/v1/completions", timeout=120,
                              json={"prompt": f"shutdown {i} " * 5, "max_tokens": max_tokens if i % 2 else 4,
                                    "stream": True}) as r:
                text = "".join(r.iter_text())
                if r.status_code != 200:  # refused at admission (e.g. 503 once draining)
                    results.append(f"refused {r.status_code}: {json.loads(text)['error']['code']}")
                    return
            events = [e for e in text.split("\n\n") if e.startswith("data: {")]
            last = json.loads(events[-1][6:]) if events else {}
            if "error" in last:
                results.append(f"ended: {last['error']['code']}")
            elif last.get("choices") and last["choices"][0].get("finish_reason"):
                results.append("completed")
            else:
                results.append("no reason")
        except httpx.HTTPError as exc:
            results.append(f"transport: {type(exc).__name__}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: value(metrics(server.url), "flare_requests_running") >= 1, 120, "load")
    except (AssertionError, httpx.HTTPError):
        pass
    t0 = time.monotonic()
    server.proc.send_signal(15)
    code = server.proc.wait(grace + 60)
    exit_s = time.monotonic() - t0
    for t in threads:
        t.join(60)
    hung = sum(t.is_alive() for t in threads)
    counts = {k: results.count(k) for k in sorted(set(results))}
    figure("SIGTERM under load", clients=clients, outcomes=counts, hung=hung, exit_code=code,
           grace_s=grace, exit_after_s=f"{exit_s:.1f}")


def slow_readers(args: list[str], stalled: int, normal: int, max_tokens: int) -> None:
    server = FlareServer(*args, "--max-queue", "64", start_timeout=900)
    assert server.ready_line, server.error_text()
    try:
        import socket

        socks = []
        for i in range(stalled):  # open a stream, read nothing, keep the connection
            s = socket.create_connection(("127.0.0.1", server.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            payload = json.dumps({"prompt": f"never read {i} " * 20, "max_tokens": max_tokens, "stream": True})
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      f"content-length: {len(payload)}\r\n\r\n{payload}".encode())
            socks.append(s)
        done, t0 = [], time.monotonic()

        def reader(i):
            r = httpx.post(server.url + "/v1/completions", timeout=300,
                           json={"prompt": f"reader {i}", "max_tokens": 32, "stream": True})
            done.append(r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"))

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(normal)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        wall = time.monotonic() - t0
        for s in socks:
            s.close()
        figure("slow readers", stalled_streams=stalled, other_streams=normal, others_completed=sum(done),
               others_wall_s=f"{wall:.1f}", leaks_after_close=leaks(server.url))
    finally:
        server.stop()


def bad_bodies_and_admission(args: list[str], requests: int) -> None:
    server = FlareServer(*args, "--max-queue", "2", "--max-body-bytes", "65536", start_timeout=900)
    assert server.ready_line, server.error_text()
    try:
        rng = random.Random(3)
        bad = [b"{not json", b"", b"null", b"[1]", b'{"prompt": 5}', b'{"prompt": "x", "max_tokens": -1}',
               b'{"prompt": "x", "nope": 1}', b'{"messages": []}', b"\xff\xfe", b'{"prompt": "' + b"a" * 70000 + b'"}']
        statuses: dict = {}
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for _ in range(requests):
                path = rng.choice(["/v1/completions", "/v1/chat/completions"])
                r = http.post(path, content=rng.choice(bad), headers={"content-type": "application/json"})
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        figure("oversized and invalid bodies", requests=requests, by_status=dict(sorted(statuses.items())),
               server_5xx=sum(v for k, v in statuses.items() if k >= 500), leaks=leaks(server.url))

        burst = 4 * (int(value(metrics(server.url), "flare_request_slots")) + 2)
        codes, retry = [], []

        def one(i):
            r = httpx.post(server.url + "/v1/completions", timeout=300, json={"prompt": f"burst {i}", "max_tokens": 64})
            codes.append(r.status_code)
            if r.status_code == 429:
                retry.append(r.headers.get("retry-after"))
        threads = [threading.Thread(target=one, args=(i,)) for i in range(burst)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        figure("admission past --max-queue 2", burst=burst, ok=codes.count(200), rejected_429=codes.count(429),
               with_retry_after=sum(1 for r in retry if r), other=len(codes) - codes.count(200) - codes.count(429),
               leaks=leaks(server.url))
    finally:
        server.stop()


# ---- drift ---------------------------------------------------------------------------------------

def slope_per_100(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs, per 100 requests: the trend, robust to one noisy sample."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def drift(requests: int, every: int, concurrency: int, engine: str = "torch") -> None:
    # No warm-up: the trend matters, not the first requests; a busy machine starts it faster.
    # The sim engine (unpaced) runs the same HTTP, runtime and publication code in minutes, so a
    # leak outside the model shows there at many more requests.
    flags = ["--engine", "sim", "--sim-pace", "0"] if engine == "sim" else ["--no-warmup"]
    server = FlareServer("--slots", "4", "--max-queue", "16", *flags, start_timeout=900)
    assert server.ready_line, server.error_text()
    try:
        pid = server.proc.pid

        def rss_mb():
            with open(f"/proc/{pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

        def single_stream_itl_ms():
            arrivals = []
            with httpx.stream("POST", server.url + "/v1/completions", timeout=300,
                              json={"prompt": "Count slowly from one to fifty:", "max_tokens": 48, "temperature": 0,
                                    "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.monotonic())
            gaps = [b - a for a, b in zip(arrivals[1:], arrivals[2:])]
            return statistics.median(gaps) * 1e3 if gaps else float("nan")

        rng, samples, sent = random.Random(5), [], 0
        samples.append((0, rss_mb(), single_stream_itl_ms()))
        while sent < requests:
            batch = min(every, requests - sent)
            bodies = [{"prompt": "Tell me about " + " ".join(rng.choice(["rivers", "stones", "light", "gardens",
                                                                         "windows", "winter"]) for _ in range(8)),
                       "max_tokens": rng.randint(8, 48), "stream": rng.random() < 0.5} for _ in range(batch)]

            def worker(chunk):
                for body in chunk:
                    httpx.post(server.url + "/v1/completions", json=body, timeout=600)
            threads = [threading.Thread(target=worker, args=(bodies[k::concurrency],)) for k in range(concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(1800)
            sent += batch
            samples.append((sent, rss_mb(), single_stream_itl_ms()))
            print(f"  drift: {sent} requests, RSS {samples[-1][1]:.0f} MB, single-stream ITL {samples[-1][2]:.1f} ms",
                  flush=True)
        xs = [float(s[0]) for s in samples]
        figure(f"drift ({'real model' if engine == 'torch' else 'sim engine'})", requests=sent,
               rss_mb=[round(s[1]) for s in samples], single_stream_itl_ms=[round(s[2], 1) for s in samples],
               rss_mb_per_100_requests=f"{slope_per_100(xs[1:], [s[1] for s in samples[1:]]):+.2f}",
               itl_ms_per_100_requests=f"{slope_per_100(xs, [s[2] for s in samples]):+.2f}",
               leaks=leaks(server.url))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", default=["soak", "fuzz", "storms", "drift", "hostile"],
                        choices=["soak", "fuzz", "storms", "drift", "hostile"])
    parser.add_argument("--port", type=int, default=None, help="hostile: the server's port (default: a free one)")
    parser.add_argument("--quick", action="store_true", help="small counts")
    parser.add_argument("--storm-engine", choices=("sim", "torch"), default="sim")
    parser.add_argument("--drift-requests", type=int, default=None)
    parser.add_argument("--drift-engine", choices=("sim", "torch"), default="torch")
    parser.add_argument("--drift-every", type=int, default=None, help="requests between samples (default 100)")
    a = parser.parse_args()
    q = a.quick
    sim = ["--engine", "sim", "--slots", "4", "--max-context", "1024"]
    # Real-model storms skip the warm-up: they test what survives, not speed, and each part
    # starts its own server.
    storm = sim if a.storm_engine == "sim" else ["--slots", "4", "--max-context", "1024", "--no-warmup"]
    storm = storm + ["--client-share", "1"]  # one process plays every client of a storm
    if "soak" in a.parts:
        soak(1000 if q else 10_000)
    if "fuzz" in a.parts:
        fuzz_figure("sim engine", sim, 30 if q else 150)
        fuzz_figure("real model", ["--slots", "4", "--max-context", "256", "--prefill-capacity", "256"], 5 if q else 20)
    if "storms" in a.parts:
        tokens = 64 if a.storm_engine == "torch" else 400
        if a.storm_engine == "torch":  # every client leaves within 3 s unless its answer came first
            disconnect_storm(storm, 100 if q else 1000, 16, 16, leave_share=1.0, leave_within=3.0)
        else:
            disconnect_storm(storm, 100 if q else 1000, tokens, 16)
        sigterm_storm(storm + ["--sim-pace", "2"] if a.storm_engine == "sim" else storm, 8 if q else 16, tokens, 2.0)
        slow_readers(storm, 2, 4 if q else 8, tokens)
        bad_bodies_and_admission(storm, 100 if q else 1000)
    if "hostile" in a.parts:  # bench/hostile.py: every bad-client case against the real model
        server = FlareServer("--slots", "4", "--max-queue", "16", "--max-context", "1024", start_timeout=900,
                             port=a.port)
        assert server.ready_line, server.error_text()
        try:
            hostile(server, figure)
        finally:
            server.stop()
    if "drift" in a.parts:
        drift(a.drift_requests or (100 if q else 1000), a.drift_every or (50 if q else 100), 4, a.drift_engine)


if __name__ == "__main__":
    main()

"""The spec's HTTP scheduler scenarios against a real `flare run` (the embedded SmolLM2 on
TorchCore) through the openai client: concurrent long prompts, two and four decode streams, a
long prompt arriving during decode, short/long prompt contention, and cancellation followed by
slot reuse; for ordinary, fixed-width and adaptive speculative execution.

Run with -s to see prompt/output token counts, client SSE arrival gaps and the server's graph
counter deltas. SSE arrival gaps are not device execution times or per-token latencies.
FLARE_SCHEDULER_TEST_URL=http://host:port runs the scenarios against an already running server.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from .support import FlareServer, graph_delta, metrics, value, wait_resources_free

SLOTS = 4
PREFILL_CAPACITY = 512  # the largest chunk a 2-core CI run affords (1024 tokens take ~2 s)
MAX_CONTEXT = 1024
EXTERNAL = os.environ.get("FLARE_SCHEDULER_TEST_URL")
MODES = ["external"] if EXTERNAL else ["off", "fixed", "adaptive"]
WORDS = ("river stone light garden window morning quiet number paper signal orange careful travel "
         "machine simple forest letter bridge summer winter market honest").split()


@pytest.fixture(scope="module", params=MODES)
def server(request):
    if request.param == "external":
        yield EXTERNAL.rstrip("/")
        return
    s = FlareServer("--speculation", request.param, "--slots", str(SLOTS), "--prefill-capacity",
                    str(PREFILL_CAPACITY), "--max-context", str(MAX_CONTEXT), "--max-queue", "16")
    if s.ready_line is None:
        err = s.error_text().strip()
        s.stop()
        if s.exit_code == 2 and "--speculation" in err:
            pytest.skip(f"--speculation {request.param} is not supported by this build: {err}")
        pytest.fail(f"flare run --speculation {request.param} did not start: {err}")
    print(f"\n[{request.param}] {s.ready_line}")
    yield s.url
    assert s.stop() == 0


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


def long_prompt(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return "Read this list and say which word is most common: " + " ".join(rng.choice(WORDS) for _ in range(words))


def stream_completion(client, prompt: str, max_tokens: int, *, chat: bool = False, stop_after: int | None = None,
                      on_chunk=None) -> dict:
    """Stream one request; returns text, usage, finish reason, TTFT and SSE arrival gaps (s)."""
    t0 = time.monotonic()
    common = dict(model=client.models.list().data[0].id, max_tokens=max_tokens, temperature=0, stream=True,
                  stream_options={"include_usage": True})
    if chat:
        stream = client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
    else:
        stream = client.completions.create(prompt=prompt, **common)
    arrivals, text, usage, finish = [], "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        piece = (c.delta.content or "") if chat else (c.text or "")
        finish = c.finish_reason or finish
        if piece:
            arrivals.append(time.monotonic())
            text += piece
            if on_chunk is not None:
                on_chunk(len(arrivals))
            if stop_after is not None and len(arrivals) >= stop_after:
                stream.close()  # the client disconnects mid-generation
                return {"text": text, "cancelled": True, "arrivals": arrivals}
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"text": text, "usage": usage, "finish": finish, "ttft": arrivals[0] - t0 if arrivals else None,
            "gaps": gaps, "arrivals": arrivals}


def report(name: str, results: list[dict], before: dict, after: dict) -> None:
    print(f"\n  {name}: graphs executed {graph_delta(before, after)}")
    for i, r in enumerate(results):
        u = r.get("usage")
        gaps = r.get("gaps") or [0.0]
        ttft = f"{r['ttft'] * 1e3:.0f}" if r.get("ttft") is not None else "-"
        print(f"    #{i}: prompt {u.prompt_tokens if u else '?'} tok, output {u.completion_tokens if u else '?'} tok, "
              f"finish {r.get('finish')}, ttft {ttft} ms, SSE gaps p50 {statistics.median(gaps) * 1e3:.0f} "
              f"/ max {max(gaps) * 1e3:.0f} ms")


def check_complete(results: list[dict], max_tokens: int) -> None:
    for r in results:
        assert r["finish"] in ("stop", "length"), r
        assert r["usage"] is not None and 1 <= r["usage"].completion_tokens <= max_tokens
        assert r["finish"] == "stop" or r["usage"].completion_tokens == max_tokens


def run_concurrently(jobs) -> list[dict]:
    with ThreadPoolExecutor(len(jobs)) as pool:
        return [f.result(timeout=600) for f in [pool.submit(job) for job in jobs]]


def test_concurrent_long_prompts(server, client):
    before = metrics(server)
    results = run_concurrently([lambda i=i: stream_completion(client, long_prompt(380, i), 4) for i in range(4)])
    report("4 concurrent long prompts", results, before, metrics(server))
    check_complete(results, 4)
    assert all(r["usage"].prompt_tokens > PREFILL_CAPACITY // 2 for r in results)


@pytest.mark.parametrize("streams", [2, 4])
def test_decode_streams(server, client, streams):
    before = metrics(server)
    results = run_concurrently([lambda i=i: stream_completion(client, f"Count from {i + 1} to {i + 30}.", 24,
                                                              chat=True) for i in range(streams)])
    report(f"{streams} decode streams", results, before, metrics(server))
    check_complete(results, 24)


def test_long_prompt_during_decode(server, client):
    before = metrics(server)
    decoding = threading.Barrier(3, timeout=300)

    def decoder(i):
        passed = []

        def on_chunk(n):  # release the long prompt once both streams are decoding
            if n == 3 and not passed:
                passed.append(decoding.wait())
        return stream_completion(client, f"Write a short poem about the number {i}.", 40, chat=True,
                                 on_chunk=on_chunk)

    def late_long():
        decoding.wait()
        r = stream_completion(client, long_prompt(420, 99), 4)
        r["submitted"] = r["arrivals"][0] - r["ttft"] if r["arrivals"] else None
        return r

    results = run_concurrently([lambda: decoder(1), lambda: decoder(2), late_long])
    report("long prompt arriving during decode", results, before, metrics(server))
    check_complete(results[:2], 40)
    check_complete(results[2:], 4)
    t = results[2]["submitted"]
    stalls = [max((b - a for a, b in zip(r["arrivals"], r["arrivals"][1:]) if b > t), default=0) for r in results[:2]]
    print(f"    decoders' largest SSE gap after the long prompt arrived: {[f'{s * 1e3:.0f} ms' for s in stalls]}")


def test_short_long_contention(server, client):
    before = metrics(server)
    jobs = [lambda: stream_completion(client, long_prompt(800, 7), 4)]
    jobs += [lambda i=i: stream_completion(client, f"Name a color. ({i})", 8, chat=True) for i in range(3)]
    results = run_concurrently(jobs)
    report("short/long contention (#0 long)", results, before, metrics(server))
    check_complete(results[:1], 4)
    check_complete(results[1:], 8)
    assert results[0]["usage"].prompt_tokens > 700


def test_cancellation_then_slot_reuse(server, client):
    before = metrics(server)
    cancelled = run_concurrently([lambda i=i: stream_completion(client, f"Tell a long story about {w}.", 300,
                                                                chat=True, stop_after=2)
                                  for i, w in enumerate(WORDS[:SLOTS])])
    assert all(r["cancelled"] for r in cancelled)
    t0 = time.monotonic()
    snap = wait_resources_free(server, timeout=60)
    freed_s = time.monotonic() - t0
    assert value(snap, "flare_request_slots_free") == SLOTS, "slots did not come back after the cancellations"
    assert value(snap, "flare_kv_pages_free") == value(snap, "flare_kv_pages")
    n_cancelled = value(snap, "flare_requests_finished_total", finish_reason="cancelled") - value(
        before, "flare_requests_finished_total", finish_reason="cancelled")
    assert n_cancelled == SLOTS
    results = run_concurrently([lambda i=i: stream_completion(client, f"Say hello to {w}.", 6, chat=True)
                                for i, w in enumerate(WORDS[SLOTS:2 * SLOTS])])
    report(f"{SLOTS} cancelled after 2 chunks (all slots back {freed_s * 1e3:.0f} ms later), then {SLOTS} new",
           results, before, metrics(server))
    check_complete(results, 6)

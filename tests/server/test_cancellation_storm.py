"""A cancellation storm on loopback: many clients disconnect at random moments (while queued,
during prefill, mid-stream, non-streaming, with several choices); afterwards every slot and page is free and a new
request completes. Bounded: 48 clients, about ten seconds."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from .support import FlareServer, metrics, value, wait_resources_free

CLIENTS = 48


@pytest.fixture(scope="module")
def server():
    s = FlareServer("--engine", "sim", "--slots", "4", "--max-queue", "64", "--max-context", "1024",
                    "--prefill-capacity", "256")
    assert s.ready_line, s.error_text()
    yield s
    assert s.stop() == 0


async def _client(port: int, rng: random.Random, outcomes: list) -> None:
    body = {"prompt": "storm " * rng.randint(1, 120), "max_tokens": rng.randint(20, 400),
            "stream": rng.random() < 0.7}
    if rng.random() < 0.3:
        body["n"] = rng.choice((2, 3))  # several choices: one cancel must end them all
    if rng.random() < 0.3:
        body["stop"] = ["zzz"]  # host-feedback requests take the non-queued path
    endpoint = "/v1/completions"
    if rng.random() < 0.3:
        endpoint = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    await asyncio.sleep(rng.random() * 2.0)
    deadline = rng.random() * 1.5  # disconnect after this long, whatever the request is doing
    # A raw socket per client: cheap on a 2-core machine, and closing it is exactly a disconnect.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    writer.write(f"POST {endpoint} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode() + payload)

    async def read_all() -> int:
        data = await reader.read()  # until the server closes the connection
        return int(data.split(b" ", 2)[1])

    try:
        outcomes.append(await asyncio.wait_for(read_all(), deadline))
    except asyncio.TimeoutError:
        outcomes.append("disconnected")
    finally:
        writer.close()


def test_cancellation_storm(server):
    rng = random.Random(1234)
    outcomes: list = []
    before = metrics(server.url)

    async def storm():
        await asyncio.gather(*(_client(server.port, random.Random(rng.random()), outcomes) for _ in range(CLIENTS)))

    t0 = time.monotonic()
    asyncio.run(storm())
    storm_s = time.monotonic() - t0
    snap = wait_resources_free(server.url)
    def delta(name, **labels):
        return value(snap, name, **labels) - value(before, name, **labels)

    finished = {reason: delta("flare_requests_finished_total", finish_reason=reason)
                for reason in ("stop", "length", "cancelled", "error")}
    submitted = delta("flare_requests_submitted_total")
    print(f"\nstorm: {CLIENTS} clients in {storm_s:.1f} s; client outcomes "
          f"{ {o: outcomes.count(o) for o in set(outcomes)} }; server: {submitted:.0f} admitted, finished {finished}")
    assert len(outcomes) == CLIENTS
    assert set(outcomes) <= {"disconnected", 200, 429}
    # Every admitted request ended, and clients that left while it ran were cancelled.
    assert submitted == sum(finished.values()) and finished["error"] == 0
    assert outcomes.count("disconnected") >= CLIENTS // 4 and finished["cancelled"] >= CLIENTS // 8
    assert value(snap, "flare_requests_running") == 0 and value(snap, "flare_requests_waiting") == 0
    assert value(snap, "flare_request_slots_free") == 4
    assert value(snap, "flare_kv_pages_free") == value(snap, "flare_kv_pages")
    assert value(snap, "flare_engine_faults_total") == 0
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "after the storm", "max_tokens": 5}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "after"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_disconnect_cancels_at_once(server):
    """Rule: a stream whose client goes away mid-generation is cancelled: it ends "cancelled"
    with fewer tokens than it asked for, and its slot and pages come back."""
    before = metrics(server.url)

    async def one():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            async with http.stream("POST", "/v1/completions",
                                   json={"prompt": "abc", "max_tokens": 900, "stream": True}) as r:
                async for _ in r.aiter_lines():
                    break  # first chunk arrived: the request is decoding

    asyncio.run(one())
    snap = wait_resources_free(server.url)

    def delta(name, **labels):
        return value(snap, name, **labels) - value(before, name, **labels)

    assert delta("flare_requests_finished_total", finish_reason="cancelled") == 1
    assert delta("flare_requests_finished_total", finish_reason="length") == 0
    assert delta("flare_generation_tokens_total") < 900
    assert value(snap, "flare_request_slots_free") == 4


def test_slow_readers_do_not_stall_other_streams(server):
    """Rule: clients that stop reading their SSE streams (tiny receive buffers, never read) do not
    delay other streams: these complete while the stalled connections stay open (the runtime
    buffers each stream and never waits on a socket); closing the stalled connections then
    leaves every slot and page free."""
    before = metrics(server.url)
    import socket

    stalled = []
    for i in range(2):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        payload = json.dumps({"prompt": f"never read {i} " * 5, "max_tokens": 900, "stream": True})
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  f"content-length: {len(payload)}\r\n\r\n{payload}".encode())
        stalled.append(s)
    try:
        async def readers():
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
                return await asyncio.gather(*(http.post("/v1/completions", json={
                    "prompt": f"reader {i}", "max_tokens": 40, "stream": True}) for i in range(3)))

        results = asyncio.run(readers())
        assert all(r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") for r in results)
    finally:
        for s in stalled:
            s.close()
    snap = wait_resources_free(server.url)
    assert value(snap, "flare_request_slots_free") == 4
    ended = sum(value(snap, "flare_requests_finished_total", finish_reason=k)
                - value(before, "flare_requests_finished_total", finish_reason=k) for k in ("length", "cancelled"))
    assert ended == 5 and value(snap, "flare_engine_faults_total") == 0

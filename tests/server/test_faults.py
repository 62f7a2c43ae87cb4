"""Fault containment through the HTTP server (sim engine in process): an engine exception in one
graph fails only that graph's requests with a clear 500 (or an SSE error event), the server
keeps serving, and a fault storm (every 10th graph raises) leaks nothing and leaves every other
response exactly right. The runtime-level versions (timing faults, ranks) are in
tests/engine/test_runtime_faults.py."""

from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from helios.server import EngineOptions, ServerSettings, build_backend, create_app

from .support import sse_events, wait_for

SLOTS = 4


def make_client():
    backend = build_backend(EngineOptions(engine="sim", slots=SLOTS, max_context=256, prefill_capacity=256,
                                          sim_pace=0.0))
    return TestClient(create_app(backend, ServerSettings(max_queue=64)))


def assert_idle(client) -> None:
    service = client.app.state.service

    def idle():
        snap = service.runtime.scheduler_stats
        return (service.live == 0 and snap.live == 0 and snap.free_slots == snap.total_slots
                and snap.free_pages == snap.total_pages)

    wait_for(idle, 30, "every slot and page to come back after the faults")
    assert client.get("/health").json() == {"status": "ok"}


def echo(prompt: str, n: int) -> str:
    return (prompt * (n // len(prompt) + 1))[:n]  # the sim engine echoes the prompt cyclically


def test_engine_exception_fails_only_that_graphs_requests():
    """Rule: a graph that raises fails its own requests (500, code engine_error, with the
    engine's message); a request in other graphs completes; the server keeps serving."""
    with make_client() as c:
        core = c.app.state.service.backend.core
        core.faults.raise_on.add(1)  # the very first graph: the first request's prefill
        r = c.post("/v1/completions", json={"prompt": "doomed", "max_tokens": 5})
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["code"] == "engine_error" and "injected fault at fence 1" in err["message"]
        ok = c.post("/v1/completions", json={"prompt": "fine", "max_tokens": 6})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "finefi"
        stream = c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4, "stream": True})
        assert "".join(e["choices"][0]["text"] for e in sse_events(stream.text)[:-1]) == "abca"
        assert c.app.state.service.runtime.stats.faults == 1
        assert_idle(c)


def test_fault_storm_every_tenth_graph_keeps_other_responses_exact():
    """Rule: with every 10th graph raising under concurrent load, each request either completes
    with exactly its uninterrupted text or fails with a clear error; nothing leaks; the server
    then serves normally."""
    with make_client() as c:
        core = c.app.state.service.backend.core
        core.faults.raise_every = 10
        results: dict[int, object] = {}
        prompts = [f"req{i}-" + "xyz"[: i % 3 + 1] for i in range(40)]

        def worker(indices):
            for i in indices:
                body = {"prompt": prompts[i], "max_tokens": 3 + i % 7, "stream": i % 2 == 0}
                results[i] = c.post("/v1/completions", json=body)

        threads = [threading.Thread(target=worker, args=(range(k, 40, 8),)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a client was never answered"
        completed = failed = 0
        for i, r in results.items():
            want = echo(prompts[i], 3 + i % 7)
            if i % 2 == 0:  # streamed: 200 with text and a finish, or an error event
                events = [e for e in sse_events(r.text) if e != "[DONE]"]
                if "error" in events[-1]:
                    assert events[-1]["error"]["code"] == "engine_error"
                    failed += 1
                else:
                    assert "".join(e["choices"][0]["text"] for e in events) == want
                    completed += 1
            elif r.status_code == 500:
                assert r.json()["error"]["code"] == "engine_error"
                failed += 1
            else:
                assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
                completed += 1
        assert len(results) == 40 and failed >= 1 and completed >= 10, (completed, failed)
        assert c.app.state.service.runtime.stats.faults >= 1 and c.app.state.service.runtime.error is None
        core.faults.raise_every = None
        assert_idle(c)
        after = c.post("/v1/completions", json={"prompt": "after", "max_tokens": 5})
        assert after.json()["choices"][0]["text"] == "after"

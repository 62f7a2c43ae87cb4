"""/debug/decisions (JSON with ?since=, and SSE), /debug/stats and /dashboard, in process.

Rules: the decisions are the ones that ran (their graphs add up to /metrics' graph counters); `since`
returns only newer ones; the SSE stream carries the same decisions with their sequence numbers as
event ids; with an API key set, every /debug route answers 401 without it and 200 with it; the
dashboard page and its vendored chart library are served with the library's license.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from fastapi.testclient import TestClient

from helios.server import EngineOptions, ServerSettings, build_backend, create_app

from .support import graph_counts, wait_for


@pytest.fixture(scope="module")
def client():
    backend = build_backend(EngineOptions(engine="sim", slots=4, max_context=256, prefill_capacity=256, sim_pace=0.05))
    with TestClient(create_app(backend, ServerSettings(max_queue=8))) as c:
        yield c


def _complete(client, n: int) -> None:
    for i in range(n):
        r = client.post("/v1/completions", json={"model": "helios-sim", "prompt": "y" * (20 + 30 * i), "max_tokens": 5})
        assert r.status_code == 200, r.text


def _metrics(client) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_decisions_match_the_graph_counters_and_since_returns_only_newer_ones(client):
    _complete(client, 3)
    runtime = client.app.state.service.runtime
    assert wait_for(lambda: runtime.wait_idle(0.1), 30, "idle")
    body = client.get("/debug/decisions").json()
    assert body["last"] == body["data"][-1]["seq"] and body["recorded"] == len(body["data"]) < body["capacity"]
    counted = Counter(d["graph"] for d in body["data"])
    assert counted == Counter({k: int(v) for k, v in graph_counts(_metrics(client)).items() if v})
    ids = {r["id"] for d in body["data"] for r in d["cohort"]}
    assert all(i and i.startswith("cmpl-") for i in ids)  # the API's request ids
    assert all(d["measured_ms"] is not None for d in body["data"])
    mid = body["data"][len(body["data"]) // 2]["seq"]
    newer = client.get(f"/debug/decisions?since={mid}").json()["data"]
    assert [d["seq"] for d in newer] == [d["seq"] for d in body["data"] if d["seq"] > mid]
    assert client.get(f"/debug/decisions?since={body['last']}").json()["data"] == []
    assert client.get("/debug/decisions?since=-1").status_code == 400


def test_a_decision_recorded_while_a_poll_is_answered_is_not_skipped():
    """`last` is the newest decision the answer holds: the step thread may record one between the
    answer's read of the log and its read of `last`, and a client polling with `since=last` (the
    dashboard) must still get it next time. The dashboard test found this: one row in ~110 missing."""
    from helios.runtime.decisions import DecisionLog
    from helios.server.debug import decisions_body

    class Racing(DecisionLog):
        def since(self, seq=0, limit=None):
            items = super().since(seq, limit)
            self._raw.append((self.last + 1, None))  # the step thread records one more meanwhile
            return items

    log = Racing(maxlen=8)
    log._raw.extend((seq, None) for seq in (1, 2, 3))
    log._format = lambda entries: [{"seq": e[0]} for e in entries]
    body = decisions_body(log, 0, 1024)
    assert [d["seq"] for d in body["data"]] == [1, 2, 3] and body["last"] == 3
    polled = [body]
    for _ in range(2):  # polling on: every decision comes exactly once, each racing one the next time
        polled.append(decisions_body(log, polled[-1]["last"], 1024))
    assert [d["seq"] for b in polled for d in b["data"]] == [1, 2, 3, 4, 5]
    assert decisions_body(DecisionLog(maxlen=8), 7, 1024)["last"] == 7  # nothing newer: the client's own


def test_the_stream_sends_each_new_decision_once_with_its_sequence_as_event_id(client):
    start = client.get("/debug/decisions").json()["last"]
    _complete(client, 2)
    expected = client.get(f"/debug/decisions?since={start}").json()["data"]
    events = []
    with client.stream("GET", f"/debug/decisions/stream?since={start}") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        event = {}
        for line in r.iter_lines():
            if line.startswith("id: "):
                event["id"] = int(line[4:])
            elif line.startswith("data: "):
                event["data"] = json.loads(line[6:])
            elif line == "" and "data" in event:
                events.append(event)
                event = {}
                if len(events) == len(expected):
                    break
    assert [e["id"] for e in events] == [d["seq"] for d in expected]
    assert [e["data"]["graph"] for e in events] == [d["graph"] for d in expected]


def test_stats_give_slots_queue_tokens_latency_and_graph_counts(client):
    _complete(client, 2)
    s = client.get("/debug/stats").json()
    assert s["slots"] == 4 and 0 <= s["free_slots"] <= 4 and s["output_tokens"] >= 10
    assert s["latency"]["requests"] >= 2 and set(s["latency"]["ttft_ms"]) == {"p50", "p90", "p99"}
    assert s["graphs"] == {k: int(v) for k, v in graph_counts(_metrics(client)).items() if v}
    assert s["decisions"]["recorded"] >= sum(s["graphs"].values())


def test_an_api_key_guards_every_debug_route_but_not_the_page():
    backend = build_backend(EngineOptions(engine="sim", slots=2, max_context=256, prefill_capacity=256))
    with TestClient(create_app(backend, ServerSettings(max_queue=4, api_key="sekrit"))) as client:
        for path in ("/debug/decisions", "/debug/stats", "/debug/decisions/stream?since=0"):
            r = client.get(path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
            assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/debug/stats", headers={"Authorization": "Bearer sekrit"}).status_code == 200
        assert client.get("/dashboard").status_code == 200


def test_the_dashboard_and_its_vendored_library_are_served(client):
    page = client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="decisions"' in page.text and "/dashboard/uPlot.iife.min.js" in page.text
    lib = client.get("/dashboard/uPlot.iife.min.js")
    assert lib.status_code == 200 and "uPlot" in lib.text[:2000]
    assert "MIT License" in client.get("/dashboard/LICENSE-uPlot").text
    assert client.get("/dashboard/dashboard.js").status_code == 200
    assert client.get("/dashboard/../app.py").status_code == 404
    assert client.get("/dashboard/nothing.js").status_code == 404

"""The HTTP API in process (FastAPI TestClient) against a paced SimCore that echoes prompts:
schemas, SSE format, usage, every bad-input case, 429 on a full queue, models, metrics."""

from __future__ import annotations

import threading

import openai
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from helios.server import EngineOptions, ServerSettings, build_backend, create_app

from .support import sse_events, wait_for

SLOTS = 4
MAX_CONTEXT = 256


def make_client(slots=SLOTS, max_queue=8, pace=0.2, **settings) -> TestClient:
    backend = build_backend(EngineOptions(engine="sim", slots=slots, max_context=MAX_CONTEXT,
                                          prefill_capacity=256, sim_pace=pace))
    return TestClient(create_app(backend, ServerSettings(max_queue=max_queue, **settings)))


@pytest.fixture(scope="module")
def client():
    with make_client(max_body_bytes=64 * 1024) as c:
        yield c
        assert_idle(c)


def service(client: TestClient):
    return client.app.state.service


def scheduler_snapshot(client: TestClient):
    """The scheduler's snapshot, taken under the runtime's lock (the scheduler is not thread-safe)."""
    return service(client).runtime.scheduler_stats


def assert_idle(client: TestClient, timeout: float = 30.0) -> None:
    """No live request, and every slot and page back (through the fence rules)."""
    s = service(client)

    def idle():
        snap = scheduler_snapshot(client)
        return (s.live == 0 and snap.live == 0 and snap.free_slots == snap.total_slots
                and snap.free_pages == snap.total_pages)

    wait_for(idle, timeout, f"every slot and page to come back (last: {scheduler_snapshot(client)})")


class CoreGate:
    """Holds every engine frame until released, so a test controls what is still running
    (no timing assumptions): wraps the backend core's execute in place."""

    def __init__(self, core):
        self.release = threading.Event()
        self.entered = threading.Event()
        inner = core.execute

        def execute(plan, fence):
            self.entered.set()
            if not self.release.wait(60):
                raise RuntimeError("CoreGate was never released")
            return inner(plan, fence)

        core.execute = execute


def assert_error(response, status: int, param: str | None = "any"):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    if param != "any":
        assert err["param"] == param, err
    return err


# ---- endpoints and formats ---------------------------------------------------------------------

def test_health_models_metrics(client):
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "helios-sim"
    assert client.get("/v1/models/helios-sim").json()["id"] == "helios-sim"
    assert_error(client.get("/v1/models/gpt-4"), 404, "model")
    client.post("/v1/completions", json={"prompt": "warm", "max_tokens": 2})
    text = client.get("/metrics").text
    for name in ("flare_scheduler_execution_nanoseconds_total{class=\"ordinary\"}",
                 "flare_scheduler_executions_total{class=\"discovery\"}",
                 "flare_scheduler_executions_total{class=\"timing_refresh\"}",
                 "flare_scheduler_executions_total{class=\"acceptance_learning\"}",
                 "flare_speculative_programs_total", "flare_speculative_offered_tokens_total",
                 "flare_speculative_accepted_tokens_total", "flare_speculative_emitted_tokens_total",
                 "flare_speculative_learned_draws_total", "flare_graph_executions_total{kind=\"prefill\"",
                 "flare_requests_running", "flare_requests_waiting", "flare_time_to_first_token_seconds_bucket",
                 "flare_inter_token_latency_seconds_bucket", "flare_request_slots_free", "flare_kv_pages_free"):
        assert name in text, name
    # Every finished frame had one timed decision and one timed completion.
    assert_idle(client)
    samples = [s for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples]
    frames = sum(s.value for s in samples if s.name == "flare_graph_executions_total")
    plain = {s.name: s.value for s in samples if not s.labels}
    assert frames > 0
    assert plain["flare_scheduler_decision_seconds_count"] == plain["flare_frame_completion_seconds_count"] == frames
    assert plain["flare_scheduler_decision_seconds_sum"] > 0 and plain["flare_frame_completion_seconds_sum"] > 0


def test_completion_usage_and_echo(client):
    r = client.post("/v1/completions", json={"prompt": "abcdef", "max_tokens": 9, "temperature": 0})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["choices"][0] == {"index": 0, "text": "abcdefabc", "logprobs": None, "finish_reason": "length"}
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 9, "total_tokens": 15}
    ids = list(b"xyz")
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 4, "echo": True})
    assert r.json()["choices"][0]["text"] == "xyz" + "xyzx"
    r = client.post("/v1/completions", json={"prompt": ["hello"], "max_tokens": 2})
    assert r.json()["choices"][0]["text"] == "he"


def test_stop_strings(client):
    r = client.post("/v1/completions", json={"prompt": "abcXdef", "max_tokens": 20, "stop": "Xd"})
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("abc", "stop")
    r = client.post("/v1/completions", json={"prompt": "abcXdef", "max_tokens": 20, "stop": ["zz", "c"],
                                             "stream": True})
    chunks = [e for e in sse_events(r.text) if e != "[DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "ab"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_content_forms(client):
    a = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi there"}],
                                                  "max_tokens": 30}).json()
    b = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}],
        "max_completion_tokens": 30}).json()
    assert a["object"] == "chat.completion"
    prompt = "<|user|>hi there\n<|assistant|>"  # the sim tokenizer's template; the core echoes it
    assert a["choices"][0]["message"] == {"role": "assistant", "content": (prompt * 2)[:30]}
    assert b["choices"][0]["message"]["content"].startswith("<|user|>hi\nthere\n")
    assert a["usage"]["completion_tokens"] == 30


def test_sse_format_and_usage(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "stream"}],
                                                  "max_tokens": 6, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": len("<|user|>stream\n<|assistant|>"), "completion_tokens": 6,
        "total_tokens": len("<|user|>stream\n<|assistant|>") + 6}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert text == "<|user"
    # Without include_usage no chunk carries a usage key.
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "stream": True, "echo": True})
    chunks = [e for e in sse_events(r.text) if e != "[DONE]"]
    assert all("usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "abcabc"


def test_openai_client(client):
    oc = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    out = oc.completions.create(model="helios-sim", prompt="hello", max_tokens=5, temperature=0, seed=7)
    assert out.choices[0].text == "hello" and out.usage.completion_tokens == 5
    chat = oc.chat.completions.create(model="helios-sim", messages=[{"role": "user", "content": "q"}], max_tokens=3,
                                      stream=True, stream_options={"include_usage": True})
    parts = list(chat)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == "<|u"
    assert parts[-1].usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError, match="n must be between 1 and 128"):
        oc.completions.create(model="helios-sim", prompt="x", n=200)
    with pytest.raises(openai.NotFoundError):
        oc.completions.create(model="gpt-4", prompt="x")


# ---- bad input ---------------------------------------------------------------------------------

LONG = "y" * (MAX_CONTEXT + 10)
BAD_COMPLETIONS = [
    ({"prompt": "x", "foo": 1}, "foo"),
    ({"prompt": "x", "max_tokens": "3"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1, "a"]}, "any"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**30}, "max_tokens"),
    ({"prompt": "x", "max_tokens": MAX_CONTEXT}, "max_tokens"),
    ({"prompt": LONG}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1], []]}, "prompt.1"),
    ({"prompt": ["a", 5]}, "prompt"),
    ({"prompt": [300]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "suffix": "s"}, "suffix"),
    ({"prompt": "x", "temperature": 2.5}, "temperature"),
    ({"prompt": "x", "temperature": None, "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "min_p": 1.5}, "min_p"),
    ({"prompt": "x", "min_p": -0.1}, "min_p"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "repetition_penalty": 1e7}, "repetition_penalty"),
    ({"prompt": "x", "logit_bias": {"x1": 2.0}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"1": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"100000": 1}}, "logit_bias"),
]
BAD_CHATS = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "messages.0.extra"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
     "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": LONG}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "modalities": ["text", "audio"]}, "modalities"),
    ({"messages": [{"role": "user", "content": "x"}], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"messages": [{"role": "user", "content": "x"}], "prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"}, "reasoning_effort"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "nope"}, "model"),
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS, ids=lambda v: str(v)[:40] if isinstance(v, dict) else None)
def test_bad_completion_requests(client, body, param):
    r = client.post("/v1/completions", json=body)
    assert_error(r, 404 if param == "model" else 400, param)


@pytest.mark.parametrize("body,param", BAD_CHATS, ids=lambda v: str(v)[:40] if isinstance(v, dict) else None)
def test_bad_chat_requests(client, body, param):
    r = client.post("/v1/chat/completions", json=body)
    assert_error(r, 404 if param == "model" else 400, param)


@pytest.mark.parametrize("raw,code", [
    (b"{not json", "invalid_json"), (b"", "invalid_json"), (b"[1, 2]", "invalid_json"), (b"null", "invalid_json"),
    (b'{"prompt": "caf\xe9"}', "invalid_encoding"), (b'{"prompt": "\\ud800"}', "invalid_json"),
    (b'{"prompt": "x", "temperature": NaN}', "invalid_value"), (b'{"prompt": "x", "max_tokens": 1e999}', "invalid_value"),
])
def test_raw_bodies(client, raw, code):
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert assert_error(r, 400)["code"] == code


def test_body_too_large(client):
    big = b'{"prompt": "' + b"a" * (70 * 1024) + b'"}'
    json_type = {"content-type": "application/json"}
    assert assert_error(client.post("/v1/completions", content=big, headers=json_type), 413)["code"] == "body_too_large"

    def chunked():  # no content-length: the limit is enforced while reading
        for _ in range(70):
            yield b"a" * 1024
    assert_error(client.post("/v1/completions", content=chunked(), headers=json_type), 413)


def test_unknown_routes_and_methods(client):
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/completions"), 405)


def test_no_slot_leaks_after_errors(client):
    assert_idle(client)
    assert client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 3}).status_code == 200


# ---- overload and shutdown -------------------------------------------------------------------------

def test_queue_full_answers_429():
    """Rule: past slots + --max-queue, a request gets 429 with Retry-After at once (it is never
    queued): it is answered while the engine is held, so nothing else could have finished. (One
    client fills the whole bound here; the client share is tests/server/test_guards.py's.)"""
    with make_client(slots=1, max_queue=1, pace=0.0, client_share=1.0) as c:
        s = service(c)
        gate = CoreGate(s.backend.core)
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            c.post("/v1/completions", json={"prompt": "long", "max_tokens": 150}).status_code)) for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: s.live == 2 and gate.entered.is_set(), 30, "two admitted requests and a held frame")
        r = c.post("/v1/completions", json={"prompt": "one more", "max_tokens": 2})
        assert assert_error(r, 429)["code"] == "queue_full" and r.headers["retry-after"] == "1"
        assert s.live == 2 and results == []  # answered while both were still held
        gate.release.set()
        for t in threads:
            t.join(60)
        assert results == [200, 200]
        assert c.post("/v1/completions", json={"prompt": "after", "max_tokens": 2}).status_code == 200
        assert_idle(c)


def test_draining_answers_503():
    with make_client() as c:
        s = service(c)
        s.draining = True
        assert c.get("/health").status_code == 503
        assert assert_error(c.post("/v1/completions", json={"prompt": "x"}), 503)["code"] == "shutting_down"
        s.draining = False


def release_after_cancel(s, gate: CoreGate) -> None:
    """Release the held frame only once shutdown has ended the request, so the request
    certainly outlives the grace period, however slow the machine."""
    def run():
        wait_for(lambda: s.live == 0, 60, "shutdown to end the request")
        gate.release.set()
    threading.Thread(target=run, daemon=True).start()


def test_shutdown_cancels_inflight_within_grace():
    """Rule: drain() ends a request that outlives the grace period with a clear 503 and
    returns (its threads joined within its bound); the slot comes back."""
    with make_client(slots=2, pace=0.0, shutdown_grace_s=0.2) as c:
        s = service(c)
        gate = CoreGate(s.backend.core)  # held: the request cannot finish within the grace
        out = {}
        t = threading.Thread(target=lambda: out.update(r=c.post("/v1/completions", json={
            "prompt": "slow", "max_tokens": 240})))
        t.start()
        wait_for(lambda: s.live == 1 and gate.entered.is_set(), 30, "the request to reach the engine")
        release_after_cancel(s, gate)
        assert s.drain()
        t.join(60)
        assert not t.is_alive(), "the client was never answered"
        err = assert_error(out["r"], 503)
        assert err["code"] == "cancelled" and "shutting down" in err["message"]
        snap = scheduler_snapshot(c)
        assert (snap.free_slots, snap.free_pages, snap.live) == (2, snap.total_pages, 0)


def test_shutdown_ends_streams_with_an_error_event():
    """Rule: a stream cut by shutdown ends with an error event (code "cancelled") and [DONE]."""
    with make_client(slots=2, pace=0.0, shutdown_grace_s=0.2) as c:
        s = service(c)
        gate = CoreGate(s.backend.core)
        out = {}
        t = threading.Thread(target=lambda: out.update(r=c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "slow"}], "max_tokens": 200, "stream": True})))
        t.start()
        wait_for(lambda: s.live == 1 and gate.entered.is_set(), 30, "the stream to reach the engine")
        release_after_cancel(s, gate)
        assert s.drain()
        t.join(60)
        assert not t.is_alive(), "the client was never answered"
        events = sse_events(out["r"].text)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "cancelled"
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"

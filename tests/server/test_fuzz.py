"""Hypothesis fuzz of the request schemas: random JSON bodies, field types and raw bytes. Every
answer is a 200 or a 4xx in OpenAI's error shape (never a 5xx, never a hang); afterwards /health
is OK and every slot and page is free."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helios.server import EngineOptions, ServerSettings, build_backend, create_app

from .support import sse_events, wait_for

SLOTS = 4

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=20))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=8)
small_int = st.integers(-3, 40)
text_part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]), "text": st.text(max_size=20)})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "nobody"]) | anything},
    optional={"content": st.text(max_size=40) | st.lists(text_part, max_size=3) | anything,
              "name": st.text(max_size=5) | anything})

FIELDS = {
    "model": st.sampled_from(["helios-sim", "gpt-4"]) | anything,
    "max_tokens": small_int | st.integers(-(2**63), 2**63) | anything,
    "max_completion_tokens": small_int | anything,
    "temperature": st.floats(-1, 3) | anything, "top_p": st.floats(-0.5, 1.5) | anything,
    "top_k": small_int | anything, "seed": st.integers(-5, 2**64) | anything,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=5) | anything,
    "n": st.integers(0, 3) | anything, "stream": st.booleans() | anything,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | anything,
    "echo": st.booleans() | anything, "logprobs": st.none() | st.booleans() | small_int | anything,
    "user": st.text(max_size=8) | anything, "presence_penalty": st.floats(-1, 1) | anything,
    "prompt": st.text(max_size=60) | st.lists(st.integers(-3, 300), max_size=30) | st.lists(st.text(max_size=10),
                                                                                              max_size=2) | anything,
    "messages": st.lists(message, max_size=3) | anything,
}
known = st.fixed_dictionaries({}, optional=FIELDS)
# Mostly well-formed requests, so the success and streaming paths are exercised too.
SANE = {"max_tokens": st.integers(1, 40), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
        "top_k": st.integers(-1, 50), "seed": st.integers(0, 2**62), "stream": st.booleans(),
        "stop": st.text("abcxyz<|>", min_size=1, max_size=3), "user": st.text(max_size=5), "n": st.integers(1, 3)}
sane_completion = st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=60)},
                                        optional={**SANE, "echo": st.booleans()})
sane_chat = st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=40)}), min_size=1,
    max_size=3)}, optional=SANE)
mutation = st.dictionaries(st.sampled_from(sorted(FIELDS)) | st.text(max_size=6), anything, max_size=1)


def bodies(chat: bool):
    sane = sane_chat if chat else sane_completion
    return (sane | st.tuples(sane, mutation).map(lambda t: {**t[0], **t[1]}) | known
            | st.tuples(known, mutation).map(lambda t: {**t[0], **t[1]}))


@pytest.fixture(scope="module")
def client():
    backend = build_backend(EngineOptions(engine="sim", slots=SLOTS, max_context=256, prefill_capacity=256,
                                          sim_pace=0.0))
    with TestClient(create_app(backend, ServerSettings(max_queue=8, max_body_bytes=16 * 1024))) as c:
        yield c


def check(response) -> None:
    event(f"status {response.status_code}")
    assert response.status_code in (200, 400, 404, 413, 429), (response.status_code, response.text[:500])
    if response.status_code != 200:
        err = response.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = sse_events(response.text)
        assert events[-1] == "[DONE]" and all(isinstance(e, dict) for e in events[:-1])
    else:
        choices = response.json()["choices"]
        assert [c["index"] for c in choices] == list(range(len(choices)))
        assert choices and all(c["finish_reason"] in ("stop", "length") for c in choices)


JSON = {"content-type": "application/json"}  # other types get 415 (tests/server/test_guards.py)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), chat=st.booleans())
def test_fuzz_json_bodies(client, data, chat):
    body = data.draw(bodies(chat))
    check(client.post("/v1/chat/completions" if chat else "/v1/completions", content=json.dumps(body), headers=JSON))


@settings(max_examples=80, deadline=None)
@given(raw=st.binary(max_size=200) | st.text(max_size=100).map(str.encode), chat=st.booleans())
def test_fuzz_raw_bodies(client, raw, chat):
    check(client.post("/v1/chat/completions" if chat else "/v1/completions", content=raw, headers=JSON))


def test_after_fuzz_everything_is_free(client):
    """Runs after the fuzz above (same client): nothing live, every slot and page free."""
    service = client.app.state.service

    def snapshot():
        return service.runtime.scheduler_stats

    wait_for(lambda: service.live == 0 and snapshot().live == 0 and snapshot().free_slots == SLOTS, 30,
             "every request to end after the fuzz")
    snap = snapshot()
    assert client.get("/health").json() == {"status": "ok"}
    assert (service.live, snap.free_slots, snap.free_pages) == (0, SLOTS, snap.total_pages)
    assert service.runtime.stats.faults == 0 and service.runtime.error is None
    assert client.post("/v1/completions", json={"prompt": "fine", "max_tokens": 4}).json()["choices"][0]["text"] == "fine"

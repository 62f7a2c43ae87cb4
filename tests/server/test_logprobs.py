"""Log-probabilities through the HTTP API (the echoing sim engine: every token has
log-probability 0 and is its own only alternative): OpenAI's completions and chat shapes,
streamed and whole, with several choices, one entry per output token and text offsets that
follow the text across chunks; and the echoed prompt's, from scored prefill graphs."""

from __future__ import annotations

import openai
from fastapi.testclient import TestClient

from helios.server import EngineOptions, ServerSettings, build_backend, create_app

from .support import sse_events
from .test_choices import client  # noqa: F401 (a fixture: the unpaced sim server of 4 slots)


def test_completion_logprobs_cover_every_token_with_offsets(client):
    body = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5, "logprobs": 2}).json()
    (choice,) = body["choices"]
    lp = choice["logprobs"]
    assert choice["text"] == "abcab" == "".join(lp["tokens"])
    assert lp["token_logprobs"] == [0.0] * 5 and lp["text_offset"] == [0, 1, 2, 3, 4]
    assert lp["top_logprobs"] == [{t: 0.0} for t in "abcab"]
    assert body["usage"]["completion_tokens"] == len(lp["tokens"])


def test_streamed_completion_logprobs_continue_the_offsets(client):
    r = client.post("/v1/completions", json={"prompt": "xyz", "max_tokens": 7, "logprobs": 0, "stream": True})
    chunks = [e for e in sse_events(r.text) if e != "[DONE]"]
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    assert "".join(t for p in parts for t in p["tokens"]) == "xyzxyzx"
    assert [o for p in parts for o in p["text_offset"]] == list(range(7))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["choices"][0]["logprobs"] is None


def test_chat_logprobs_per_choice_with_bytes_and_top_alternatives(client):
    body = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "q"}], "max_tokens": 3,
                                                     "logprobs": True, "top_logprobs": 1, "n": 2}).json()
    for choice in body["choices"]:
        content = choice["logprobs"]["content"]
        assert "".join(c["token"] for c in content) == choice["message"]["content"] == "<|u"
        assert [c["bytes"] for c in content] == [[ord("<")], [ord("|")], [ord("u")]]
        assert all(c["top_logprobs"] == [{"token": c["token"], "logprob": 0.0, "bytes": c["bytes"]}] for c in content)
    plain = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "q"}],
                                                      "max_tokens": 3, "logprobs": False}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_a_stop_string_keeps_one_entry_per_token_id(client):
    """The tokens that completed a stop string are reported though their text is cut: the
    response accounts for every generated token."""
    body = client.post("/v1/completions", json={"prompt": "abcXdef", "max_tokens": 20, "stop": "Xd",
                                                "logprobs": 0}).json()
    (choice,) = body["choices"]
    assert choice["text"] == "abc" and choice["finish_reason"] == "stop"
    assert "".join(choice["logprobs"]["tokens"]).startswith("abcX")
    assert len(choice["logprobs"]["tokens"]) == body["usage"]["completion_tokens"]


def test_openai_client_parses_both_shapes(client):
    oc = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    out = oc.completions.create(model="helios-sim", prompt="hi", max_tokens=3, logprobs=1)
    assert out.choices[0].logprobs.tokens == ["h", "i", "h"]
    chat = oc.chat.completions.create(model="helios-sim", messages=[{"role": "user", "content": "q"}], max_tokens=2,
                                      logprobs=True, top_logprobs=0, stream=True)
    content = [c for part in chat if part.choices and part.choices[0].logprobs
               for c in part.choices[0].logprobs.content]
    assert [c.token for c in content] == ["<", "|"] and all(c.top_logprobs == [] for c in content)


def test_echo_with_logprobs_scores_the_prompt_first(client):
    """Completions' echo with logprobs: the prompt's tokens come first (the first one null, which
    nothing predicts), then the output's, with offsets over the echoed text."""
    body = client.post("/v1/completions", json={"prompt": "abcd", "max_tokens": 2, "logprobs": 1,
                                                "echo": True}).json()
    lp = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"] == "abcdab" == "".join(lp["tokens"])
    assert lp["token_logprobs"] == [None, 0.0, 0.0, 0.0, 0.0, 0.0] and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == list(range(6))


def test_a_prompt_longer_than_a_chunk_is_scored_whole():
    """300 prompt tokens, prefill chunks of at most 256: two scored chunks give 300 entries."""
    backend = build_backend(EngineOptions(engine="sim", slots=2, max_context=512, prefill_capacity=256,
                                          sim_pace=0.0))
    with TestClient(create_app(backend, ServerSettings())) as c:
        body = c.post("/v1/completions", json={"prompt": "x" * 300, "max_tokens": 1, "logprobs": 0,
                                               "echo": True}).json()
        lp = body["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == 301 and lp["token_logprobs"].count(None) == 1
        shapes = c.app.state.service.runtime.stats.executions_by_shape
        assert sum(n for label, n in shapes.items() if label.startswith("scored_prefill")) == 2


def test_a_streamed_echo_waits_for_its_scores(client):
    r = client.post("/v1/completions", json={"prompt": "abcd", "max_tokens": 2, "logprobs": 0, "echo": True,
                                             "stream": True})
    chunks = [e["choices"][0] for e in sse_events(r.text) if e != "[DONE]"]
    assert chunks[0]["text"] == "abcd" and chunks[0]["logprobs"]["token_logprobs"] == [None, 0.0, 0.0, 0.0]
    assert "".join(c["text"] for c in chunks) == "abcdab"
    assert [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]] == list(range(6))


def test_without_scored_prefill_graphs_the_prompt_s_scores_are_refused():
    backend = build_backend(EngineOptions(engine="sim", slots=2, max_context=256, prefill_capacity=256,
                                          sim_pace=0.0, scored_prefill=False))
    with TestClient(create_app(backend, ServerSettings())) as c:
        r = c.post("/v1/completions", json={"prompt": "abcd", "max_tokens": 2, "logprobs": 0, "echo": True})
        assert r.status_code == 400 and "scored" in r.json()["error"]["message"]
        assert c.post("/v1/completions", json={"prompt": "abcd", "max_tokens": 2, "logprobs": 0}).status_code == 200

"""Log-probabilities through the HTTP API (the echoing sim engine: every token has
log-probability 0 and is its own only alternative): OpenAI's completions and chat shapes,
streamed and whole, with several choices, one entry per output token and text offsets that
follow the text across chunks."""

from __future__ import annotations

import openai

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

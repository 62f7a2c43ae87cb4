"""Several choices per request: `n` samples of a prompt and batched prompts on /v1/completions.
Each choice is one runtime request; the response carries them in OpenAI's index order (prompt by
prompt, then sample), usage counts a prompt once for its n samples, a seeded request gives its
j-th sample seed + j, and a choice that fails or is cancelled ends the others, so nothing leaks.
The engine is the paced sim core, which echoes each prompt's bytes cyclically."""

from __future__ import annotations

import threading

import openai
import pytest

from helios.server.translate import prepare_chat, prepare_completion
from helios.server.schemas import ChatCompletionRequest, CompletionRequest

from .support import sse_events, wait_for
from .test_api import CoreGate, assert_error, assert_idle, make_client, service


def echo(prompt: str, n: int) -> str:
    return (prompt * (n // len(prompt) + 1))[:n]


@pytest.fixture(scope="module")
def client():
    with make_client(slots=4, max_queue=8, pace=0.0) as c:
        yield c
        assert_idle(c)


def test_n_samples_come_back_in_index_order_with_the_prompt_counted_once(client):
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5, "n": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == ["abcab"] * 3
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 15, "total_tokens": 18}
    assert_idle(client)


def test_batched_prompts_are_prompt_major_and_usage_sums_them(client):
    r = client.post("/v1/completions", json={"prompt": ["ab", "xyz"], "max_tokens": 4, "n": 2, "echo": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == ["ab" + echo("ab", 4)] * 2 + ["xyz" + echo("xyz", 4)] * 2
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}
    ids = client.post("/v1/completions", json={"prompt": [[104, 105], [106]], "max_tokens": 3}).json()
    assert [c["text"] for c in ids["choices"]] == ["hih", "jjj"]
    assert_idle(client)


def test_streamed_choices_interleave_by_index_and_each_gets_its_finish(client):
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "q"}], "max_tokens": 6, "n": 2, "stream": True,
        "stream_options": {"include_usage": True}})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert roles == [0, 1]
    texts, finishes = {0: "", 1: ""}, {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        texts[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"] is not None:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {0: "<|user", 1: "<|user"} and finishes == {0: "length", 1: "length"}
    prompt = len("<|user|>q\n<|assistant|>")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12}
    assert_idle(client)


def test_openai_client_reads_several_choices(client):
    oc = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    out = oc.completions.create(model="helios-sim", prompt=["one", "two"], max_tokens=3, n=2, temperature=0)
    assert [(c.index, c.text) for c in out.choices] == [(0, "one"), (1, "one"), (2, "two"), (3, "two")]
    chat = oc.chat.completions.create(model="helios-sim", messages=[{"role": "user", "content": "q"}], max_tokens=3,
                                      n=3)
    assert [c.message.content for c in chat.choices] == ["<|u"] * 3 and chat.usage.completion_tokens == 9


def test_seeded_samples_get_seed_plus_index_and_labels_of_their_own():
    tok = make_client().app.state.service.backend.tokenizer
    req = CompletionRequest.model_validate({"prompt": ["a", "b"], "n": 3, "seed": 7})
    prepared = prepare_completion(req, tok, 256, 256)
    assert [c.params.seed for c in prepared.choices] == [7, 8, 9, 7, 8, 9]
    assert [c.counts_prompt for c in prepared.choices] == [True, False, False] * 2
    assert len({c.params.request_id for c in prepared.choices}) == 6
    assert all(c.params.request_id.startswith(prepared.request_id) for c in prepared.choices)
    chat = prepare_chat(ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "n": 2}),
                        tok, 256, 256)
    assert [c.params.seed for c in chat.choices] == [None, None]
    # seed + j wraps within the seed's range instead of leaving it.
    top = prepare_completion(CompletionRequest.model_validate({"prompt": "a", "n": 2, "seed": 2**63 - 1}), tok, 256, 256)
    assert [c.params.seed for c in top.choices] == [2**63 - 1, 0]


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 129}, "n"),
    ({"prompt": ["ok", ""]}, "prompt.1"),
    ({"prompt": [[104], [300]]}, "prompt.1"),
    ({"prompt": ["ok", "y" * 300]}, "prompt.1"),
    ({"prompt": "x", "n": 13}, "n"),  # more sequences than slots + queue (4 + 8) could ever hold
    ({"prompt": ["a"] * 7, "n": 2}, "n"),
])
def test_bad_choice_requests_name_the_field_and_submit_nothing(client, body, param):
    assert_error(client.post("/v1/completions", json=body), 400, param)
    assert service(client).live == 0


def test_sequences_past_the_admission_bound_get_429_and_none_is_submitted():
    with make_client(slots=1, max_queue=2, pace=0.0, client_share=1.0) as c:  # one client fills the bound
        s = service(c)
        gate = CoreGate(s.backend.core)
        done = []
        t = threading.Thread(target=lambda: done.append(c.post("/v1/completions", json={
            "prompt": "held", "max_tokens": 20, "n": 2})))
        t.start()
        wait_for(lambda: s.live == 2 and gate.entered.is_set(), 30, "two admitted choices and a held frame")
        r = c.post("/v1/completions", json={"prompt": "two more", "max_tokens": 2, "n": 2})
        assert assert_error(r, 429)["code"] == "queue_full"
        assert s.live == 2  # neither of the refused request's choices was submitted
        gate.release.set()
        t.join(60)
        assert done[0].status_code == 200 and len(done[0].json()["choices"]) == 2
        assert_idle(c)


def test_a_cancelled_choice_ends_the_request_and_cancels_the_others():
    with make_client(slots=4, pace=0.2) as c:  # paced: the other choices are still running when it ends
        s = service(c)
        gate = CoreGate(s.backend.core)
        submitted, out = [], {}
        submit = s.submit
        s.submit = lambda *args: submitted.append(submit(*args)) or submitted[-1]
        for stream in (False, True):
            gate.release.clear()
            gate.entered.clear()
            t = threading.Thread(target=lambda: out.update(r=c.post("/v1/completions", json={
                "prompt": "abc", "max_tokens": 240, "n": 3, "stream": stream})))
            t.start()
            wait_for(lambda: submitted and gate.entered.is_set(), 30, "three choices and a held frame")
            choices = submitted.pop()
            choices.streams[1].cancel()
            gate.release.set()
            t.join(60)
            if stream:
                events = sse_events(out["r"].text)
                assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "cancelled"
            else:
                assert assert_error(out["r"], 503)["code"] == "cancelled"
            assert all(st.finish_reason == "cancelled" for st in choices.streams)
            assert_idle(c)

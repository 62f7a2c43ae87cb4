"""Real clients' request bodies, replayed exactly: guidellm 0.8's chat and text bodies, and what
the openai SDK sends, against the sim engine in process; vLLM's stopping extensions against the
real model.

Rules tested:
- guidellm's bodies (ignore_eos, stop: null, stream_options.continuous_usage_stats, content
  parts) are served, with usage on every chunk and the final usage chunk;
- the openai SDK's bodies, with seed, stop, max_completion_tokens and vLLM fields in
  extra_body, are served;
- an unknown field is rejected with a 400 that names it (the documented choice);
- null for a field OpenAI marks nullable (stream, echo, n, logprobs, tools, functions, ...) is
  served as if the field were absent, as clients that serialize every field send it; OpenAI's
  deprecated functions / function_call, tool messages and tool calls get the 400 that tools get;
- ignore_eos generates past EOS, min_tokens holds EOS back, stop_token_ids end a request.
"""

from __future__ import annotations

import openai
import pytest
import torch
from fastapi.testclient import TestClient

from helios.engine.torch_core import TorchCore, load_model
from helios.runtime.driver import SyncDriver
from helios.config import PolicyConfig
from helios.errors import InvalidRequest
from helios.scheduler import Scheduler
from helios.server import EngineOptions, ServerSettings, build_backend, create_app

from .support import sse_events

PROMPT = "Summarize the history of the printing press in three sentences."
# guidellm 0.8 (backends/openai request handlers), chat: a user message of text content parts.
GUIDELLM_CHAT = {
    "model": "helios-sim", "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "max_completion_tokens": 24, "max_tokens": 24, "stop": None, "ignore_eos": True,
    "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
}
GUIDELLM_TEXT = {
    "model": "helios-sim", "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "max_tokens": 24, "stop": None, "ignore_eos": True, "prompt": PROMPT,
}


@pytest.fixture(scope="module")
def client():
    backend = build_backend(EngineOptions(engine="sim", slots=4, max_context=256, prefill_capacity=256,
                                          sim_pace=0.05))
    with TestClient(create_app(backend, ServerSettings(max_queue=8))) as c:
        yield c


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", GUIDELLM_CHAT),
                                       ("/v1/completions", GUIDELLM_TEXT)], ids=["chat", "text"])
def test_guidellm_bodies_stream_usage_on_every_chunk(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["usage"] is not None for c in chunks), chunks  # continuous_usage_stats
    completions = [c["usage"]["completion_tokens"] for c in chunks]
    assert completions == sorted(completions)  # counts only grow
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-1]["usage"]["prompt_tokens"] > 0


def test_include_usage_alone_keeps_openai_nulls(client):
    body = {**GUIDELLM_CHAT, "stream_options": {"include_usage": True}}
    chunks = sse_events(client.post("/v1/chat/completions", json=body).text)[:-1]
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["usage"]["completion_tokens"] == 24


def test_openai_sdk_bodies(client):
    oc = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    out = oc.chat.completions.create(
        model="helios-sim", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}],
        max_completion_tokens=12, temperature=0.7, top_p=0.9, seed=7, stop=["\n\n"], user="bench", n=1,
        presence_penalty=0, frequency_penalty=0, store=False, metadata={"run": "1"},
        extra_body={"ignore_eos": True, "min_tokens": 4, "stop_token_ids": [2], "top_k": 40})
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage.completion_tokens <= 12
    stream = oc.chat.completions.create(model="helios-sim", messages=[{"role": "user", "content": PROMPT}],
                                        max_tokens=8, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 8
    text = oc.completions.create(model="helios-sim", prompt=PROMPT, max_tokens=5, seed=1, stop="\n", echo=False)
    assert text.usage.completion_tokens <= 5
    text_only = oc.chat.completions.create(model="helios-sim", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=3, modalities=["text"])
    assert text_only.usage.completion_tokens == 3


@pytest.mark.parametrize("field,value", [("max_token", 5), ("temprature", 0.5), ("best_of_n", 2)])
def test_unknown_fields_are_rejected_by_name(client, field, value):
    r = client.post("/v1/chat/completions", json={**GUIDELLM_CHAT, "stream": False, "stream_options": None,
                                                   field: value})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == field and err["code"] == "unknown_parameter" and field in err["message"]


# Every optional field as null, the way clients that serialize whole request objects send them.
NULL_CHAT = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, **dict.fromkeys((
    "model", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options", "user", "store", "metadata",
    "service_tier", "presence_penalty", "frequency_penalty", "logit_bias", "max_completion_tokens", "logprobs",
    "top_logprobs", "response_format", "tools", "tool_choice", "parallel_tool_calls", "functions",
    "function_call", "modalities", "audio", "prediction", "reasoning_effort", "repetition_penalty", "min_p",
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_whitespace_pattern",
    "guided_decoding_backend", "add_generation_prompt", "continue_final_message", "include_stop_str_in_output",
    "chat_template_kwargs", "skip_special_tokens", "allowed_token_ids"))}
NULL_TEXT = {"prompt": PROMPT, "max_tokens": 4, **dict.fromkeys((
    "model", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options", "user", "echo", "suffix",
    "best_of", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "repetition_penalty", "min_p",
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_whitespace_pattern",
    "guided_decoding_backend", "include_stop_str_in_output", "skip_special_tokens", "allowed_token_ids"))}


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", NULL_CHAT), ("/v1/completions", NULL_TEXT)],
                         ids=["chat", "text"])
def test_null_fields_mean_absent(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    out = r.json()  # not a stream: stream null is false
    assert out["usage"]["completion_tokens"] == 4 and out["choices"][0]["finish_reason"] == "length"
    if path == "/v1/completions":  # echo null is false: the text does not start with the prompt
        assert not out["choices"][0]["text"].startswith(PROMPT)


@pytest.mark.parametrize("extra,param,code", [
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions", "unsupported_parameter"),
    ({"function_call": "auto"}, "function_call", "unsupported_parameter"),
    ({"tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
    ({"stream": "yes"}, "stream", "invalid_value")])
def test_function_calling_and_bad_stream_get_a_400(client, extra, param, code):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}], **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["code"] == code, r.text


USER = {"role": "user", "content": PROMPT}


@pytest.mark.parametrize("messages,param,code", [
    ([USER, {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]}],
     "messages.1.tool_calls", "unsupported_parameter"),
    ([USER, {"role": "tool", "content": "42", "tool_call_id": "1"}], "messages.1.role", "unsupported_parameter"),
    ([USER, {"role": "function", "content": "42", "name": "f"}], "messages.1.role", "unsupported_parameter"),
    ([USER, {"role": "assistant"}], "messages.1.content", "missing_parameter"),
    ([{"role": "user", "content": None}], "messages.0.content", "missing_parameter"),
    ([{"role": "robot", "content": "x"}], "messages.0.role", "invalid_value")])
def test_tool_messages_and_missing_content_get_a_400_naming_them(client, messages, param, code):
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, code), r.text


@pytest.mark.parametrize("extra,param", [({"min_tokens": 99}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
                                         ({"stop_token_ids": [10 ** 9]}, "stop_token_ids"),
                                         ({"allowed_token_ids": []}, "allowed_token_ids"),
                                         ({"allowed_token_ids": [10 ** 9]}, "allowed_token_ids"),
                                         ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
                                         ({"allowed_token_ids": [5], "min_tokens": 1}, "allowed_token_ids"),
                                         ({"allowed_token_ids": [5], "guided_choice": ["a"], "ignore_eos": False},
                                          "allowed_token_ids"),
                                         ({"ignore_eos": "yes"}, "ignore_eos")])
def test_bad_vllm_fields_get_a_400(client, extra, param):
    r = client.post("/v1/chat/completions", json={**GUIDELLM_CHAT, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_include_stop_str_in_output_keeps_the_stop_string(client):
    # The sim engine echoes the prompt's bytes: "abcabc..." stops at "ca".
    for include, text in ((False, "ab"), (True, "abca"), (None, "ab")):
        r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 8, "stop": ["ca"],
                                                 "include_stop_str_in_output": include})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == text, r.text
        assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_min_p_reaches_the_core_and_zero_is_left_out():
    from helios.server.sampling_fields import sampling_params
    from helios.server.schemas import CompletionRequest

    assert sampling_params(CompletionRequest(prompt="x", min_p=0.05), 4, "r", 256).core_options == {"min_p": 0.05}
    assert sampling_params(CompletionRequest(prompt="x", min_p=0.0), 4, "r", 256).core_options == {}


# ---- the stopping extensions on the real model ---------------------------------------------------
@pytest.fixture(scope="module")
def core():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine tests: two threads crawl on a loaded 2-core box
    yield TorchCore(loaded=load_model(), request_slots=2, max_batch=2, max_context=256, prefill_chunks=(64,))
    torch.set_num_threads(threads)


def run(core, max_tokens, **options):
    d = SyncDriver(Scheduler(core.catalog, PolicyConfig(), core.scheduler_config()), core)
    prompt = core.tokenizer.encode(core.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]))
    h = d.submit(prompt, max_tokens, **options)
    d.run()
    return d.requests[h].tokens


def test_ignore_eos_min_tokens_and_stop_token_ids(core):
    eos = core.tokenizer.eos_id
    plain = run(core, 40)
    assert plain[-1] == eos and len(plain) < 20  # "The capital of France is Paris.<|im_end|>"
    past = run(core, len(plain) + 6, ignore_eos=True)
    assert len(past) == len(plain) + 6 and past[:len(plain)] == plain  # EOS is output, not an end
    held = run(core, 40, min_tokens=len(plain) + 2)
    assert eos not in held[:len(plain) + 2] and held[:len(plain) - 1] == plain[:-1]
    cut = run(core, 40, stop_token_ids=[plain[2]])
    assert cut == plain[:3]


def test_allowed_token_ids_confine_greedy_and_sampled_outputs(core):
    plain = run(core, 8)
    allowed = sorted({plain[3], plain[5], core.tokenizer.encode(" banana")[0]})
    for options in ({}, {"temperature": 1.5, "seed": 7}):
        out = run(core, 8, allowed_token_ids=allowed, **options)
        assert len(out) == 8 and set(out) <= set(allowed)  # EOS is not allowed, so max_tokens ends it
    with pytest.raises(InvalidRequest, match="allowed_token_ids"):  # the masks could leave nothing
        core.attach(99, [1, 2], allowed_token_ids=[core.tokenizer.eos_id], min_tokens=2)
    assert 99 not in core.requests

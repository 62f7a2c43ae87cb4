"""response_format (helios.server.response_format): OpenAI's on /v1/chat/completions, and on
/v1/completions as vLLM accepts it.

Rules tested:
- text is plain output; json_object and json_schema become the core's grammar option;
- a malformed response_format, an unknown type or a schema that cannot compile gets a 400
  naming the field, as does response_format with ignore_eos or min_tokens, and nothing is
  submitted;
- a server whose core cannot constrain output (the sim engine) refuses json formats with a 400
  rather than answering unconstrained;
- with the real model, the openai SDK's `parse` with a pydantic model gets a parsed object, a
  streamed request with n = 2 gives two documents that match the schema, and so does a batch of
  two completion prompts.
"""

from __future__ import annotations

import json

import openai
import pydantic
import pytest
import torch
from fastapi.testclient import TestClient

from helios.engine.grammar import GRAMMAR_OPTION
from helios.server import EngineOptions, ServerSettings, build_backend, create_app
from helios.server.errors import APIError
from helios.server.response_format import response_grammar
from helios.server.schemas import ChatCompletionRequest, CompletionRequest
from helios.server.translate import prepare_chat, prepare_completion

from .test_choices import client  # noqa: F401 (a fixture: the unpaced sim server of 4 slots)

COLORS = {"type": "object", "properties": {"colors": {"type": "array", "maxItems": 3,
                                                      "items": {"type": "string", "maxLength": 12}}},
          "required": ["colors"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Name three colors."}]


def test_text_is_plain_and_json_formats_become_grammars():
    assert response_grammar(None) is None and response_grammar({"type": "text"}) is None
    assert json.loads(response_grammar({"type": "json_object"}))
    grammar = json.loads(response_grammar({"type": "json_schema", "json_schema": {"name": "c", "schema": COLORS}}))
    assert grammar["grammars"][0]["json_schema"]["properties"] == COLORS["properties"]


@pytest.mark.parametrize("response_format,param", [
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "c", "schema": [1]}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "nonsense"}}},
     "response_format.json_schema.schema"),
])
def test_a_bad_response_format_is_a_400_naming_the_field(response_format, param):
    with pytest.raises(APIError) as err:
        response_grammar(response_format)
    assert err.value.status == 400 and err.value.param == param


def test_the_grammar_reaches_every_choice_and_conflicts_are_refused(loaded_tokenizer):
    fmt = {"type": "json_object"}
    chat = prepare_chat(ChatCompletionRequest(messages=ASK, n=2, response_format=fmt), loaded_tokenizer, 512,
                        loaded_tokenizer.vocab_size)
    text = prepare_completion(CompletionRequest(prompt=["a", "b"], n=2, response_format=fmt), loaded_tokenizer,
                              512, loaded_tokenizer.vocab_size)
    for prepared in (chat, text):
        assert len(prepared.choices) in (2, 4)
        assert all(GRAMMAR_OPTION in c.params.core_options for c in prepared.choices)
    for extra in ({"ignore_eos": True}, {"min_tokens": 2}):
        req = ChatCompletionRequest(messages=ASK, response_format=fmt, **extra)
        with pytest.raises(APIError, match="ignore_eos or min_tokens"):
            prepare_chat(req, loaded_tokenizer, 512, loaded_tokenizer.vocab_size)


def test_a_core_without_grammars_refuses_json_formats(client):  # noqa: F811
    for path, body in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions", {"prompt": "x"})):
        r = client.post(path, json={**body, "max_tokens": 4, "response_format": {"type": "json_object"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def loaded_tokenizer(real):
    return real.app.state.service.backend.tokenizer


@pytest.fixture(scope="module")
def real():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine tests: two threads crawl on a loaded 2-core box
    backend = build_backend(EngineOptions(engine="torch", slots=2, max_context=512, prefill_capacity=64,
                                          warmup=False, scored_prefill=False, checkpoint_memory_mib=0))
    with TestClient(create_app(backend, ServerSettings(max_queue=4))) as c:
        yield c
    torch.set_num_threads(threads)


def test_the_sdk_parses_a_pydantic_model_and_streams_match_the_schema(real):
    oc = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=real, max_retries=0)

    class Person(pydantic.BaseModel):
        name: str
        age: int

    parsed = oc.chat.completions.parse(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Ann is 31. Give her as JSON."}],
        response_format=Person, temperature=0, max_tokens=40).choices[0].message.parsed
    assert parsed == Person(name="Ann", age=31)
    stream = oc.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=ASK, stream=True, n=2, seed=1, temperature=1.0, max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "colors", "schema": COLORS}})
    texts, finish = ["", ""], [None, None]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish[c.index]
    assert finish == ["stop", "stop"], texts
    batch = oc.completions.create(model="SmolLM2-135M-Instruct", prompt=["Colors: ", "My favourite colors are"],
                                  max_tokens=60, temperature=0, extra_body={"response_format": {
                                      "type": "json_schema", "json_schema": {"name": "colors", "schema": COLORS}}})
    assert [c.finish_reason for c in batch.choices] == ["stop", "stop"]
    texts += [c.text for c in batch.choices]
    for text in texts:
        value = json.loads(text)
        assert set(value) == {"colors"} and len(value["colors"]) <= 3
        assert all(isinstance(c, str) and len(c) <= 12 for c in value["colors"])

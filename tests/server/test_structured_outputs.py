"""vLLM's structured outputs (helios.server.structured_outputs): the `structured_outputs` object and the
older `guided_*` fields, on both endpoints.

Rules tested:
- each kind (json, json_object, regex, choice, grammar in Lark or GBNF) compiles to a grammar whose
  language is what it says: checked by feeding real tokenizations to llguidance's matcher;
- guided_json (a schema or its JSON text) with guided_whitespace_pattern, and structured_outputs'
  whitespace_pattern, let the given whitespace separate JSON tokens; the default layout has none;
- disable_additional_properties closes every object schema that does not say otherwise, walking
  subschema positions only;
- a request names at most one constraint; none or several kinds in structured_outputs, an empty
  choice list, a bad regex, grammar or schema, structural_tag, an option that does not apply and
  ignore_eos with a constraint are each a 400 naming the field, and nothing is submitted; random
  regex, grammar and schema text (lone surrogates included) never raises anything but that 400;
- guided_decoding_backend is accepted and changes nothing;
- a core that cannot constrain output refuses with a 400 naming the field that asked;
- the server builds llguidance's tokenizer before serving;
- with the real model and the openai client, guided_choice answers exactly one choice, a regex
  answer matches the regex, a GBNF grammar is followed (streamed too), and guided_json parses.
"""

from __future__ import annotations

import json
import re

import llguidance
import openai
import pytest
from hypothesis import given, settings, strategies as st

from helios.engine.grammar import grammar_tokenizer
from helios.engine.model.tokenizer import Tokenizer
from helios.server.errors import APIError
from helios.server.schemas import ChatCompletionRequest
from helios.server.structured_outputs import _closed, request_grammar

from .test_choices import client  # noqa: F401 (a fixture: the unpaced sim server of 4 slots)
from .test_response_format import real  # noqa: F401 (a fixture: the real model's server)

ASK = [{"role": "user", "content": "Is the sky blue?"}]
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
         "required": ["x", "y"]}
PHONE = r"[0-9]{3}-[0-9]{4}"
GBNF = 'root ::= answer "." \nanswer ::= "yes" | "no"'


@pytest.fixture(scope="module")
def accepts():
    tok = Tokenizer.from_gguf()
    ll = grammar_tokenizer(tok, tok.vocab_size)

    def check(grammar: str, text: str) -> bool:
        m = llguidance.LLMatcher(ll, grammar)
        tokens = tok.encode(text)
        if m.is_error() or m.validate_tokens(tokens) != len(tokens):
            return False
        assert m.consume_tokens(tokens)
        return m.is_accepting()
    return check


def submitted(client) -> float:  # noqa: F811
    line = next(x for x in client.get("/metrics").text.splitlines() if x.startswith("flare_requests_submitted_total "))
    return float(line.split()[1])


def grammar(**fields):
    return request_grammar(ChatCompletionRequest(messages=ASK, **fields))


@pytest.mark.parametrize("fields,param,yes,no", [
    ({"guided_choice": ["yes", "no", 'say "hi"']}, "guided_choice", ["yes", 'say "hi"'], ["maybe", "yes!", ""]),
    ({"structured_outputs": {"choice": ["A", "B"]}}, "structured_outputs", ["A", "B"], ["AB", "C"]),
    ({"guided_regex": PHONE}, "guided_regex", ["555-1234"], ["5551234", "555-12345"]),
    ({"structured_outputs": {"regex": PHONE}}, "structured_outputs", ["123-4567"], ["12-34567"]),
    ({"guided_grammar": GBNF}, "guided_grammar", ["yes.", "no."], ["yes", "maybe."]),
    ({"structured_outputs": {"grammar": 'start: "a"+ "b"'}}, "structured_outputs", ["ab", "aaab"], ["b", "aba"]),
    ({"guided_json": POINT}, "guided_json", ['{"x": 1, "y": 2}'], ['{"x": 1}', '{"x":1,"y":2}']),
    ({"guided_json": json.dumps(POINT), "guided_decoding_backend": "xgrammar"}, "guided_json",
     ['{"x": 1, "y": -3}'], ['{"x": "1", "y": 2}']),
    ({"structured_outputs": {"json": POINT}}, "structured_outputs", ['{"x": 1, "y": 2}'], ["[1, 2]"]),
    ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, "structured_outputs",
     ['{"any": [1, "two"]}'], ["[]", '{"a":\n1}']),
    ({"guided_json": POINT, "guided_whitespace_pattern": r"\n?"}, "guided_json",
     ['{\n"x":1,\n"y":2\n}', '{"x":1,"y":2}'], ['{"x": 1, "y": 2}']),
    ({"structured_outputs": {"json": POINT, "whitespace_pattern": "[ ]*"}}, "structured_outputs",
     ['{ "x" : 1 ,  "y":2}'], ['{"x":\n1,"y":2}']),
])
def test_each_kind_compiles_to_the_language_it_names(accepts, fields, param, yes, no):
    g, asked = grammar(**fields)
    assert asked == param
    assert all(accepts(g, text) for text in yes), yes
    assert not any(accepts(g, text) for text in no), no


def test_disable_additional_properties_closes_object_schemas_only_where_unsaid(accepts):
    schema = {"type": "object", "properties": {
        "properties": {"type": "object", "properties": {"type": {"type": "string"}}},
        "open": {"type": "object", "additionalProperties": True},
        "list": {"type": "array", "items": {"properties": {"n": {"type": "integer"}}}}},
        "$defs": {"d": {"type": "object"}}, "anyOf": [{"type": "object"}]}
    assert _closed(schema) == {"type": "object", "additionalProperties": False, "properties": {
        "properties": {"type": "object", "properties": {"type": {"type": "string"}}, "additionalProperties": False},
        "open": {"type": "object", "additionalProperties": True},
        "list": {"type": "array", "items": {"properties": {"n": {"type": "integer"}}, "additionalProperties": False}}},
        "$defs": {"d": {"type": "object", "additionalProperties": False}},
        "anyOf": [{"type": "object", "additionalProperties": False}]}
    assert schema["properties"]["properties"].get("additionalProperties") is None  # the request is not changed
    closed, _ = grammar(structured_outputs={"json": POINT, "disable_additional_properties": True})
    opened, _ = grammar(structured_outputs={"json": POINT})
    extra = '{"x": 1, "y": 2, "z": 3}'
    assert accepts(opened, extra) and not accepts(closed, extra) and accepts(closed, '{"x": 1, "y": 2}')


@pytest.mark.parametrize("fields,param", [
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": {"json_object": True, "whitespace_pattern": " ", "disable_any_whitespace": True}},
     "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": {"grammar": "root ::= undefined"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"json": "[1]"}}, "structured_outputs.json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "start: missing"}, "guided_grammar"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": {"type": "nonsense"}}, "guided_json"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"guided_regex": "a", "ignore_eos": True}, "guided_regex"),
    ({"structured_outputs": {"choice": ["a"]}, "min_tokens": 1}, "structured_outputs"),
])
def test_a_bad_or_conflicting_constraint_is_a_400_naming_the_field(client, fields, param):  # noqa: F811
    before = submitted(client)
    for path, body in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions", {"prompt": "x"})):
        r = client.post(path, json={**body, "max_tokens": 4, **fields})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert submitted(client) == before


def test_free_text_asks_no_grammar_and_unknown_keys_are_refused(client):  # noqa: F811
    assert grammar() == (None, None) == grammar(response_format={"type": "text"})
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4,
                                                  "structured_outputs": {"regex": "a", "backend": "x"}})
    assert r.status_code == 400 and "backend" in r.text, r.text


def test_a_core_without_grammars_refuses_naming_the_field_that_asked(client):  # noqa: F811
    for fields, param in (({"guided_choice": ["a"]}, "guided_choice"),
                          ({"structured_outputs": {"regex": "a"}}, "structured_outputs")):
        r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **fields})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "torch engine" in r.json()["error"]["message"]


def test_the_server_prepares_grammars_before_its_first_constrained_request(real):  # noqa: F811
    # llguidance's tokenizer (0.3 s) is built at startup, not on the engine thread in line with frames.
    assert real.app.state.service.backend.core._lltokenizer is not None


def test_the_real_model_follows_each_constraint(real):  # noqa: F811
    oc = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=real, max_retries=0)
    model = "SmolLM2-135M-Instruct"
    choices = ["sunny", "rainy", "snowy"]
    answer = oc.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the weather like?"}], n=3, seed=3,
        temperature=1.0, max_tokens=8, extra_body={"guided_choice": choices})
    assert all(c.message.content in choices and c.finish_reason == "stop" for c in answer.choices)
    phone = oc.completions.create(model=model, prompt="Call me at ", max_tokens=12, temperature=0,
                                  extra_body={"structured_outputs": {"regex": PHONE}})
    assert re.fullmatch(PHONE, phone.choices[0].text) and phone.choices[0].finish_reason == "stop"
    stream = oc.chat.completions.create(model=model, messages=ASK, stream=True, max_tokens=8, temperature=0.7, seed=1,
                                        extra_body={"structured_outputs": {"grammar": GBNF}})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text in ("yes.", "no.")
    point = oc.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Give a point as JSON."}], max_tokens=30, temperature=0,
        extra_body={"guided_json": POINT, "guided_decoding_backend": "auto"})
    assert set(json.loads(point.choices[0].message.content)) == {"x", "y"}


SYNTAX = st.text(st.sampled_from(list('ab()[]{}|*+?.\\^$:="\' \n-09rotsa:=/%#\ud800')), max_size=30)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["guided_regex", "guided_grammar", "guided_json"]), text=SYNTAX,
       choices=st.lists(st.text(max_size=5), max_size=3))
def test_no_malformed_constraint_raises_anything_but_a_400(field, text, choices):
    for fields in ({field: text}, {"guided_choice": choices}):
        try:
            request_grammar(ChatCompletionRequest(messages=ASK, **fields))
        except APIError as exc:
            assert exc.status == 400 and exc.param == next(iter(fields))

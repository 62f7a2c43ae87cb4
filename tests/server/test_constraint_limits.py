"""Output constraints are compiled, budgeted and probed before admission (issue 42).

Rules tested:
- each case that used to compile and then fail at its first token with a 500 (2,100 choices, a
  `$ref` to itself, `anyOf` with 5,000 branches), or stall every stream while its matcher was
  built (70,000 choices), or raise RecursionError (a schema sent as JSON text nested 500 and
  5,000 deep), is a 400 naming its field, with a short body that quotes neither the grammar nor
  llguidance's parser state; and well-formed requests running at the same time all succeed;
- property, on the real model with a well-formed client running throughout (all its requests
  succeed): for choice lists and schema depths up to the budgets and past them, the constraint
  is served exactly when it is within the budgets, and otherwise refused with a 400 naming the
  field, never anything else;
- an admitted constraint reaches the core compiled (the engine's thread does not compile it);
- a constraint the probe refuses is named by its deepest failing path: the field that holds it and,
  for a JSON schema, the deepest subschema that fails alone (`...schema.properties.x`).
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import types

import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.engine.grammar import GRAMMAR_OPTION, CompiledGrammar, grammar_tokenizer
from helios.engine.model.tokenizer import Tokenizer
from helios.server.app import ServerSettings, create_app
from helios.server.backend import EngineOptions, build_backend
from helios.server.constraint_limits import LIMITS, compile_for_core
from helios.server.constraint_paths import deepest_failing
from helios.server.errors import APIError
from helios.server.schemas import ChatCompletionRequest
from helios.server.structured_outputs import constraint_source, grammar_param
from helios.server.translate import prepare_chat

from .support import InProcessServer

ASK = [{"role": "user", "content": "Pick one."}]


def _nested(depth: int) -> str:
    # {"type": "object", "properties": {"a": {...}}} nested `depth` deep, as JSON text
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "integer"}' + "}}" * depth


HOSTILE = {
    "choice 2,100": ({"structured_outputs": {"choice": [f"label{i}" for i in range(2100)]}},
                     "structured_outputs.choice"),
    "choice 70,000": ({"guided_choice": [f"label{i}" for i in range(70_000)]}, "guided_choice"),
    "recursive $ref": ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}}}, "response_format.json_schema.schema.$defs.a"),
    "anyOf 5,000": ({"structured_outputs": {"json": {"anyOf": [{"const": f"v{i}"} for i in range(5000)]}}},
                    "structured_outputs.json"),
    "schema text 500 deep": ({"guided_json": _nested(500)}, "guided_json"),
    "schema text 5,000 deep": ({"guided_json": _nested(5000)}, "guided_json"),
}


@pytest.fixture(scope="module")
def real():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    backend = build_backend(EngineOptions(engine="torch", slots=4, max_context=256, prefill_capacity=64,
                                          warmup=False, scored_prefill=False, checkpoint_memory_mib=0))
    server = InProcessServer(create_app(backend, ServerSettings(max_queue=8)))
    yield server
    server.stop()
    torch.set_num_threads(threads)


def _canary(url: str) -> int:
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=300).status_code


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_constraint_is_a_400_naming_its_field_and_others_succeed(real, case):
    fields, param = HOSTILE[case]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        canaries = [pool.submit(_canary, real.url) for _ in range(2)]
        r = httpx.post(real.url + "/v1/chat/completions", timeout=300,
                       json={"messages": ASK, "max_tokens": 4, **fields})
        statuses = [c.result() for c in canaries]
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_value"
    assert len(r.content) < 1024 and "<state>" not in r.text and "label1" not in r.text and "v17" not in r.text
    assert statuses == [200, 200]


@pytest.fixture(scope="module")
def canary(real):
    """A well-formed client in a loop for the whole property; its statuses must all be 200."""
    statuses, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            statuses.append(_canary(real.url))
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield statuses
    stop.set()
    thread.join(300)
    assert statuses and set(statuses) == {200}, statuses


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(1, LIMITS.max_choices + 100), depth=st.integers(1, LIMITS.max_depth + 8),
       which=st.sampled_from(["choice", "json"]))
def test_constraints_up_to_the_budgets_are_admitted_and_past_them_refused_by_field(real, canary, count, depth,
                                                                                    which):
    """On the real model, with a well-formed client running throughout (`canary`)."""
    if which == "choice":
        fields, param, within = {"guided_choice": [f"c{i}" for i in range(count)]}, "guided_choice", \
            count <= LIMITS.max_choices
    else:
        # depth levels of {"type","properties":{"a": ...}}: two JSON levels each, plus the leaf
        levels = max(1, depth // 2)
        fields, param, within = {"guided_json": json.loads(_nested(levels))}, "guided_json", \
            2 * levels + 1 <= LIMITS.max_depth
    r = httpx.post(real.url + "/v1/chat/completions", timeout=300,
                   json={"messages": ASK, "max_tokens": 3, "temperature": 0, **fields})
    if within:
        assert r.status_code == 200, r.text[:300]
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == param and len(r.content) < 1024


def test_an_admitted_constraint_reaches_the_core_compiled():
    tok = Tokenizer.from_gguf()
    core = types.SimpleNamespace(prepare_grammars=lambda ll=grammar_tokenizer(tok, tok.vocab_size): ll)
    req = ChatCompletionRequest.model_validate_json(json.dumps({"messages": ASK, "guided_choice": ["a", "b"]}))
    prepared = compile_for_core(prepare_chat(req, tok, 512, tok.vocab_size), core, grammar_param(req))
    assert isinstance(prepared.choices[0].params.core_options[GRAMMAR_OPTION], CompiledGrammar)


def _refused_param(fields: dict) -> str:
    tok = Tokenizer.from_gguf()
    core = types.SimpleNamespace(prepare_grammars=lambda ll=grammar_tokenizer(tok, tok.vocab_size): ll)
    req = ChatCompletionRequest.model_validate_json(json.dumps({"messages": ASK, **fields}))
    with pytest.raises(APIError) as refused:
        compile_for_core(prepare_chat(req, tok, 512, tok.vocab_size), core, grammar_param(req), LIMITS,
                         constraint_source(req))
    assert refused.value.status == 400 and str(refused.value).startswith(refused.value.param + ": ")
    return refused.value.param


LOOP = {"a": {"$ref": "#/$defs/a"}}  # compiles, then no token can follow: the probe refuses it


@pytest.mark.parametrize("fields, path", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"], "$defs": LOOP}}}},
     "response_format.json_schema.schema.properties.x"),
    ({"guided_json": {"type": "object", "required": ["outer"], "definitions": {"a": {"$ref": "#/definitions/a"}},
                      "properties": {"outer": {"type": "object", "properties": {"x": {"$ref": "#/definitions/a"}},
                                               "required": ["x"]}}}},
     "guided_json.properties.outer.properties.x"),
    ({"structured_outputs": {"json": json.dumps({"anyOf": [{"$ref": "#/$defs/a"}], "$defs": LOOP})}},
     "structured_outputs.json.anyOf[0]"),
])
def test_a_probe_refusal_names_the_deepest_failing_subschema(fields, path):
    assert _refused_param(fields) == path


def test_the_failing_path_walk_is_depth_first_definitions_last_and_bounded():
    schema = {"$defs": {"d": {"bad": 3}}, "properties": {"a": {"type": "integer"}, "b": {
        "items": [{"ok": 1}, {"bad": {"x": 1}}]}}, "anyOf": [{"bad": 2}]}
    def bad(sub):  # a subschema fails when it holds "bad" (outside the definitions it is given)
        assert sub.get("$defs") == schema_defs[0]
        return "bad" in json.dumps({k: v for k, v in sub.items() if k != "$defs"})
    schema_defs = [schema["$defs"]]
    assert deepest_failing(schema, "f", bad) == "f.properties.b.items[1]"
    assert deepest_failing(schema, "f", bad, attempts=2) == "f.properties.b"  # a then b; then out of attempts
    assert deepest_failing(schema, "f", lambda sub: False) == "f"
    assert deepest_failing({"$defs": {"d": {"bad": 3}}, "$ref": "#/$defs/d"}, "f", bad) == "f.$defs.d"
    schema_defs[0] = None
    assert deepest_failing({"items": {"bad": 1}}, "f", bad) == "f.items"  # no definitions to carry

"""Structured output in TorchCore (helios.engine.grammar): a request's grammar masks what it emits.

Rules tested:
- the mask sets -inf on exactly the tokens llguidance's own bitmask forbids (every vocabulary id);
- greedy and seeded sampled outputs, with and without adaptive speculation, parse as JSON that
  matches the schema, and end with EOS once the grammar is complete;
- a constrained request is offered no drafts, so speculation stays lossless for it;
- the output's log-probabilities stay the raw distribution's (the mask changes the logits after);
- bad grammars and grammars with ignore_eos or min_tokens are refused at attach, and refusing
  leaves the core as it was.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import llguidance
import llguidance.torch
import pytest
import torch

from helios.config import PolicyConfig
from helios.engine.core import LOGPROBS_OPTION
from helios.engine.grammar import Constraint, grammar_tokenizer, json_schema_grammar
from helios.engine.torch_core import TorchCore
from helios.engine.torch_state import LaneWork
from helios.errors import InvalidRequest
from helios.graphs import GraphKind, GraphShape
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler
from helios.scheduler.plan import FinishReason

sys.path.insert(0, str(Path(__file__).parent))
from torch_helpers import chat, lane, loaded, plan  # noqa: E402,F401 (loaded is a fixture)

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = "Describe a person called Ann aged 31 as JSON."


def run(core, requests):
    d = SyncDriver(Scheduler(core.catalog, PolicyConfig(), core.scheduler_config()), core)
    handles = [d.submit(chat(core.tokenizer, text), max_tokens, **options) for text, max_tokens, options in requests]
    d.run()
    return [d.requests[h] for h in handles], d


def test_the_mask_forbids_exactly_what_the_grammar_bitmask_forbids(loaded):
    ll = grammar_tokenizer(loaded.tokenizer, loaded.config.vocab_size)
    grammar = json_schema_grammar(PERSON)
    ours, reference = Constraint(ll, grammar), llguidance.LLMatcher(ll, grammar)
    prefix = loaded.tokenizer.encode('{"name": "Ann", "a')
    ours.consume(prefix)
    assert reference.consume_tokens(prefix)
    logits = torch.randn(loaded.config.vocab_size)
    expected = logits.clone()[None]
    bits = llguidance.torch.allocate_token_bitmask(1, ll.vocab_size)
    llguidance.torch.fill_next_token_bitmask(reference, bits, 0)
    llguidance.torch.apply_token_bitmask_inplace(expected, bits)
    ours.mask(logits)
    assert torch.equal(torch.isinf(logits), torch.isinf(expected[0]))
    assert 0 < int(torch.isfinite(logits).sum()) < 100  # "age" continues the key; little else does


@pytest.mark.parametrize("speculation", ["off", "adaptive"])
def test_constrained_outputs_parse_and_match_the_schema(loaded, speculation):
    core = TorchCore(loaded=loaded, request_slots=4, max_batch=4, max_context=512, speculation=speculation)
    grammar = json_schema_grammar(PERSON)
    (greedy, sampled, anything, plain), _ = run(core, [
        (ASK, 60, {"grammar": grammar}),
        (ASK, 60, {"grammar": grammar, "temperature": 1.0, "seed": 5}),
        (ASK, 200, {"grammar": json_schema_grammar(None), "temperature": 0.7, "seed": 9}),
        (ASK, 12, {}),
    ])
    tok = core.tokenizer
    for r in (greedy, sampled):
        assert r.finish is FinishReason.EOS and r.tokens[-1] == tok.eos_id
        value = json.loads(tok.decode(r.tokens, skip_special_tokens=True))
        assert set(value) == {"name", "age"} and isinstance(value["name"], str) and isinstance(value["age"], int)
    assert json.loads(tok.decode(greedy.tokens, skip_special_tokens=True)) == {"name": "Ann", "age": 31}
    if anything.finish is FinishReason.EOS:
        assert isinstance(json.loads(tok.decode(anything.tokens, skip_special_tokens=True)), dict)
    assert not tok.decode(plain.tokens).startswith("{")  # the unconstrained neighbour is untouched
    assert not core.requests and sorted(core._free_slots) == list(range(core.request_slots))


def test_a_constrained_request_is_offered_no_drafts(loaded):
    core = TorchCore(loaded=loaded, request_slots=2, max_batch=2, max_context=512, speculation="adaptive")
    prompt = chat(core.tokenizer, "abc abc abc abc abc")
    core.attach(1, prompt, grammar=json_schema_grammar(None))
    core.attach(2, prompt)
    for handle in (1, 2):
        core.requests[handle].generated.append(prompt[-3])  # a pending token that recurs in the context
    works = [LaneWork(lane(h, h - 1, rows=4), core.requests[h], h - 1, True) for h in (1, 2)]
    assert works[0].drafts() == [] and len(works[1].drafts()) == 3


def test_logprobs_of_a_constrained_request_are_the_raw_distributions(loaded):
    # The same prompt twice in one prefill, one of them constrained: the grammar forces "{" where
    # the model would start otherwise, yet both report the same raw alternatives.
    core = TorchCore(loaded=loaded, request_slots=2, max_batch=2, max_context=512)
    prompt = chat(core.tokenizer, ASK)
    core.attach(0, prompt, **{LOGPROBS_OPTION: 3})
    core.attach(1, prompt, **{LOGPROBS_OPTION: 3, "grammar": json_schema_grammar(PERSON)})
    shape = GraphShape(GraphKind.PREFILL, 2, 64)
    execution = core.execute(plan(shape, [lane(h, h, 0, len(prompt)) for h in (0, 1)]), 1)
    free, forced = (execution.logprobs[h][0] for h in (0, 1))
    tokens = {r.handle: r.tokens[0] for r in execution.records}
    assert tokens[0] != tokens[1] and core.tokenizer.decode([tokens[1]]).startswith("{")
    assert forced.top == free.top and math.isclose(free.logprob, free.top[0][1])
    assert forced.logprob < free.logprob


@pytest.mark.parametrize("options,match", [
    ({"grammar": "not a grammar"}, "serialized grammar"),
    ({"grammar": 7}, "serialized grammar string"),
    ({"grammar": json_schema_grammar(None), "ignore_eos": True}, "ignore_eos or min_tokens"),
    ({"grammar": json_schema_grammar(None), "min_tokens": 3}, "ignore_eos or min_tokens"),
])
def test_bad_grammars_are_refused_at_attach_and_change_nothing(loaded, options, match):
    core = TorchCore(loaded=loaded, request_slots=2, max_batch=2, max_context=512)
    with pytest.raises(InvalidRequest, match=match):
        core.attach(1, chat(core.tokenizer, ASK), **options)
    assert not core.requests and sorted(core._free_slots) == [0, 1]


def test_a_schema_that_cannot_compile_is_named():
    with pytest.raises(InvalidRequest, match="invalid JSON schema"):
        json_schema_grammar({"type": "nonsense"})

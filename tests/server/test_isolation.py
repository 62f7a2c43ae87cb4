"""One request's constraint never fails another's (issue 42), on the real model.

Rules tested:
- a row whose grammar matcher fails at run time ends alone with an error; the requests that
  shared its prefill graph complete, and the frame is not a fault (the co-batching case: on the
  old engine the matcher's refusal raised and failed the whole frame);
- the error names the constraint's failure in one short line, never the grammar.
"""

from __future__ import annotations

import pytest

from helios.engine.grammar import GRAMMAR_OPTION, text_grammar
from helios.runtime.runtime import Runtime
from helios.runtime.stream import ERROR, SamplingParams
from helios.server.backend import EngineOptions, build_backend

# 2,100 labels pass llguidance's compiler but exceed its 2,000 Earley items per row at the first
# committed token (the server refuses them before admission: tests/server/test_admission_limits.py).
POISON = text_grammar("choice", [f"label{i}" for i in range(2100)])


class Refusing:
    """A matcher that reaches a parser limit at its `after`-th token, as a grammar whose limit
    comes mid-output does; everything else is llguidance's."""

    def __init__(self, matcher, after: int):
        self.matcher, self.after, self.failed = matcher, after, False

    def consume_token(self, token):
        self.after -= 1
        self.failed = self.failed or self.after < 0
        return not self.failed and self.matcher.consume_token(token)

    def is_error(self):
        return self.failed or self.matcher.is_error()

    def get_error(self):
        return "Parser Error: Current row has 2101 items; max is 2000\n<state>" if self.failed else \
            self.matcher.get_error()

    def __getattr__(self, name):
        return getattr(self.matcher, name)


@pytest.fixture(scope="module")
def backend():
    return build_backend(EngineOptions(engine="torch", slots=4, max_context=256,
                                       prefill_capacity=64, warmup=False, checkpoint_memory_mib=0))


def test_a_poisoned_row_fails_alone_and_its_co_batched_rows_complete(backend):
    core, frames, poisoned_handle = backend.core, [], []
    execute = core.execute

    def recorded(plan, fence):
        frames.append(set(plan.handles))
        poisoned = core.requests.get(poisoned_handle[0]) if poisoned_handle else None
        if poisoned is not None and not isinstance(poisoned.constraint.matcher, Refusing):
            poisoned.constraint.matcher = Refusing(poisoned.constraint.matcher, after=3)  # fails in a decode frame
        return execute(plan, fence)

    core.execute = recorded
    runtime = Runtime(backend.scheduler, core, tokenizer=backend.tokenizer)
    runtime.start()
    try:
        tok = backend.tokenizer
        with runtime._cv:  # the runtime thread plans nothing until all four wait: one prefill graph
            good = [runtime.submit(tok.encode(f"Count to {i}:"), SamplingParams(max_tokens=6, temperature=0.0))
                    for i in range(3)]
            bad = runtime.submit(tok.encode("Say hello:"), SamplingParams(
                max_tokens=6, temperature=0.0, core_options={GRAMMAR_OPTION: text_grammar("regex", "[a-z ]+")}))
            poisoned_handle.append(bad.handle)
        assert all(s.wait(120) for s in good + [bad]), "a request did not end"
    finally:
        core.execute = execute
        runtime.stop(timeout=60)
    assert any(bad.handle in f and len(f) > 1 for f in frames), f"the poisoned row ran alone: {frames}"
    assert [s.finish_reason for s in good] == ["length"] * 3, [s.error for s in good]
    assert bad.finish_reason == ERROR
    assert "constraint" in bad.error and "<state>" not in bad.error and len(bad.error) < 400
    assert runtime.stats.faults == 0


def test_a_matcher_past_its_parser_limit_fails_its_row_without_raising(backend):
    from helios.engine.grammar import Constraint
    import torch

    c = Constraint(backend.core.prepare_grammars(), POISON)
    c.mask(torch.zeros(backend.vocab_size))
    c.consume([backend.tokenizer.encode("label")[0]])  # the first committed token reaches the limit
    assert c.error is not None and "2000" in c.error and "\n" not in c.error
    logits = torch.zeros(backend.vocab_size)
    c.mask(logits)  # a failed constraint masks nothing more: its row is discarded
    assert bool((logits == 0).all())

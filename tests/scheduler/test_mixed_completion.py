"""Completion by phase for mixed graphs (spec: "Mixed execution contract": completion validates
and updates each row by its phase; malformed completions change nothing)."""

import pytest

from helios.config import SchedulerConfig, SpeculationMode
from helios.errors import InvalidCompletion, InvalidRequest
from helios.graphs import Catalog
from helios.scheduler import CompletionRecord, ExecutionTiming, Scheduler
from helios.scheduler.plan import Lane, ScheduledPlan, SelectionReason

from conftest import MS, decode, digest
from mixed_helpers import decoders_and_prompts, mixed

# No prefill graph: every prompt goes through a mixed graph.
TABLE = {decode(2): 5.2, decode(4): 5.5, mixed(4, 64): 6.2, mixed(4, 256): 13.2}


def committed(prompt_left, table=TABLE, config=None, decoders=2):
    s = Scheduler(Catalog(table), config=config or SchedulerConfig())
    s.seed_costs({shape: [int(ms * MS)] for shape, ms in table.items()}, 0)
    s.advance_to(1000 * MS)
    dec, (p,) = decoders_and_prompts(s, decoders, [prompt_left])
    plan = s.plan()
    assert plan.shape.kind.value == "mixed" and plan.prefill_row == 0
    s.commit(plan, 1)
    s.advance_to(s.now_ns + 7 * MS)
    return s, plan, dec, p


def good(plan):
    return [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (11,) * l.output_rows) for l in plan.lanes]


def test_a_finishing_prompt_row_commits_its_extent_and_publishes_one_first_token():
    s, plan, dec, p = committed(40)
    out = s.complete(1, good(plan), ExecutionTiming((7 * MS,)))
    got = {g.handle: g for g in out}
    assert got[p].tokens == (11,) and got[p].first
    assert all(got[h].tokens == (11,) for h in dec)
    row = s.request_row(p)
    assert row.prompt_done == 40 and row.output_done == 1 and row.phase.name == "DECODE"


def test_a_partial_prompt_row_commits_its_extent_and_publishes_nothing():
    s, plan, dec, p = committed(1000)
    assert plan.lanes[0].prompt_tokens == 256 and plan.lanes[0].output_rows == 0
    out = s.complete(1, good(plan), ExecutionTiming((7 * MS,)))
    assert p not in {g.handle for g in out}
    row = s.request_row(p)
    assert row.prompt_done == 256 and row.output_done == 0 and row.queued_prompt == 0
    assert all(s.request_row(h).output_done == 1 for h in dec)


def _malformed(kind, plan):
    recs = good(plan)
    prompt, decoder = plan.lanes[0], plan.lanes[1]
    if kind == "two_prompt_rows":  # a decode row claims prompt work
        recs[1] = CompletionRecord(decoder.handle, decoder.epoch, 64, (11,))
    elif kind == "short_prompt_extent":
        recs[0] = CompletionRecord(prompt.handle, prompt.epoch, prompt.prompt_tokens - 1, ())
    elif kind == "long_prompt_extent":
        recs[0] = CompletionRecord(prompt.handle, prompt.epoch, prompt.prompt_tokens + 64, ())
    elif kind == "token_on_partial_prompt_row":
        recs[0] = CompletionRecord(prompt.handle, prompt.epoch, prompt.prompt_tokens, (11,))
    elif kind == "offered_on_prompt_row":
        recs[0] = CompletionRecord(prompt.handle, prompt.epoch, prompt.prompt_tokens, (), offered=0)
    elif kind == "two_tokens_on_decode_row":
        recs[1] = CompletionRecord(decoder.handle, decoder.epoch, 0, (11, 12))
    elif kind == "missing_decode_token":
        recs[1] = CompletionRecord(decoder.handle, decoder.epoch, 0, ())
    elif kind == "rows_swapped":
        recs[0], recs[1] = recs[1], recs[0]
    elif kind == "missing_row":
        recs = recs[:-1]
    elif kind == "wrong_epoch":
        recs[1] = CompletionRecord(decoder.handle, decoder.epoch + 1, 0, (11,))
    return recs


@pytest.mark.parametrize("kind", ["two_prompt_rows", "short_prompt_extent", "long_prompt_extent",
                                  "token_on_partial_prompt_row", "offered_on_prompt_row",
                                  "two_tokens_on_decode_row", "missing_decode_token", "rows_swapped",
                                  "missing_row", "wrong_epoch"])
def test_malformed_mixed_completion_is_rejected_with_state_unchanged(kind):
    s, plan, dec, p = committed(1000)
    before = digest(s)
    with pytest.raises(InvalidCompletion):
        s.complete(1, _malformed(kind, plan), ExecutionTiming((7 * MS,)))
    assert digest(s) == before
    s.complete(1, good(plan), ExecutionTiming((7 * MS,)))  # the well-formed one still applies


def test_a_finishing_prompt_row_must_publish_its_first_token():
    s, plan, dec, p = committed(40)
    recs = good(plan)
    recs[0] = CompletionRecord(p, plan.lanes[0].epoch, 40, ())
    before = digest(s)
    with pytest.raises(InvalidCompletion):
        s.complete(1, recs, ExecutionTiming((7 * MS,)))
    assert digest(s) == before


WIDE = {mixed(2, 256, 3): 13.3}


def test_wider_decode_rows_commit_their_accepted_prefix_and_reject_more():
    config = SchedulerConfig(speculation=SpeculationMode.FIXED, draft_capacity=2)
    s, plan, dec, p = committed(1000, WIDE, config, decoders=1)
    row = plan.lanes[1]
    assert row.output_rows == 3
    recs = good(plan)
    before = digest(s)
    for bad in ((11,) * 4, ()):  # more than the offered prefix + 1, or nothing from a live row
        recs[1] = CompletionRecord(row.handle, row.epoch, 0, bad)
        with pytest.raises(InvalidCompletion):
            s.complete(1, recs, ExecutionTiming((7 * MS,)))
        assert digest(s) == before
    recs[1] = CompletionRecord(row.handle, row.epoch, 0, (11,), offered=2)  # both drafts rejected
    s.complete(1, recs, ExecutionTiming((7 * MS,)))
    assert s.request_row(row.handle).output_done == 1 and s.request_row(p).prompt_done == 256


def _plan(shape, lanes):
    return ScheduledPlan(shape, lanes, 1, 0.0, 0.0, SelectionReason.ORDINARY, True, False, 0, 0, ())


@pytest.mark.parametrize("lanes", [
    [Lane(1, 0, 0, None, 0, 64, 0, 0, 64.0, 0.0, 1.0), Lane(2, 0, 0, None, 0, 64, 0, 0, 64.0, 0.0, 1.0)],
    [Lane(1, 0, 0, None, 0, 128, 0, 0, 128.0, 0.0, 1.0)],  # above C
    [Lane(1, 0, 0, 0, 0, 0, 70, 2, 2.0, 1.0, 1.0)],  # a decode row wider than W
    [Lane(h, 0, 0, h, 0, 0, 70, 1, 1.0, 1.0, 1.0) for h in range(3)],  # more rows than B
])
def test_a_plan_with_illegal_mixed_roles_is_rejected(lanes):
    with pytest.raises(InvalidRequest):
        _plan(mixed(2, 64), lanes)

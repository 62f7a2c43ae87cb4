"""Mixed selection rules (spec: "Mixed execution contract", "Useful service and selection")."""

import numpy as np
import pytest

from helios.baselines import SCHEDULERS, make_scheduler
from helios.config import SchedulerConfig, SpeculationMode
from helios.errors import InvalidRequest
from helios.graphs import Catalog, GraphKind
from helios.scheduler import CompletionRecord, ExecutionTiming, Scheduler
from helios.scheduler.mixed import mixed_candidates
from helios.scheduler.policy import Budget
from helios.scheduler.selection import cost_lookup, current_view

from conftest import MS, Driver, FixedCosts, decode, make, prefill, spec
from conftest import configs
from mixed_helpers import decoders_and_prompts, mixed

MIXED = GraphKind.MIXED
# Mixed graphs a little dearer than the prefill they contain: decoders ride along cheaply.
TABLE = {decode(1): 5.0, decode(2): 5.2, decode(4): 5.5, prefill(64): 6.0, prefill(256): 13.0,
         mixed(2, 64): 6.1, mixed(2, 256): 13.1, mixed(4, 64): 6.2, mixed(4, 256): 13.2}


def candidates(s):
    view = current_view(s.selection, s.now_ns)
    prompts = view.prefill.get(GraphKind.PREFILL)
    return mixed_candidates(s.memo, s.shapes.mixed, cost_lookup(s.costs, s.now_ns), view.decode,
                            None if prompts is None else prompts[0], view.waiting, Budget(64, 1 << 20))


def at(ms=1000):
    s = make(TABLE)
    s.advance_to(ms * MS)
    return s


def test_a_fitting_prompt_tail_earns_only_its_tokens_and_larger_capacities_are_padding():
    s = at()
    dec, (p,) = decoders_and_prompts(s, 3, [40])
    plan = s.plan()
    assert plan.shape == mixed(4, 64) and plan.prefill_row == 0
    assert plan.lanes[0].handle == p and plan.lanes[0].prompt_tokens == 40 and plan.lanes[0].output_rows == 1
    assert sorted(plan.handles[1:]) == dec and all(l.prompt_tokens == 0 for l in list(plan.lanes)[1:])
    # Same prompt row, same logical work (the 40-token tail), same decoders: C=256 is padding.
    with_prompt = [c for c in candidates(s) if c.prompt is not None]
    assert {c.shape for c in with_prompt} == {mixed(2, 64), mixed(4, 64)}


def test_dominance_requires_the_same_prompt_work():
    s = at()
    decoders_and_prompts(s, 1, [200])
    works = {(c.shape, c.prompt_work) for c in candidates(s) if c.prompt is not None}
    # 64 and 200 prompt tokens are different logical work: both capacities compete.
    assert works == {(mixed(2, 64), 64), (mixed(2, 256), 200)}
    # One decoder: B=4 serves the same cohorts as B=2 and is pruned in both forms.
    assert all(c.shape.batch_capacity == 2 for c in candidates(s))


def test_each_shape_compares_decode_only_with_prompt_row_plus_best_decoders():
    s = at()
    dec, (p,) = decoders_and_prompts(s, 5, [500])
    by_shape = {}
    for c in candidates(s):
        by_shape.setdefault(c.shape, []).append(c)
    four = by_shape[mixed(4, 64)]
    assert sorted(c.prompt is None for c in four) == [False, True]
    only, with_prompt = sorted(four, key=lambda c: c.prompt is not None)
    assert len(only.members) == 4 and len(with_prompt.members) == 3
    # The prompt row's decoders are the top three of the decode-only cohort's four.
    assert set(with_prompt.members.tolist()) <= set(only.members.tolist())


def test_a_prompt_only_population_and_a_mixed_only_catalog():
    table = {mixed(2, 64): 9.0, mixed(2, 256): 13.4}
    s = make(table)
    d = Driver(s, FixedCosts(table))
    h = s.admit(spec(prompt=300, out=4), 0)
    first = s.plan()
    assert first.shape.kind is MIXED and first.handles == (h,) and first.prefill_row == 0
    plans = d.run(20)
    assert not s.is_live(h)  # prompt-only graphs, then decode-only graphs finished it
    assert {p.prefill_row for p in plans} == {0, None}


def test_mixed_only_catalog_with_no_request_plans_nothing():
    s = make({mixed(2, 64): 9.0})
    assert s.plan() is None


def test_mixed_plan_requires_feedback_and_waits_for_an_empty_window():
    s = at()
    dec, _ = decoders_and_prompts(s, 2)
    first = s.plan()
    assert first.shape.kind is GraphKind.DECODE and not first.requires_feedback
    s.commit(first, 1)
    s.admit(spec(prompt=200, out=8), s.now_ns)
    # The winner is mixed: it needs an empty window, so nothing is submitted behind the decode.
    assert s.plan() is None
    s.advance_to(s.now_ns + 9 * MS)
    s.complete(1, [CompletionRecord(l.handle, l.epoch, 0, (3,)) for l in first.lanes],
               ExecutionTiming((9 * MS,)))
    mixed_plan = s.plan()
    assert mixed_plan.shape.kind is MIXED and mixed_plan.requires_feedback
    s.commit(mixed_plan, 2)
    assert s.plan() is None  # and nothing is queued behind it before its completion


def test_mixed_shapes_join_the_sigma_reference():
    table = {decode(4): 40.0, prefill(64): 6.0, mixed(4, 64): 12.0}
    s = make(table)
    assert (4, 12.0) in s._decode_reference().costs and (4, 40.0) in s._decode_reference().costs


def test_wider_mixed_graphs_need_speculation_and_state_rows_cover_their_width():
    table = {decode(2): 8.0, prefill(64): 6.0, mixed(2, 64): 9.0, mixed(2, 64, 4): 10.0}
    assert make(table).shapes.mixed == (mixed(2, 64),)
    spec_on = SchedulerConfig(speculation=SpeculationMode.FIXED, draft_capacity=3)
    assert mixed(2, 64, 4) in Scheduler(Catalog(table), config=spec_on).shapes.mixed
    with pytest.raises(InvalidRequest):
        Scheduler(Catalog(table), config=SchedulerConfig(speculation=SpeculationMode.FIXED, draft_capacity=2))


@pytest.mark.parametrize("name", sorted(set(SCHEDULERS) - {"helios"}))
def test_the_mixed_catalog_is_never_imposed_on_a_baseline(name):
    s = make_scheduler(name, Catalog(TABLE))
    assert s.shapes.mixed == () and all(sh.kind is not MIXED for sh in s.shapes.delivery)
    s.seed_costs({shape: [int(ms * MS)] for shape, ms in TABLE.items()}, 0)
    d = Driver(s, FixedCosts(TABLE))
    for i in range(3):
        s.admit(spec(prompt=100 + 50 * i, out=6), s.now_ns)
    plans = d.run(40)
    assert plans and all(p.shape.kind is not MIXED for p in plans)
    assert not any(s.is_live(h) for h in range(3))


def test_speculative_decode_rows_keep_their_complete_prefix():
    table = {prefill(64): 6.0, mixed(2, 256, 3): 12.0, mixed(2, 256): 11.9}
    from helios.prepare import speculative_shapes
    for sh in speculative_shapes(2, (1, 3), 6):
        table[sh] = 30.0
    config = SchedulerConfig(speculation=SpeculationMode.FIXED, draft_capacity=2)
    s = Scheduler(Catalog(table), config=config)
    s.seed_costs({shape: [int(ms * MS)] for shape, ms in table.items()}, 0)
    s.seed_acceptance([0.95, 0.9])
    s.advance_to(1000 * MS)
    dec, (p,) = decoders_and_prompts(s, 1, [1000], out=100)
    plan = s.plan()
    assert plan.shape == mixed(2, 256, 3) and plan.prefill_row == 0
    prompt, row = plan.lanes[0], plan.lanes[1]
    assert prompt.prompt_tokens == 256 and prompt.output_rows == 0
    assert row.handle == dec[0] and row.prompt_tokens == 0 and row.output_rows == 3
    assert 1 < row.expected_tokens <= 3
    s.commit(plan, 1)
    s.advance_to(s.now_ns + 12 * MS)
    out = s.complete(1, [CompletionRecord(p, prompt.epoch, 256, ()),
                         CompletionRecord(dec[0], row.epoch, 0, (4, 5), offered=2)], ExecutionTiming((12 * MS,)))
    assert [(g.handle, g.tokens) for g in out] == [(dec[0], (4, 5))]
    assert s.request_row(p).prompt_done == 256 and s.request_row(dec[0]).output_done == 2
    assert s.stats.speculative_offered == 2 and s.stats.speculative_accepted == 1


# Larger chunks are more efficient per token (a fixed per-graph overhead), as on real GPUs.
BOUND_TABLE = {decode(1): 10.0, decode(2): 11.0, decode(4): 12.0, prefill(64): 10.0, prefill(256): 25.0,
               prefill(1024): 80.0, mixed(4, 64): 12.5, mixed(4, 256): 27.0, mixed(4, 1024): 82.0}


def _long_prompt_among_mixed_decoders(policy):
    """Three decoders stream; a 4000-token prompt arrives. Returns whether its first token came, the
    durations of the graphs that carried its chunks, and the longest gap any decoder saw (ms)."""
    s = make(BOUND_TABLE, policy=policy)
    hs = [s.admit(spec(prompt=64, out=1000), 0) for _ in range(3)]
    d = Driver(s, FixedCosts(BOUND_TABLE))
    d.run(12)
    prompt = s.admit(spec(prompt=4000, out=8), s.now_ns)
    carried = []
    for _ in range(120):
        p = d.run_one()
        if p.shape.kind is not GraphKind.DECODE and prompt in p.handles:
            carried.append(BOUND_TABLE[p.shape])
    gap = max(np.diff(d.published[h]).max() for h in hs) / MS
    return prompt in d.published, carried, gap


def test_the_off_by_default_stall_bound_also_holds_for_mixed_graphs():
    # Without the bound the prompt's growing price buys the 82-ms graph with the 1024-token chunk.
    served, carried, gap = _long_prompt_among_mixed_decoders(configs())
    assert served and max(carried) == 82.0 and gap >= 82.0
    # With it, no graph carrying the prompt runs past the oldest decoder's age + T <= 40 ms: it takes
    # 256-token chunks and the decoders' gaps stay within the bound.
    served, carried, gap = _long_prompt_among_mixed_decoders(configs(stall_bound_ms=40.0))
    assert served and max(carried) == 27.0 and gap <= 40.0

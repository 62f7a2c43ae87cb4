"""Several prompt rows in one mixed graph (docs/packed-prompt-rows.md): the catalog capacity, the
plan's role check, completion by phase for each prompt row (first outputs, malformed completions),
prompt chunks that stop at their anchor cuts, and no lost request or leaked slot under random
admission and cancellation. Exactness: test_packed_prompt_rows_exhaustive.py."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.config import SchedulerConfig
from helios.errors import ConfigError, InvalidCompletion, InvalidRequest
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import Capacities, build_catalog
from helios.prepare.mixed import mixed_shapes
from helios.scheduler import CompletionRecord, ExecutionTiming, Scheduler
from helios.scheduler.plan import Lane, ScheduledPlan, SelectionReason

from helios.scheduler.lookahead import two_stage
from helios.scheduler.policy import Budget
from helios.scheduler.prerequisites import restore_candidates
from helios.scheduler.selection import cost_lookup, current_view, derived
from helios.scheduler.service import log_prices

from conftest import MS, assert_all_ended, cancel_pick, decode, digest, drain, make, prefill, sim_driver, spec
from mixed_helpers import decoders_and_prompts, mixed
from test_mixed_completion import good
from test_prerequisite_gaps import _chunk_value, _restored_prompt_among_decoders

MIXED = GraphKind.MIXED
SNAP, REST = GraphShape(GraphKind.SNAPSHOT, 1), GraphShape(GraphKind.RESTORE, 1)
# No prefill graph: every prompt goes through a mixed graph whose 256 tokens two rows may share.
TABLE = {decode(2): 5.2, decode(4): 5.5, mixed(4, 64, rows=2): 6.2, mixed(4, 256, rows=2): 13.2}


# ---- the catalog capacity -----------------------------------------------------------------------

def test_one_prompt_row_keeps_the_spec_example_catalog():
    # The spec's worked example: concurrency 4, 4096-token chunks, five drafts, R = 6.
    spec_form = mixed_shapes(4, 4096, 5, 6)
    assert len(spec_form) == 22 and len(mixed_shapes(4, 4096, 0, 6)) == 20
    assert all(s.prompt_rows == 1 and ",R=" not in s.label() for s in spec_form)
    assert mixed_shapes(4, 4096, 5, 6, prompt_rows=1) == spec_form
    # Several rows change no shape's capacities: the catalog does not grow, each graph packs
    # min(R, B) prompt rows.
    packed = mixed_shapes(4, 4096, 5, 6, prompt_rows=3)
    assert [s.capacities() for s in packed] == [s.capacities() for s in spec_form]
    assert {(s.batch_capacity, s.prompt_rows) for s in packed} == {(2, 2), (4, 3)}
    catalog = build_catalog(Capacities(4, (4096,), mixed_prefill=True, mixed_prompt_rows=2))
    assert {s.prompt_rows for s in catalog.of_kind(MIXED)} == {2}
    assert {s.prompt_rows for s in catalog if s.kind is not MIXED} == {1}


@pytest.mark.parametrize("bad", [0, -1, 65, True, 2.0, "2"])
def test_mixed_prompt_rows_is_validated(bad):
    with pytest.raises(ConfigError, match="mixed_prompt_rows"):
        Capacities(4, (256,), mixed_prefill=True, mixed_prompt_rows=bad)


def test_only_mixed_graphs_carry_several_prompt_rows_and_at_most_their_rows():
    with pytest.raises(ConfigError, match="prompt_rows"):
        GraphShape(GraphKind.PREFILL, 2, 64, prompt_rows=2)
    with pytest.raises(ConfigError, match="prompt_rows"):
        mixed(2, 64, rows=3)
    with pytest.raises(ConfigError, match="prompt_rows"):
        mixed(2, 64, rows=0)
    assert mixed(4, 256, rows=2).label() == "mixed[B=4,W=1,C=256,R=2]"
    assert mixed(4, 256, rows=2) != mixed(4, 256)  # a different captured program and cost entry


# ---- the plan's roles -----------------------------------------------------------------------------

def _plan(shape, lanes):
    return ScheduledPlan(shape, lanes, 1, 0.0, 0.0, SelectionReason.ORDINARY, True, False, 0, 0, ())


def _prompt_lane(h, tokens, out=0):
    return Lane(h, 0, 0, None, 0, tokens, 0, out, float(tokens), 0.0, 1.0)


def test_prompt_rows_share_the_prompt_capacity():
    shape = mixed(4, 256, rows=2)
    plan = _plan(shape, [_prompt_lane(1, 200), _prompt_lane(2, 56, 1), Lane(3, 0, 0, 3, 0, 0, 70, 1, 1.0, 1.0, 1.0)])
    assert plan.prefill_rows == (0, 1) and plan.prefill_row == 0
    assert plan.padding() == shape.max_packed_extent - 256 - 1
    for lanes in ([_prompt_lane(1, 200), _prompt_lane(2, 57)],  # 257 tokens: over the shared budget
                  [_prompt_lane(1, 64), _prompt_lane(2, 64), _prompt_lane(3, 64)],  # three rows
                  [_prompt_lane(1, 64, 2), _prompt_lane(2, 64)]):  # two output rows on a prompt row
        with pytest.raises(InvalidRequest, match="prompt row"):
            _plan(shape, lanes)
    with pytest.raises(InvalidRequest, match="at most one prompt row"):  # the spec's form
        _plan(mixed(4, 256), [_prompt_lane(1, 64), _prompt_lane(2, 64)])


# ---- completion by phase ------------------------------------------------------------------------

def committed(prompts, decoders=2):
    s = Scheduler(Catalog(TABLE), config=SchedulerConfig())
    s.seed_costs({shape: [int(ms * MS)] for shape, ms in TABLE.items()}, 0)
    s.advance_to(1000 * MS)
    dec, pro = decoders_and_prompts(s, decoders, prompts)
    plan = s.plan()
    assert plan.shape.kind is MIXED and plan.prefill_rows == (0, 1)
    s.commit(plan, 1)
    s.advance_to(s.now_ns + 7 * MS)
    return s, plan, dec, pro


def test_two_finishing_prompt_rows_each_publish_one_first_token():
    s, plan, dec, (a, b) = committed([100, 90])
    assert sorted(plan.lanes.prompt_tokens[:2].tolist()) == [90, 100] and plan.lanes.output_rows[:2].tolist() == [1, 1]
    out = {g.handle: g for g in s.complete(1, good(plan), ExecutionTiming((7 * MS,)))}
    for h, n in ((a, 100), (b, 90)):
        assert out[h].tokens == (11,) and out[h].first
        row = s.request_row(h)
        assert row.prompt_done == n and row.output_done == 1 and row.phase.name == "DECODE"
    assert all(out[h].tokens == (11,) for h in dec)


def test_the_last_row_takes_what_the_budget_leaves_and_publishes_nothing():
    s, plan, dec, (a, b) = committed([200, 200])
    first, second = plan.lanes[0], plan.lanes[1]
    assert (first.prompt_tokens, first.output_rows, second.prompt_tokens, second.output_rows) == (200, 1, 56, 0)
    out = {g.handle: g for g in s.complete(1, good(plan), ExecutionTiming((7 * MS,)))}
    assert out[first.handle].first and second.handle not in out
    row = s.request_row(second.handle)
    assert row.prompt_done == 56 and row.output_done == 0 and row.queued_prompt == 0 and row.phase.name == "PREFILL"


@pytest.mark.parametrize("kind", ["short_extent", "long_extent", "token_on_partial_row", "no_first_token",
                                  "offered_on_prompt_row", "prompt_rows_swapped"])
def test_a_malformed_completion_of_one_prompt_row_changes_nothing(kind):
    s, plan, dec, _ = committed([200, 200])
    recs = good(plan)
    first, second = plan.lanes[0], plan.lanes[1]
    if kind == "short_extent":
        recs[1] = CompletionRecord(second.handle, second.epoch, second.prompt_tokens - 1, ())
    elif kind == "long_extent":
        recs[1] = CompletionRecord(second.handle, second.epoch, second.prompt_tokens + 1, ())
    elif kind == "token_on_partial_row":
        recs[1] = CompletionRecord(second.handle, second.epoch, second.prompt_tokens, (11,))
    elif kind == "no_first_token":
        recs[0] = CompletionRecord(first.handle, first.epoch, first.prompt_tokens, ())
    elif kind == "offered_on_prompt_row":
        recs[1] = CompletionRecord(second.handle, second.epoch, second.prompt_tokens, (), offered=0)
    else:
        recs[0], recs[1] = recs[1], recs[0]
    before = digest(s)
    with pytest.raises(InvalidCompletion):
        s.complete(1, recs, ExecutionTiming((7 * MS,)))
    assert digest(s) == before
    s.complete(1, good(plan), ExecutionTiming((7 * MS,)))  # the well-formed one still applies
    assert s.request_row(second.handle).prompt_done == 56


def test_one_prompt_row_decides_as_before_and_more_rows_only_add_cohorts():
    """The spec's form and R = 2 plan the same graph for one prompt; with two prompts R = 2 packs
    both, R = 1 takes the better one, and R = 2's choice is worth at least as much per time."""
    def planned(rows, prompts):
        table = {decode(2): 5.2, decode(4): 5.5, mixed(4, 64, rows=rows): 6.2, mixed(4, 256, rows=rows): 13.2}
        s = make(table)
        s.advance_to(1000 * MS)
        decoders_and_prompts(s, 2, prompts)
        return s.plan()
    one, two = planned(1, [100]), planned(2, [100])
    assert (one.lanes, one.score, one.shape.capacities()) == (two.lanes, two.score, two.shape.capacities())
    one, two = planned(1, [100, 90]), planned(2, [100, 90])
    assert one.prefill_rows == (0,) and two.prefill_rows == (0, 1)
    assert two.score >= one.score


# ---- prompt checkpoints: anchor cuts --------------------------------------------------------------

def test_each_prompt_row_stops_at_its_anchor_cut():
    table = {decode(1): 10, decode(4): 14, prefill(64): 30, mixed(4, 256, rows=2): 40, SNAP: 2, REST: 3}
    s = make(table, config=SchedulerConfig(checkpoint_extra_work_fraction=0.9))  # funds every cut
    a = s.admit(spec(prompt=150, out=3, endpoints=(60,)), 0)
    b = s.admit(spec(prompt=120, out=3, endpoints=(90,)), 0)
    cuts = {a: {60, 150}, b: {90, 120}}
    log, _ = drain(s)
    packed = [p for p, _ in log if p.shape.kind is MIXED and len(p.prefill_rows) == 2]
    assert packed, "the two prompts shared a mixed graph"
    snapped = {(int(h), int(at)) for p, _ in log if p.anchor for h, at in zip(p.lanes.handle, p.lanes.context_tokens)}
    assert snapped == {(h, c) for h, cs in cuts.items() for c in cs}
    for p, _ in log:  # no chunk of either request, in any row, passes one of its cuts
        for lane in p.lanes:
            start, end = lane.prompt_start, lane.prompt_start + lane.prompt_tokens
            assert not any(start < c < end for c in cuts[lane.handle])
    assert not s.is_live(a) and not s.is_live(b) and s.resources.free_slots == s.resources.total_slots


# ---- the prerequisite lookahead before a mixed graph -------------------------------------------------

def test_a_restore_before_packed_prompt_rows_counts_the_ready_prompt_it_packs_with():
    """A restored prompt (50 tokens left) and an already-ready 40-token prompt share a mixed
    graph's 128-token budget in two prompt rows, next to the running decoders: the restore's score
    is that sequence's exact rate, with both prompt rows in the fixed value and two following rows."""
    m4 = mixed(4, 128, rows=2)
    table = {decode(1): 10, decode(4): 12, prefill(64): 30, m4: 31, REST: 1, SNAP: 2}
    s, restored = _restored_prompt_among_decoders(table)
    ready = s.admit(spec(prompt=40, out=4), s.now_ns)
    view = current_view(s.selection, s.now_ns)
    coeff = derived(s)[2]
    (c,) = restore_candidates(s.state, s.requests, cost_lookup(s.costs, s.now_ns), s.shapes.prefill,
                              s.shapes.decode_steps, coeff, view.log_scale, view.waiting,
                              Budget(s.resources.free_slots, s.resources.free_pages),
                              lambda rows: s.resources.extent_pages_of(s.requests, rows),
                              view.prefill[GraphKind.PREFILL][0], view.decode, (m4,))
    row = s.requests.row(ready)
    lp, lo = log_prices(s.requests.log_x[[row]].copy(), s.requests.log_z[[row]].copy(), coeff)[:2]
    ready_value = math.exp(lp[0] - view.log_scale) * 40 + math.exp(lo[0] - view.log_scale)
    decoders = view.decode.base + view.decode.age_slope * (1.0 + 31.0)
    prompts = _chunk_value(s, restored, view.log_scale, coeff) + ready_value
    expected = two_stage([], decoders, (), 1, 4, 1.0, 31.0, view.waiting, prompts, True, 2)
    assert c.score == pytest.approx(expected.score, rel=1e-12) and expected.fixed == 2
    one_row = two_stage([], decoders, (), 1, 4, 1.0, 31.0, view.waiting, _chunk_value(s, restored, view.log_scale,
                                                                                       coeff), True)
    assert c.score > one_row.score  # the packed ready prompt adds its value at the same F


# ---- invariants ----------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["admit", "admit", "cancel", "step", "step"]),
                          st.integers(0, 7), st.integers(1, 400)), min_size=1, max_size=40),
       st.integers(0, 3), st.sampled_from([2, 3, 4]))
def test_no_lost_request_no_leak_and_the_budget_holds_with_several_prompt_rows(ops, seed, rows):
    table = {decode(1): 6.1, decode(4): 6.4, prefill(64): 7.0, mixed(4, 64, rows=rows): 7.4,
             mixed(4, 256, rows=rows): 11.0, mixed(2, 256, rows=2): 10.5}
    sched, d = sim_driver(table, seed, slots=4)
    handles = []
    for op, pick, n in ops:
        if op == "admit":
            handles.append(d.submit(range(10 + n), 1 + n % 5, output_len=n % 4 + 1))
        elif op == "cancel":
            cancel_pick(d, handles, pick)
        else:
            d.step()
    d.run()
    assert_all_ended(sched, d, handles, slots=4)
    for p in d.history:
        if p.shape.kind is MIXED:
            assert len(p.prefill_rows) <= p.shape.prompt_rows
            assert int(p.lanes.prompt_tokens.sum()) <= p.shape.prefill_capacity

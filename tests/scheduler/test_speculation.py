"""Speculative programs (spec: "Speculative graph coverage", "Completed confidence and acceptance")."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helios.config import SchedulerConfig, SpeculationMode
from helios.errors import ConfigError, InvalidCompletion
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import speculative_shapes
from helios.scheduler import CompletionRecord, ExecutionTiming, Scheduler
from helios.scheduler.policy import LanePool
from helios.scheduler.rounds import _device_best_prefix, _frontier, _gains, device_allocate
from helios.scheduler.speculation import (PopulationPrior, PrefixColumns, ProposalSource, SpeculationColumns,
                                          SpeculationModel, expected_output)

from conftest import MS, digest, prefill, spec

SPEC = GraphKind.SPECULATIVE


def own(cols, source, row=0):
    """A row's own acceptance means (it must have started one)."""
    assert cols.acceptance[source].has[row]
    return cols.acceptance[source].means[row]


def spec_shape(b, w, p=None):
    return GraphShape(SPEC, b, w, w - 1, p or b * w)


# ---- coverage -----------------------------------------------------------------------------

def test_rectangular_and_ragged_programs_respect_the_envelope():
    shapes = speculative_shapes(16, range(1, 9), 32)
    for s in shapes:
        assert s.target_capacity <= 32 or s.rectangular and s.batch_capacity * s.token_capacity <= 32
        if s.rectangular:
            assert s.target_capacity == s.batch_capacity * s.token_capacity <= 32
        else:
            assert s.target_capacity == 32 < s.batch_capacity * s.token_capacity
    assert GraphShape(SPEC, 16, 4, 3, 32) in shapes  # ragged: B x W = 64 > R
    assert all(s.proposal_depth == 0 for s in shapes if s.token_capacity == 1)
    assert {s.batch_capacity for s in shapes if s.token_capacity == 1} == {1, 2, 4, 8, 16}


def test_width_one_programs_have_depth_zero_and_all_extents_are_explicit():
    with pytest.raises(ConfigError, match="D = 0"):
        GraphShape(SPEC, 4, 1, 2, 4)
    with pytest.raises(ConfigError, match="P cannot exceed"):
        GraphShape(SPEC, 2, 4, 3, 9)
    a, b = GraphShape(SPEC, 4, 4, 3, 16), GraphShape(SPEC, 4, 4, 2, 16)
    assert a != b  # a smaller producer is a distinct physical program


# ---- estimates ----------------------------------------------------------------------------

def test_population_prior_starts_at_half_to_the_d_and_moves_by_one_sixty_fourth():
    prior = PopulationPrior(4)
    assert np.allclose(prior.means, [0.5, 0.25, 0.125, 0.0625])
    prior.observe_prefixes(np.array([[1.0, 0.0, 0.0, 0.0]]), np.array([1]), np.array([False]))
    assert prior.means[0] == pytest.approx(0.5 + (1 - 0.5) / 64)
    assert np.allclose(prior.means[1:], [0.25, 0.125, 0.0625])  # only the observed prefix moves


def test_accepted_prefix_positive_rejection_zero_for_longer_offered_termination_censors():
    m = SpeculationModel(6)
    st_ = SpeculationColumns(6, 1)
    m.observe_round(st_, 0, ProposalSource.LEARNED, 10, accepted=2, offered=4, censored=False)
    est = own(st_, ProposalSource.LEARNED)
    prior = 0.5 ** np.arange(1, 7)
    # weight 2 at the prior, then one observation: (2 * prior + obs) / 3
    assert est[:4] == pytest.approx((2 * prior[:4] + np.array([1, 1, 0, 0])) / 3)
    assert est[4:] == pytest.approx(prior[4:])  # unobserved suffixes keep their means
    st2 = SpeculationColumns(6, 1)
    m = SpeculationModel(6)  # a fresh population prior
    m.observe_round(st2, 0, ProposalSource.LEARNED, 10, accepted=2, offered=4, censored=True)
    est2 = own(st2, ProposalSource.LEARNED)
    assert est2[2:4] == pytest.approx(prior[2:4])  # censored, not rejected


def test_width_one_rounds_supply_no_acceptance_observation():
    m = SpeculationModel(4)
    st_ = SpeculationColumns(4, 1)
    m.observe_round(st_, 0, ProposalSource.LEARNED, 5, accepted=0, offered=0, censored=False)
    assert not any(c.has[0] for c in st_.acceptance.values())


def test_weights_start_at_two_cap_at_128_and_age_with_half_life_128_tokens():
    est = PrefixColumns(1, 1)
    est.start(np.array([0]), PopulationPrior(1).means, np.array([0]))
    assert est.weights[0, 0] == 2.0 and est.means[0, 0] == 0.5
    for _ in range(500):
        est.observe(np.array([0]), np.array([[1.0]]), np.array([1]))
    assert est.weights[0, 0] == 128.0
    est.age(np.array([0]), np.array([128]))
    assert est.weights[0, 0] == pytest.approx(64.0)
    bound = est.optimistic(0)[0]
    assert bound == pytest.approx(min(1.0, est.means[0, 0] + math.sqrt(math.log(20) / (2 * 64.0))))


def test_survival_rows_replace_binary_observations():
    a, b = SpeculationColumns(4, 1), SpeculationColumns(4, 1)
    SpeculationModel(4).observe_round(a, 0, ProposalSource.LEARNED, 0, 1, 3, False, survival=np.array([0.9, 0.6, 0.2]))
    SpeculationModel(4).observe_round(b, 0, ProposalSource.LEARNED, 0, 1, 3, False)
    pa, pb = own(a, ProposalSource.LEARNED), own(b, ProposalSource.LEARNED)
    assert pa[0] == pytest.approx((2 * 0.5 + 0.9) / 3) and pb[0] == pytest.approx((2 * 0.5 + 1) / 3)


def test_expected_output_is_one_plus_survival_sum_raised_to_alpha():
    s = np.array([0.8, 0.5, 0.25])
    assert expected_output(s, 4) == pytest.approx(2.55)
    assert expected_output(s, 2) == pytest.approx(1.8)
    assert expected_output(s, 4, alpha=2.0) == pytest.approx(1 + 0.64 + 0.25 + 0.0625)
    assert expected_output(s, 1) == 1.0


# ---- device allocation --------------------------------------------------------------------

def test_frontier_admits_best_joint_probability_with_ties_to_shorter_prefix_then_slot():
    joint = [np.array([0.9, 0.5, 0.4]), np.array([0.9, 0.9, 0.1]), np.array([0.5, 0.5, 0.5])]
    # Budget 3 lanes + 3 drafts: 0.9 (lane0 d1, slot 0 first), 0.9 (lane1 d1), 0.9 (lane1 d2).
    assert device_allocate(joint, [4, 4, 4], [0, 1, 2], 6) == [2, 3, 1]
    # A tie at 0.5 between lane0 d2 and lane2 d1: the shorter prefix wins.
    assert device_allocate(joint, [4, 4, 4], [0, 1, 2], 7) == [2, 3, 2]
    # Ceilings bound each lane; ceilings may sum above P.
    assert device_allocate(joint, [1, 2, 4], [0, 1, 2], 5) == [1, 2, 2]


monotone_rows = st.lists(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(monotone_rows, st.integers(1, 5), st.integers(0, 12))
def test_host_prediction_equals_the_device_frontier(rows, ceiling, extra):
    joint = np.minimum.accumulate(np.array(rows), axis=1)
    n = len(joint)
    ceilings = np.full(n, ceiling)
    budget = n + extra
    pool = LanePool(np.arange(n), np.zeros(n, dtype=np.int64), np.arange(n), np.ones(n),
                    extra_value=np.ones(n), survival_alpha=np.full((n, 4), 0.5), forecast=joint,
                    limit=np.full(n, 100))
    frontier = _frontier(pool, _gains(pool, ceilings), ceilings)
    lanes, m, values, selected, lane_pos = _device_best_prefix(np.arange(n), pool, frontier, n, budget)
    predicted = 1 + np.bincount(lane_pos[selected[-1]], minlength=n)
    assert list(predicted) == device_allocate(list(joint), list(ceilings), list(range(n)), budget)


# ---- selection ----------------------------------------------------------------------------

WIDTHS = range(1, 9)


def spec_table(widths=WIDTHS, r=64, batches=(1, 2, 4, 8, 16), ragged=True):
    table = {prefill(64, b): 6.0 + 1.2 * b for b in batches}
    for s in speculative_shapes(max(batches), widths, r, ragged):
        table[s] = 8.0 + 0.05 * s.target_capacity
    return table


def spec_sched(table, mode=SpeculationMode.ADAPTIVE, survival=None, n=4, out=200):
    s = Scheduler(Catalog(table), config=SchedulerConfig(kv_pages=1 << 15, speculation=mode))
    for shape, ms in table.items():
        s.costs.observe(shape, int(ms * MS), 0)
    if survival is not None:
        s.seed_acceptance(survival)
    hs = [s.admit(spec(prompt=64, out=out), 0) for _ in range(n)]
    p = s.plan()
    s.commit(p, 1)
    s.advance_to(20 * MS)
    s.complete(1, [CompletionRecord(l.handle, l.epoch, 64, (5,)) for l in p.lanes], ExecutionTiming((20 * MS,)))
    for h in hs:
        s.published_output(h, 1)
    return s, hs


def test_high_acceptance_selects_wide_rounds_and_low_acceptance_narrow_ones():
    high, _ = spec_sched(spec_table(), survival=[0.95 ** d for d in range(1, 9)])
    low, _ = spec_sched(spec_table(), survival=[0.05 ** d for d in range(1, 9)])
    wide, narrow = high.plan(), low.plan()
    assert wide.shape.kind is SPEC and narrow.shape.kind is SPEC
    assert wide.shape.token_capacity >= 6
    assert narrow.shape.token_capacity <= 2


def test_fixed_host_allocation_keeps_complete_prefixes_shortened_by_limits():
    table = {prefill(64, 4): 10.0, spec_shape(4, 5): 12.0}
    s, hs = spec_sched(table, SpeculationMode.FIXED, out=3)
    p = s.plan()
    # Two tokens left under max_output_tokens=3: the ceiling is min(D + 1, W, limit) = 2.
    assert [l.output_rows for l in p.lanes] == [2] * 4
    assert not p.device_allocation


def test_constrained_ragged_program_uses_device_allocation_and_prices_its_rows():
    table = {prefill(64, 4): 10.0, GraphShape(SPEC, 4, 8, 7, 12): 9.0}
    s, hs = spec_sched(table, survival=[0.9 ** d for d in range(1, 9)])
    p = s.plan()
    assert p.device_allocation and len(p.lanes) == 4
    assert all(l.output_rows == 8 for l in p.lanes)  # immutable lane ceilings sum above P
    assert sum(l.predicted_rows for l in p.lanes) <= 12


def test_pruning_only_between_programs_with_the_same_depth():
    table = {prefill(64, 4): 10.0, GraphShape(SPEC, 4, 4, 3, 16): 12.0, GraphShape(SPEC, 4, 4, 2, 16): 12.0}
    s, hs = spec_sched(table, SpeculationMode.FIXED)
    assert s.plan().shape.kind is SPEC  # both depths stay candidates; neither prunes the other


def _round_plan(s):
    p = s.plan()
    s.commit(p, 2)
    s.advance_to(s.now_ns + 10 * MS)
    return p


def _records(p, accepted=1):
    return [CompletionRecord(l.handle, l.epoch, 0, (9,) * (accepted + 1), offered=l.output_rows - 1)
            for l in p.lanes]


@pytest.mark.parametrize("bad", ["shape", "dtype", "range", "missing", "too_many_tokens", "offered"])
def test_malformed_packed_round_is_rejected_without_state_change(bad):
    table = {prefill(64, 4): 10.0, GraphShape(SPEC, 4, 8, 7, 12): 9.0}
    s, hs = spec_sched(table, survival=[0.9 ** d for d in range(1, 9)])
    p = _round_plan(s)
    sidecar = np.full(s.sidecar_shape(), 0.5, dtype=np.float32)
    records = [CompletionRecord(l.handle, l.epoch, 0, (9,), offered=l.predicted_rows - 1) for l in p.lanes]
    if bad == "shape":
        sidecar = np.zeros((2, 3, 3), dtype=np.float32)
    elif bad == "dtype":
        sidecar = sidecar.astype(np.float64)
    elif bad == "range":
        sidecar[1, 0, 0] = 1.5
    elif bad == "too_many_tokens":
        records[0] = CompletionRecord(records[0].handle, records[0].epoch, 0, (9,) * 9, offered=7)
    elif bad == "offered":
        records = [CompletionRecord(r.handle, r.epoch, 0, (9,), offered=7) for r in records]
    before = digest(s)
    with pytest.raises(InvalidCompletion):
        if bad == "missing":
            s.complete(2, records, ExecutionTiming((MS,)))
        else:
            s.complete_packed_round(2, records, ExecutionTiming((MS,)), sidecar)
    assert digest(s) == before
    out = s.complete_packed_round(2, [CompletionRecord(l.handle, l.epoch, 0, (9,), offered=0) for l in p.lanes],
                                  ExecutionTiming((MS,)), np.full(s.sidecar_shape(), 0.5, dtype=np.float32))
    assert len(out) == 4


def test_ranks_may_disagree_on_confidence_but_rank_zero_drives_forecasts():
    table = {prefill(64, 4): 10.0, GraphShape(SPEC, 4, 8, 7, 12): 9.0}
    s, hs = spec_sched(table, survival=[0.9 ** d for d in range(1, 9)])
    p = _round_plan(s)
    rank0 = np.full(s.sidecar_shape(), 0.9, dtype=np.float32)
    rank1 = np.full(s.sidecar_shape(), 0.1, dtype=np.float32)
    s.complete_packed_round(2, [CompletionRecord(l.handle, l.epoch, 0, (9,), offered=2) for l in p.lanes],
                            ExecutionTiming((MS,)), [rank0, rank1])
    for h in hs:
        forecast = s.requests.speculation.forecast.means[s.requests.row(h)]
        assert forecast[0] > 0.6  # moved toward rank 0's 0.9, not rank 1's 0.1


def test_malformed_survival_rows_are_rejected():
    table = {prefill(64, 4): 10.0, spec_shape(4, 3): 12.0}
    s, hs = spec_sched(table, SpeculationMode.FIXED)
    p = _round_plan(s)
    recs = _records(p)
    before = digest(s)
    for rows in ([0.5, 0.9], [1.2], [0.9, 0.8, 0.7, 0.6]):
        with pytest.raises(InvalidCompletion):
            s.complete_with_survival(2, recs, ExecutionTiming((MS,)), {p.lanes[0].handle: rows})
        assert digest(s) == before
    s.complete_with_survival(2, recs, ExecutionTiming((MS,)), {p.lanes[0].handle: [0.7, 0.4]})
    est = own(s.requests.speculation, ProposalSource.LEARNED, s.requests.row(p.lanes[0].handle))
    assert est[0] == pytest.approx((2 * 0.5 + 0.7) / 3)


def test_queued_lane_advances_at_most_min_ceiling_and_p():
    table = {prefill(64, 4): 10.0, spec_shape(4, 5): 12.0}
    s, hs = spec_sched(table, SpeculationMode.FIXED)
    p1 = s.plan()
    s.commit(p1, 2)
    r = s.requests[hs[0]]
    assert r.queued_output == 5  # pinned through the lane's fence at its full ceiling
    p2 = s.plan()
    assert p2 is not None and p2.lanes[0].context_tokens == r.prompt_done + r.output_done + 5


def test_speculative_counters_cover_complete_programs():
    table = {prefill(64, 4): 10.0, spec_shape(4, 3): 12.0}
    s, hs = spec_sched(table, SpeculationMode.FIXED)
    p = _round_plan(s)
    s.complete(2, _records(p, accepted=1), ExecutionTiming((MS,)))
    st_ = s.stats
    assert (st_.speculative_programs, st_.speculative_offered, st_.speculative_accepted,
            st_.speculative_emitted, st_.speculative_learned_draws) == (1, 8, 4, 8, 8)


def test_load_time_reduction_keeps_only_existing_programs():
    from helios.prepare import reduce_capacities
    cat = Catalog(speculative_shapes(8, range(1, 9), 32) + [prefill(64)])
    small = reduce_capacities(cat, max_width=4, token_capacity=16)
    assert all(s.token_capacity <= 4 and s.target_capacity <= 16 for s in small.of_kind(SPEC))
    assert set(small) <= set(cat)
    with pytest.raises(ConfigError, match="no prepared speculative"):
        reduce_capacities(cat, token_capacity=0)


def test_copy_proposals_contribute_no_learned_draws():
    table = {prefill(64, 4): 10.0, spec_shape(4, 3): 12.0}
    s = Scheduler(Catalog(table), config=SchedulerConfig(kv_pages=1 << 15, speculation=SpeculationMode.FIXED,
                                                         copy_proposals=True))
    for shape, ms in table.items():
        s.costs.observe(shape, int(ms * MS), 0)
    hs = [s.admit(spec(prompt=64, out=50), 0) for _ in range(4)]
    p = s.plan()
    s.commit(p, 1)
    s.complete(1, [CompletionRecord(l.handle, l.epoch, 64, (5,)) for l in p.lanes], ExecutionTiming((MS,)))
    p = s.plan()
    s.commit(p, 2)
    # A copy proposer may supply a shorter prefix than the ceiling: offered bounds it.
    s.complete(2, [CompletionRecord(l.handle, l.epoch, 0, (9,), offered=1) for l in p.lanes], ExecutionTiming((MS,)))
    assert s.stats.speculative_learned_draws == 0 and s.stats.speculative_offered == 4
    assert s.requests.speculation.acceptance[ProposalSource.COPY].has[s.requests.row(hs[0])]


def greedy_frontier(joint, ceilings, slots, budget):
    """The spec's device rule written out: one row at a time, the best immediate frontier by joint
    prefix probability, then the shorter prefix, then the original slot."""
    rows = [1] * len(ceilings)
    for _ in range(budget - len(rows)):
        frontier = [(-joint[i][rows[i] - 1], rows[i], slots[i], i) for i in range(len(rows))
                    if rows[i] < ceilings[i] and rows[i] <= len(joint[i])]
        if not frontier:
            break
        rows[min(frontier)[3]] += 1
    return rows


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]) | st.floats(0.0, 1.0), min_size=0, max_size=5),
                min_size=1, max_size=8), st.booleans(), st.lists(st.integers(1, 7), min_size=8, max_size=8),
       st.integers(0, 20), st.randoms(use_true_random=False))
def test_device_allocation_is_the_greedy_frontier(rows, monotone, ceilings, extra, rng):
    joint = [np.minimum.accumulate(r) if monotone and r else np.array(r, dtype=float) for r in rows]
    n = len(joint)
    slots = rng.sample(range(100), n)
    budget = n + extra - 2  # a budget below the lane count leaves every lane its pending row
    want = greedy_frontier(joint, ceilings[:n], slots, budget)
    assert device_allocate(joint, ceilings[:n], slots, budget) == want

"""The spec's direct scheduler: 7/8 moving-average costs that revert after 30 s."""

from __future__ import annotations

import pytest

from helios.baselines import DirectScheduler, MovingAverageCost
from helios.config import SchedulerConfig
from helios.engine.sim_core import SimCore
from helios.graphs import GraphKind, GraphShape
from helios.scheduler.cost import CostState
from helios.scheduler.plan import SelectionReason
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.requests import Phase
from helios.sim.loop import Simulation

from .support import CATALOG, AffineCost, Stepper, workload

S = 1_000_000_000
DECODE4 = GraphShape(GraphKind.DECODE, 4)


def test_first_sample_sets_then_seven_eighths_moving_average():
    """Rule: new = 7/8 old + 1/8 sample; the first sample sets the estimate."""
    c = MovingAverageCost()
    assert c.estimate_ns(DECODE4, 0) is None and c.state(DECODE4, 0) is CostState.UNKNOWN
    assert c.observe(DECODE4, 800, 0)
    assert c.estimate_ns(DECODE4, 0) == 800 and c.state(DECODE4, 0) is CostState.FRESH
    c.observe(DECODE4, 1600, 1 * S)
    assert c.estimate_ns(DECODE4, 1 * S) == 900  # 7/8 * 800 + 1/8 * 1600
    c.observe(DECODE4, 100, 2 * S)
    assert c.estimate_ns(DECODE4, 2 * S) == round(7 / 8 * 900 + 100 / 8)
    other = GraphShape(GraphKind.DECODE, 8)
    assert c.estimate_ns(other, 2 * S) is None  # entries are per physical graph


def test_missing_or_nonpositive_samples_change_nothing():
    c = MovingAverageCost()
    c.observe(DECODE4, 1000, 0)
    assert not c.observe(DECODE4, None, S) and not c.observe(DECODE4, 0, S) and not c.observe(DECODE4, -3, S)
    assert c.estimate_ns(DECODE4, S) == 1000 and c.observation_age_ns(DECODE4, S) == S


def test_reverts_to_unmeasured_after_30_seconds():
    """Rule: 30 s without a valid observation makes the graph unmeasured (not stale);
    the next sample then sets the estimate afresh instead of averaging."""
    c = MovingAverageCost()
    c.observe(DECODE4, 1000, 5 * S)
    assert c.estimate_ns(DECODE4, 35 * S) == 1000  # exactly 30 s: still measured
    assert c.estimate_ns(DECODE4, 35 * S + 1) is None
    assert c.state(DECODE4, 35 * S + 1) is CostState.UNKNOWN
    c.advance_to(36 * S)
    assert c.measured() == {} and c.estimate_ns(DECODE4) is None  # implicit time: the latest
    c.observe(DECODE4, 4000, 36 * S)
    assert c.estimate_ns(DECODE4, 36 * S) == 4000


def test_scheduler_learns_and_forgets_decode_costs():
    """Rule: the direct scheduler's decode rounds use the moving average; after 30 s idle the
    graph is indeterminate again (a discovery round that needs an empty window)."""
    sched = DirectScheduler(CATALOG, config=SchedulerConfig(request_slots=8))
    st = Stepper(sched, step_ms=10.0)
    st.admit(RequestSpec(40, 50))
    st.step()  # prefill
    plan, fence = st.dispatch()
    assert plan.shape.kind is GraphKind.DECODE and plan.reason is SelectionReason.DISCOVERY
    st.finish(plan, fence)
    assert sched.costs.estimate_ns(plan.shape) == 10_000_000
    plan, fence = st.dispatch()
    assert plan.reason is SelectionReason.ORDINARY and plan.estimated_duration_ns == 10_000_000
    st.step_ms = 18.0
    st.finish(plan, fence)
    assert sched.costs.estimate_ns(plan.shape) == 11_000_000  # 7/8 * 10 ms + 1/8 * 18 ms
    st.now += 31 * S
    sched.advance_to(st.now)
    plan = sched.plan()
    assert plan.reason is SelectionReason.DISCOVERY and plan.estimated_duration_ns is None
    assert plan.requires_feedback


def run_watched(arrivals):
    """Simulate the direct scheduler, recording (kind, queue depth, decoders present) per commit."""
    sched = DirectScheduler(CATALOG, config=SchedulerConfig(request_slots=8))
    seen = []
    commit = sched.commit

    def watched(plan, fence):
        decoders = any(r.phase is Phase.DECODE and r.output_left > 0 for r in map(sched.request_row, sched.requests))
        seen.append((plan.shape.kind, len(sched.queue), decoders))
        commit(plan, fence)

    sched.commit = watched
    sim = Simulation(sched, SimCore(CATALOG, AffineCost()))
    sim.add(arrivals)
    sim.run()
    assert not sched.requests and all(log.finish is not None for log in sim.logs.values())
    return seen


def test_measured_decode_rounds_may_fill_both_frames():
    """Rule: decode selection is Helios's, including queueing a measured round in frame two;
    prefill (FCFS) only ever runs with an empty window."""
    seen = run_watched(workload(6, seed=2, gap_ms=1.0, prompt=(8, 200), output=(30, 60)))
    assert any(kind is GraphKind.DECODE and depth == 1 for kind, depth, _ in seen)
    assert all(depth == 0 for kind, depth, _ in seen if kind.is_prefill)


@pytest.mark.parametrize("seed", [0, 1])
def test_prefill_alternates_with_decode_rounds(seed):
    """Rule: while decoders run, a prefill graph only follows a decode round (never another
    prefill), so unpriced prefill cannot starve the decode selection."""
    seen = run_watched(workload(20, seed=seed, gap_ms=3.0))
    assert sum(1 for kind, _, decoders in seen if kind.is_prefill and decoders) >= 5
    for (before, _, _), (kind, _, decoders) in zip(seen, seen[1:]):
        if kind.is_prefill and decoders:
            assert before is GraphKind.DECODE

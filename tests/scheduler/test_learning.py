"""Funded acceptance learning (spec: "Funded acceptance learning", "Completed confidence and acceptance")."""

import math

import numpy as np
import pytest

from helios.config import SchedulerConfig, SpeculationMode
from helios.errors import StalePlan
from helios.graphs import GraphKind, GraphShape
from helios.scheduler import CompletionRecord, ExecutionTiming, SelectionReason
from helios.scheduler.cost import CostState
from helios.scheduler.learning import probe_key
from helios.scheduler.policy import Candidate
from helios.scheduler.speculation import START_WEIGHT, PopulationPrior, PrefixColumns, ProposalSource

from conftest import MS, Driver, make, prefill, records_for, spec, step
from conftest import table_policy

PROBE = SelectionReason.ACCEPTANCE_LEARNING
SECOND = 1_000 * MS


def w(width):
    return GraphShape(GraphKind.SPECULATIVE, 1, width, width - 1, width)


def costs(deep_ms=10.5):
    """Width one at 10 ms; every deeper width at `deep_ms`."""
    return {w(1): 10.0, **{w(k): deep_ms + (k - 2) * 0.1 for k in (2, 3, 4)}, prefill(64): 10.0}


def low_acceptance(mode=SpeculationMode.ADAPTIVE, out=100_000, deep_ms=10.5, ttl_ns=30 * SECOND):
    """One decoding stream whose acceptance was observed low, so ordinary selection runs width one."""
    s = make(costs(deep_ms), policy=table_policy(estimate_ttl_ns=ttl_ns),
             config=SchedulerConfig(speculation=mode, draft_capacity=3))
    h = s.admit(spec(64, out), 0)
    Driver(s).run(1)  # the prompt
    s.exploration.idle()  # start every test from zero credit (the prompt earned some)
    row = s.requests.row(h)
    for _ in range(200):
        s.speculation.observe_round(s.requests.speculation, row, s.source, 1, accepted=0, offered=3, censored=False)
    return s, h


def run_ordinary(s, n):
    """n ordinary frames with learning credit withheld, so no probe interrupts them."""
    for _ in range(n):
        s.exploration.learning.idle()
        plan = s.plan()
        assert plan.reason is SelectionReason.ORDINARY
        step(s, plan, (s._last_fence or 0) + 1)


def test_the_optimistic_estimate_is_the_bounded_mean_plus_confidence_at_the_aged_weight():
    cols, prior = PrefixColumns(2, 2), PopulationPrior(2)
    cols.start(np.array([0]), prior.means, np.array([0]))
    for _ in range(30):
        cols.observe(np.array([0]), np.array([[1.0, 0.0]]), np.array([2]))
    rows, generated = np.array([0, 1]), np.array([256, 0])
    opt = cols.optimistic_rows(rows, prior, generated)
    aged = cols.weights[0] * 0.5 ** (256 / 128)  # two half-lives since the last update
    assert opt[0] == pytest.approx(np.minimum(1, cols.means[0] + np.sqrt(math.log(20) / (2 * aged))))
    # A row without its own estimate: the prior at the starting weight.
    assert opt[1] == pytest.approx(np.minimum(1, prior.means + math.sqrt(math.log(20) / (2 * START_WEIGHT))))
    assert opt[0, 0] == 1.0  # bounded


def test_495_ms_of_ordinary_execution_funds_a_probe_one_depth_beyond_the_ordinary_choice():
    s, h = low_acceptance()
    ordinary = s.plan()
    assert ordinary.reason is SelectionReason.ORDINARY and ordinary.shape == w(1)
    s.exploration.learning.earn(495 * MS - 1)
    assert s.plan().reason is SelectionReason.ORDINARY
    s.exploration.learning.earn(1)  # 5 ms / (0.01 / 0.99) = 495 ms
    probe = s.plan()
    assert probe.reason is PROBE and probe.shape.proposal_depth >= 1
    assert probe.lanes.output_rows[0] >= 2
    # Lane values and expected tokens use the historical means, not the optimistic estimate.
    assert probe.lanes.expected_tokens[0] < 1.1


def test_no_probe_when_even_the_optimistic_estimate_cannot_beat_the_ordinary_choice():
    s, _ = low_acceptance(deep_ms=25.0)
    s.exploration.learning.earn(SECOND)
    assert s.plan().reason is SelectionReason.ORDINARY


def test_no_probe_without_future_output_to_use_the_observation():
    s, _ = low_acceptance(out=3)  # two tokens left: no room for a probe and a later round
    s.exploration.learning.earn(SECOND)
    assert s.plan().reason is SelectionReason.ORDINARY


def test_fixed_width_execution_does_not_probe():
    s, _ = low_acceptance(mode=SpeculationMode.FIXED)
    s.exploration.learning.earn(SECOND)
    for _ in range(20):
        plan = s.plan()
        assert plan.reason is SelectionReason.ORDINARY
        step(s, plan, (s._last_fence or 0) + 1)
        s.exploration.learning.earn(SECOND)


def test_timing_refresh_takes_precedence_over_a_funded_probe():
    s, _ = low_acceptance(ttl_ns=SECOND)
    run_ordinary(s, 150)  # width one stays fresh; the deeper widths go stale
    s.exploration.learning.earn(SECOND)
    s.exploration.refresh.earn(10 * SECOND)
    assert s.plan().reason is SelectionReason.TIMING_REFRESH


def test_probes_use_fresh_programs_only_so_the_ledgers_never_fund_the_same_execution():
    s, _ = low_acceptance(ttl_ns=SECOND)
    run_ordinary(s, 150)
    assert s.costs.state(w(2), s.now_ns) is CostState.STALE
    s.exploration.learning.earn(SECOND)  # refresh credit is short: only a probe could be funded
    assert s.exploration.refresh.credit_ns < 5 * MS and s.plan().reason is SelectionReason.ORDINARY


def test_one_probe_episode_at_a_time_and_it_pays_only_the_learning_ledger():
    s, _ = low_acceptance()
    s.exploration.learning.earn(SECOND)
    saved = s.plan()
    s.exploration.learning.idle()
    with pytest.raises(StalePlan, match="credit"):  # commit rechecks the funding
        s.commit(saved, 49)
    s.exploration.learning.earn(SECOND)
    probe = s.plan()
    s.commit(probe, 50)
    s.exploration.learning.earn(SECOND)  # full credit again, but the episode is still open
    after = s.plan()
    assert after is not None and after.reason is SelectionReason.ORDINARY
    refresh_before = s.exploration.refresh.credit_ns
    s.advance_to(s.now_ns + 11 * MS)
    sidecar = np.zeros(s.sidecar_shape(), dtype=np.float32)
    s.complete_packed_round(50, records_for(probe), ExecutionTiming((11 * MS,), wall_ns=11 * MS), sidecar)
    assert s.exploration.learning.credit_ns == pytest.approx(5 * MS - 11 * MS)
    assert s.exploration.refresh.credit_ns == refresh_before
    snap = s.snapshot()
    assert snap.executions["acceptance_learning"] == 1 and snap.nanoseconds["acceptance_learning"] == 11 * MS
    assert s.traces[-1].learning_credit_ns == 5 * MS


def test_probe_ranking_gain_per_time_then_least_informed_then_shorter_then_smaller():
    def cand(t_ms, score, b=1, width=2):
        return Candidate(GraphShape(GraphKind.SPECULATIVE, b, width, width - 1, b * width), np.zeros(1, np.int64),
                         np.zeros(1, np.int64), 0.0, 0.0, t_ms, CostState.FRESH, score=score)
    ordinary = 1.0
    ranked = sorted([
        ("fast gain", probe_key(cand(10.0, 3.0), ordinary, 50.0)),
        ("slow gain", probe_key(cand(20.0, 4.0), ordinary, 10.0)),  # (4-1)/20 < (3-1)/10
        ("informed", probe_key(cand(10.0, 3.0, width=3), ordinary, 80.0)),
        ("wider", probe_key(cand(10.0, 3.0, b=2), ordinary, 50.0)),
    ], key=lambda kv: kv[1], reverse=True)
    assert [k for k, _ in ranked] == ["fast gain", "wider", "informed", "slow gain"]
    shorter = probe_key(cand(8.0, 2.6), ordinary, 50.0)  # the same gain per time, shorter
    assert shorter > probe_key(cand(10.0, 3.0), ordinary, 50.0)


def test_forecast_observations_stop_at_the_lanes_frozen_ceiling():
    shape = GraphShape(GraphKind.SPECULATIVE, 1, 4, 3, 4)
    s = make({shape: 10.0, prefill(64): 10.0}, config=SchedulerConfig(speculation=SpeculationMode.ADAPTIVE,
                                                                         draft_capacity=3))
    h = s.admit(spec(64, 3), 0)  # after the prompt's token, two left: ceiling min(D + 1, W, 2) = 2
    Driver(s).run(1)
    plan = s.plan()
    assert plan.device_allocation and plan.lanes.output_rows[0] == 2
    s.commit(plan, 9)
    s.advance_to(s.now_ns + 10 * MS)
    sidecar = np.full(s.sidecar_shape(), 0.9, dtype=np.float32)
    rec = CompletionRecord(h, plan.lanes.epoch[0], 0, (5,), offered=1)
    s.complete_packed_round(9, [rec], ExecutionTiming((10 * MS,)), sidecar)
    forecast = s.requests.speculation.forecast
    weights = forecast.weights[s.requests.row(h)]  # one token left: the request is still live
    assert weights[0] == START_WEIGHT + 1 and list(weights[1:]) == [START_WEIGHT] * 2
    assert s.speculation.forecast_prior.means[1:] == pytest.approx([0.25, 0.125])  # never observed


def test_a_fruitless_probe_search_waits_a_few_completed_frames_before_the_next():
    from helios.scheduler.exploration import PROBE_SEARCH_BACKOFF
    s, _ = low_acceptance(deep_ms=25.0)  # no probe can beat the ordinary choice
    s.exploration.learning.earn(SECOND)
    assert s.plan().reason is SelectionReason.ORDINARY
    assert s.exploration._probe_backoff == PROBE_SEARCH_BACKOFF
    for k, ms in costs().items():  # the deeper widths get cheaper: now a probe could win, but the search waits
        s.costs.entry(k).samples.clear()
        s.costs.observe(k, int(ms * MS), s.now_ns)
    for _ in range(PROBE_SEARCH_BACKOFF):
        plan = s.plan()
        assert plan.reason is SelectionReason.ORDINARY
        step(s, plan, (s._last_fence or 0) + 1)
        s.exploration.learning.earn(SECOND)
    assert s.plan().reason is PROBE

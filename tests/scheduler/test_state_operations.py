"""Prerequisite restores, terminal captures and preemption in the scheduler (SimCore and the
hand-stepped virtual clock): values, ordering, resource ownership and no lost request."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.baselines import make_scheduler
from helios.config import SchedulerConfig, SpeculationMode
from helios.engine.sim_core import SimCore
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import speculative_shapes
from helios.scheduler import FinishReason, Scheduler

from tests.scheduler.conftest import MS, FixedCosts, assert_all_ended, cancel_pick, decode, drain, make, prefill, sim_driver, spec, step
from tests.scheduler.conftest import table_policy

SNAP, REST = GraphShape(GraphKind.SNAPSHOT, 1), GraphShape(GraphKind.RESTORE, 1)
TABLE = {decode(1): 10, decode(4): 14, prefill(64): 30, prefill(64, 4): 60, prefill(256): 80, SNAP: 2, REST: 3}



def test_terminal_capture_holds_the_finish_until_its_snapshot():
    s = make(TABLE)
    h = s.admit(spec(prompt=100, out=3, endpoints=(40,)), 0)
    log, _ = drain(s)
    kinds = [p.shape.kind for p, _ in log if not p.anchor]  # anchor cuts: tests/scheduler/test_anchor_cuts.py
    assert kinds[-1] is GraphKind.SNAPSHOT and kinds.count(GraphKind.SNAPSHOT) == 1
    finishes = [(p.shape.kind, g) for p, out in log for g in out if g.finish is not None]
    assert finishes == [(GraphKind.SNAPSHOT, finishes[0][1])] and finishes[0][1].finish is FinishReason.LENGTH
    snap = log[-1][0]
    # The exact endpoint: prompt and every output but the pending last one.
    assert snap.lanes.context_tokens.tolist() == [100 + 3 - 1]
    assert snap.lanes.prompt_tokens.tolist() == [0] and snap.lanes.output_rows.tolist() == [0]
    assert not s.is_live(h) and s.resources.free_slots == s.resources.total_slots
    assert s.resources.free_pages == s.resources.total_pages


def test_terminal_lane_value_is_terminal_value_plus_aged_urgency():
    policy = table_policy(terminal_value=256.0, terminal_age_price=1.0)
    s = make(TABLE, policy=policy)
    s.admit(spec(prompt=60, out=1, endpoints=(20,)), 0)
    log, _ = drain(s)
    snap = log[-1][0]
    # One capture: sigma = K * T / min(B, k) = 1 * 2 ms. The snapshot was planned at the
    # termination instant, so A = 0 and the lane holds tv + tap * sigma * T, scaled.
    scale = math.exp(-snap.log_scale)
    assert np.isclose(snap.lanes.value[0], (256.0 + 1.0 * 2.0 * (0 + 2.0)) * scale)


def test_capture_without_endpoints_is_an_extra_funded_by_decode():
    # 0.05 x 10 ms per decode: one decode earns 0.5 ms, seven earn 3.5 ms >= the 2 ms snapshot.
    s = make(TABLE)
    s.admit(spec(prompt=60, out=2), 0)
    assert GraphKind.SNAPSHOT not in [p.shape.kind for p, _ in drain(s)[0]]
    s = make(TABLE)
    s.admit(spec(prompt=60, out=8), 0)
    assert [p.shape.kind for p, _ in drain(s)[0]][-1] is GraphKind.SNAPSHOT
    # Unknown snapshot cost: extras are disabled, the anchor (endpoints) stays eligible.
    s = make(TABLE, unmeasured=(SNAP,))
    s.admit(spec(prompt=60, out=8), 0)
    assert GraphKind.SNAPSHOT not in [p.shape.kind for p, _ in drain(s)[0]]
    s = make(TABLE, unmeasured=(SNAP,))
    s.admit(spec(prompt=60, out=2, endpoints=(20,)), 0)
    assert [p.shape.kind for p, _ in drain(s)[0]][-1] is GraphKind.SNAPSHOT
    assert not s.state.earned_ms


def test_no_capture_without_terminal_terms():
    s = make(TABLE, policy=table_policy(terminal_value=0.0, terminal_age_price=0.0))
    s.admit(spec(prompt=60, out=2, endpoints=(20,)), 0)
    assert GraphKind.SNAPSHOT not in [p.shape.kind for p, _ in drain(s)[0]]


def test_restore_is_a_prerequisite_before_the_suffix_prefill():
    s = make(TABLE)
    h = s.admit(spec(prompt=300, out=2, cached_tokens=250, endpoints=(250,)), 0)
    log, _ = drain(s)
    first, second = log[0][0], log[1][0]
    assert first.shape.kind is GraphKind.RESTORE and first.lanes.context_tokens.tolist() == [250]
    assert first.estimated_duration_ns == 3 * MS  # the plan keeps the restore's physical T
    assert second.shape.kind is GraphKind.PREFILL and second.lanes.prompt_start.tolist() == [250]
    prefilled = sum(int(p.lanes.prompt_tokens.sum()) for p, _ in log)
    assert prefilled == 50 and not s.is_live(h)


def test_restore_without_state_graphs_counts_cached_tokens_as_consumed():
    table = {k: v for k, v in TABLE.items() if k.kind not in (GraphKind.SNAPSHOT, GraphKind.RESTORE)}
    s = make(table)
    s.admit(spec(prompt=300, out=2, cached_tokens=250), 0)
    log, _ = drain(s)
    assert log[0][0].shape.kind is GraphKind.PREFILL and log[0][0].lanes.prompt_start.tolist() == [250]


def test_restore_continuation_index_ranks_by_value_per_total_time():
    from helios.scheduler.prerequisites import continuation_index
    assert continuation_index(10.0, 2.0, 8.0) == 2.0
    assert continuation_index(10.0, None, 8.0) == 10.0 and continuation_index(10.0, 2.0, None) == 10.0


def test_baselines_never_hold_captures_or_await_restores():
    sched = make_scheduler("vllm-fcfs", Catalog(TABLE), None, SchedulerConfig(request_slots=4))
    assert not sched.restores_checkpoints()
    sched.seed_costs({sh: [int(ms * MS)] for sh, ms in TABLE.items()}, 0)
    h = sched.admit(spec(prompt=60, out=2, endpoints=(20,)), 0)
    log, _ = drain(sched)
    assert not sched.is_live(h) and all(p.shape.kind not in (GraphKind.SNAPSHOT, GraphKind.RESTORE) for p, _ in log)


# ---- preemption on SimCore -----------------------------------------------------------------

def test_preemption_resumes_with_nothing_lost_on_simcore():
    # Uninterrupted reference: EOS after 12 outputs.
    sched, d = sim_driver(TABLE)
    h = d.submit(range(80), 20, (30,), output_len=12)
    d.run()
    reference = d.requests[h]
    sched, d = sim_driver(TABLE)
    h = d.submit(range(80), 20, (30,), output_len=12)
    for _ in range(5):
        d.step()
    assert sched.request_row(h).output_done >= 1
    sched.preempt(h, d.now())
    done_before = sched.request_row(h).output_done
    kinds = []
    while sched.is_live(h):
        assert d.step()
        kinds.append(d.history[-1].shape.kind)
        row = sched.request_row(h) if sched.is_live(h) else None
        if row is not None and GraphKind.RESTORE not in kinds:
            assert row.output_done == done_before  # never selected while preempted
    got = d.requests[h]
    assert kinds[:2] == [GraphKind.SNAPSHOT, GraphKind.RESTORE]
    assert len(got.tokens) == len(reference.tokens) == 12 and got.finish is reference.finish is FinishReason.EOS
    assert sched.resources.free_slots == 2 and sched.resources.free_pages == sched.resources.total_pages


# ---- invariants under random admission, cancellation and preemption ---------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["admit", "restore", "cancel", "preempt", "step"]),
                          st.integers(0, 7), st.integers(1, 40)), min_size=1, max_size=40),
       st.integers(0, 3))
def test_no_leaked_slots_pages_or_lost_requests(ops, seed):
    sched, d = sim_driver(TABLE, seed, slots=3)
    handles = []
    for op, pick, n in ops:
        if op in ("admit", "restore"):
            cached = min(n, 60) if op == "restore" else 0
            handles.append(d.submit(range(70), 1 + n % 9, (30,), output_len=n % 7 + 1) if not cached else
                           _submit_cached(sched, d, cached, n))
        elif op == "cancel":
            cancel_pick(d, handles, pick)
        elif op == "preempt" and handles:
            h = handles[pick % len(handles)]
            row = sched.request_row(h) if sched.is_live(h) else None
            if row is not None and row.phase.name == "DECODE" and row.slot is not None and h not in sched.state.captures:
                sched.preempt(h, d.now())
        else:
            d.step()
    d.run()
    assert_all_ended(sched, d, handles, slots=3)
    assert not sched.state.captures and not sched.state.restoring and not sched.state.earned_ms


def _submit_cached(sched, d, cached, n):
    """A request admitted with a checkpoint of `cached` prompt tokens (SimCore has no store)."""
    from helios.scheduler import RequestSpec
    h = sched.admit(RequestSpec(70, 1 + n % 9, cached_tokens=cached, endpoints=(cached,)), d.now())
    d.core.attach(h, range(70), output_len=n % 7 + 1)
    d.loop.attached(h)
    from helios.runtime.driver import DriverRequest
    d.requests[h] = DriverRequest(tuple(range(70)), d.now())
    return h


# ---- restore -> decode lookahead ----------------------------------------------------------------
def _preempted_with_running_decoders(restore_ms: float, table: dict = TABLE, **config):
    """Three running decoders and one preempted decoder whose snapshot completed: the next plan
    chooses between decoding the three now and restoring the fourth to share a decode batch."""
    s = make({**table, REST: restore_ms}, config=SchedulerConfig(request_slots=4, **config))
    handles = [s.admit(spec(prompt=64, out=40), 0) for _ in range(4)]
    fence = 0
    while any(s.request_row(h).output_done == 0 for h in handles):
        fence += 1
        step(s, s.plan(), fence)
    s.preempt(handles[0], s.now_ns)
    while s.state.captures:  # the snapshot (and any decode frames before it)
        fence += 1
        step(s, s.plan(), fence)
    assert handles[0] in s.state.restoring
    return s


def test_restore_joins_a_shared_decode_batch_only_with_enough_value_per_time():
    """The spec's sweep for a (restore, decode) pair: restoring a preempted decoder so that it
    shares the following decode batch wins while the restore is cheap, and loses once its cost
    makes the whole sequence's value per time worse than decoding the running three now. The
    winner switches once along the sweep, and a restore plan keeps its own physical T."""
    kinds = []
    for restore_ms in np.geomspace(0.05, 400.0, 16):
        s = _preempted_with_running_decoders(float(restore_ms))
        p = s.plan()
        kinds.append(p.shape.kind)
        if p.shape.kind is GraphKind.RESTORE:
            assert p.estimated_duration_ns == int(restore_ms * MS)  # lookahead never enters timing
    assert kinds[0] is GraphKind.RESTORE and kinds[-1] is GraphKind.DECODE
    switch = kinds.index(GraphKind.DECODE)
    assert all(k is GraphKind.DECODE for k in kinds[switch:])


def test_under_speculation_a_cheap_restore_still_joins_the_next_round():
    """With speculation loaded, width-one programs replace decode: a preempted decoder's restore is
    valued by the round it joins. Valued by the (absent) decode graphs it was worth nothing and
    waited until no stream was left to decode."""
    shapes = speculative_shapes(4, (1, 2), 8, ragged=False)
    table = {**{sh: 10 + 2 * sh.target_capacity for sh in shapes}, prefill(64): 30, prefill(64, 4): 60,
             prefill(256): 80, SNAP: 2}
    s = _preempted_with_running_decoders(0.05, table, speculation=SpeculationMode.ADAPTIVE, copy_proposals=True)
    assert s.plan().shape.kind is GraphKind.RESTORE

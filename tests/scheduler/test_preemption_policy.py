"""The automatic preemption policy (helios/scheduler/preemption.py) on SimCore, stepped by hand
through the synchronous driver: waiting requests get a turn, the preempted ones finish with the
tokens of an uninterrupted run, nothing thrashes, leaks, starves or is lost."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.baselines import make_scheduler
from helios.config import PolicyConfig, PreemptionConfig, PreemptionPolicy, SchedulerConfig
from helios.engine.echo_core import EchoSimCore
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind
from helios.prepare import Capacities
from helios.runtime.driver import SyncDriver
from helios.scheduler import FinishReason, Scheduler

from tests.scheduler.conftest import MS, FixedCosts, assert_whole_outputs, cancel_pick
from tests.scheduler.test_state_operations import TABLE

ON = PreemptionConfig(PreemptionPolicy.PRICE, quantum_ms=20.0)
NORMAL = (FinishReason.EOS, FinishReason.LENGTH)  # output_len = max_tokens: the length limit
PLAIN = {k: v for k, v in TABLE.items() if k.kind not in (GraphKind.SNAPSHOT, GraphKind.RESTORE)}


class Recorder:
    """Wraps a scheduler's preempt_due and commit: when each request got its slot, and every
    automatic preemption with its time (an independent check of the quantum)."""

    def __init__(self, sched: Scheduler):
        self.since: dict[int, int] = {}
        self.preempted: list[tuple[int, int, int]] = []  # (handle, now, when it got its slot)
        due, commit = sched.preempt_due, sched.commit

        def preempt_due(now):
            handles = due(now)
            self.preempted += [(h, now, self.since[h]) for h in handles]
            return handles

        def record_commit(plan, fence):
            commit(plan, fence)
            for lane in plan.lanes:
                if lane.slot is None and plan.shape.kind is not GraphKind.SNAPSHOT:
                    self.since[lane.handle] = sched.now_ns
        sched.preempt_due, sched.commit = preempt_due, record_commit


def echo_driver(preemption=ON, slots=2, table=TABLE, kv_pages=4096, scheduler=None, fraction=0.05):
    """EchoSimCore over `table` (tokens echo each prompt, so they do not depend on the schedule),
    a scheduler with `preemption`, and a driver on a clock that moves 1 ms per reading."""
    catalog = Catalog(table)
    core = EchoSimCore(Capacities(slots, (64,)), request_slots=slots, max_context=8192, pace=0.0)
    core.catalog, core.cost_model = catalog, FixedCosts(table)
    config = SchedulerConfig(request_slots=slots, kv_pages=kv_pages, preemption=preemption,
                             checkpoint_extra_work_fraction=fraction)
    if scheduler is None:
        sched = Scheduler(catalog, PolicyConfig(), config)
    else:
        sched = make_scheduler(scheduler, catalog, PolicyConfig(), config)
    sched.seed_costs({sh: [int(ms * MS)] for sh, ms in table.items()}, 0)
    clock = itertools.count(0, MS)
    recorder = Recorder(sched) if sched.preempts else None
    return sched, SyncDriver(sched, core, clock=lambda: next(clock)), recorder


def prompt(i, n=60):
    return [32 + (7 * i + k) % 90 for k in range(n)]


def longs_then_short(preemption=ON, long_tokens=(200, 200), warm=30, **kw):
    """Long generations fill every slot; after `warm` steps a 16-token request arrives."""
    sched, d, rec = echo_driver(preemption, **kw)
    longs = [d.submit(prompt(i), n, output_len=n) for i, n in enumerate(long_tokens)]
    for _ in range(warm):
        d.step()
    short = d.submit(prompt(9, 30), 16, output_len=16)
    return sched, d, rec, longs, short


def finish(d, handles):
    d.run()
    return {h: (tuple(d.requests[h].tokens), d.requests[h].finish) for h in handles}


def assert_nothing_held(sched, slots=2):
    assert sched.resources.free_slots == slots and sched.resources.free_pages == sched.resources.total_pages
    assert not sched.state.captures and not sched.state.restoring and not len(sched.requests)


def test_short_request_starts_long_before_long_generations_finish():
    sched, d, rec, longs, short = longs_then_short()
    while d.requests[short].first_token_ns is None:
        assert d.step()
    progress = [sched.request_row(h).output_done for h in longs]
    assert rec.preempted and all(p < 150 for p in progress)  # most of each long output is still ahead
    finish(d, longs + [short])
    # Without the policy the short request's first token waits for a long one to finish.
    _, off, _, off_longs, off_short = longs_then_short(PreemptionConfig())
    finish(off, off_longs + [off_short])
    first_long_end = min(off.requests[h].finished_ns for h in off_longs)
    assert off.requests[off_short].first_token_ns > first_long_end
    assert d.requests[short].first_token_ns < first_long_end


def test_preempted_generations_finish_with_the_tokens_of_an_uninterrupted_run():
    sched, d, rec, longs, short = longs_then_short()
    got = finish(d, longs + [short])
    _, off, _, off_longs, off_short = longs_then_short(PreemptionConfig())
    want = finish(off, off_longs + [off_short])
    assert {h for h, *_ in rec.preempted} & set(longs)
    assert list(got.values()) == list(want.values())
    assert [len(t) for t, _ in got.values()] == [200, 200, 16]
    assert all(f in NORMAL for _, f in got.values())
    restored = [h for p in d.history if p.shape.kind is GraphKind.RESTORE for h in p.handles]
    assert sorted(restored) == sorted(h for h, *_ in rec.preempted)  # each preemption came back once
    assert_nothing_held(sched)


def test_preemption_with_anchor_cuts_and_terminal_captures_keeps_every_token():
    # Conversations: endpoints, and a fraction that funds anchor cuts on these short prompts.
    def run(preemption):
        sched, d, rec = echo_driver(preemption, fraction=0.9)
        longs = [d.submit(prompt(i), 200, (20, 40), output_len=200) for i in range(2)]
        for _ in range(30):
            d.step()
        short = d.submit(prompt(9, 30), 16, (10,), output_len=16)
        return sched, d, rec, finish(d, longs + [short])

    sched, d, rec, got = run(ON)
    _, off, _, want = run(PreemptionConfig())
    anchors = [p for p in d.history if p.shape.kind is GraphKind.SNAPSHOT and p.anchor]
    assert rec.preempted and anchors  # both mechanisms acted in the same run
    assert list(got.values()) == list(want.values())
    assert_nothing_held(sched)


def test_the_freed_slot_goes_to_the_waiter_before_the_victim_restores():
    sched, d, rec, longs, short = longs_then_short()
    while not rec.preempted:
        assert d.step()
    victim = rec.preempted[0][0]
    assert sched.state.held == {victim: short}
    kinds = []
    while sched.request_row(short).slot is None:
        assert d.step()
        kinds.append((d.history[-1].shape.kind, d.history[-1].handles))
    assert (GraphKind.RESTORE, (victim,)) not in kinds and kinds[-1][0] is GraphKind.PREFILL
    d.step()
    assert not sched.state.held  # the waiter started: the victim's restore competes again
    finish(d, longs + [short])
    assert_nothing_held(sched)


def test_victim_has_the_most_remaining_output():
    sched, d, rec, longs, short = longs_then_short(long_tokens=(120, 300))
    while not rec.preempted:
        assert d.step()
    assert rec.preempted[0][0] == longs[1]
    finish(d, longs + [short])
    assert_nothing_held(sched)


def test_pages_exhausted_by_resident_decoders_also_preempt():
    # Four slots, but two 200-token extents take all 36 pages: the short request needs 7.
    sched, d, rec, longs, short = longs_then_short(slots=4, kv_pages=36)
    assert sched.resources.free_slots == 2
    while d.requests[short].first_token_ns is None:
        assert d.step()
    assert rec.preempted and sched.request_row(longs[0]).output_done < 150
    finish(d, longs + [short])
    assert_nothing_held(sched, slots=4)


def test_no_request_is_preempted_again_before_its_quantum():
    quantum = PreemptionConfig(PreemptionPolicy.PRICE, price_ratio=1.0, quantum_ms=40.0)
    sched, d, rec = echo_driver(quantum)
    handles = [d.submit(prompt(i), 200, output_len=200) for i in range(2)]
    for i in range(12):  # a stream of arrivals keeps every slot contended
        handles.append(d.submit(prompt(i + 2), 60, output_len=60))
        for _ in range(25):
            d.step()
    finish(d, handles)
    by_handle = {}
    for h, now, since in rec.preempted:
        by_handle[h] = by_handle.get(h, 0) + 1
        assert now - since >= 40 * MS  # resident for its whole quantum first
    assert max(by_handle.values()) >= 2  # some request was preempted again after its restore
    assert all(d.requests[h].finish in NORMAL for h in handles)
    assert_nothing_held(sched)


def test_a_preempted_request_gets_back_in_while_arrivals_continue():
    """No starvation: short requests keep arriving long after the long ones were preempted, and
    the long ones still finish before the arrivals stop."""
    sched, d, rec = echo_driver(PreemptionConfig(PreemptionPolicy.PRICE, quantum_ms=100.0))
    longs = [d.submit(prompt(i), 200, output_len=200) for i in range(2)]
    shorts = []
    for i in range(60):  # one every 20 steps (~60 ms): a short one takes a slot for ~17 steps
        shorts.append(d.submit(prompt(i + 2, 30), 16, output_len=16))
        for _ in range(20):
            d.step()
    last_arrival = d.requests[shorts[-1]].admitted_ns
    assert sorted(h for h, *_ in rec.preempted).count(longs[0]) >= 3  # preempted again and again
    assert all(d.requests[h].finished_ns is not None and d.requests[h].finished_ns < last_arrival for h in longs)
    finish(d, longs + shorts)
    assert_nothing_held(sched)


@pytest.mark.parametrize("when", ["retiring", "awaiting_restore"])
def test_cancel_while_preempted_loses_nothing(when):
    sched, d, rec, longs, short = longs_then_short()
    while not rec.preempted:  # one frame at a time, stopping with the first one after preemption in flight
        assert d.commit() is not None
        if not rec.preempted:
            d.finish_frames()
    victim = rec.preempted[0][0]
    assert victim in sched.state.captures and d.history[-1].shape.kind is GraphKind.SNAPSHOT
    if when == "awaiting_restore":
        while victim not in sched.state.restoring:
            d.finish_frames()
            assert d.step()
    d.cancel(victim)  # retiring: its snapshot is in flight
    d.finish_frames()
    got = finish(d, longs + [short])
    assert got[victim][1] is FinishReason.CANCELLED
    assert all(got[h][1] in NORMAL for h in longs + [short] if h != victim)
    assert_nothing_held(sched)


def test_without_state_graphs_or_with_a_baseline_nothing_is_preempted():
    for kw in (dict(table=PLAIN), dict(scheduler="vllm-fcfs")):
        sched, d, rec, longs, short = longs_then_short(**kw)
        assert not sched.preempts and rec is None
        finish(d, longs + [short])
        assert d.requests[short].first_token_ns > min(d.requests[h].finished_ns for h in longs)
    # With the policy off, the plans are exactly those of a scheduler that never heard of it.
    runs = []
    for preemption in (PreemptionConfig(), PreemptionConfig(PreemptionPolicy.OFF, quantum_ms=1.0)):
        sched, d, _, longs, short = longs_then_short(preemption)
        finish(d, longs + [short])
        runs.append([(p.shape, p.handles) for p in d.history])
    assert runs[0] == runs[1]


def test_preemption_config_is_validated():
    assert PreemptionConfig().policy is PreemptionPolicy.OFF and SchedulerConfig().preemption == PreemptionConfig()
    assert PreemptionConfig("price").policy is PreemptionPolicy.PRICE
    for bad in (dict(policy="sometimes"), dict(price_ratio=0.5), dict(quantum_ms=-1.0),
                dict(quantum_ms=float("inf")), dict(max_retiring=0), dict(max_retiring=True)):
        with pytest.raises(ConfigError):
            PreemptionConfig(**bad)
    with pytest.raises(ConfigError):
        SchedulerConfig(preemption="price")


# ---- invariants under random arrivals, cancellations and completions -------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["admit", "admit", "cancel", "step", "step", "step"]),
                          st.integers(0, 7), st.integers(1, 60)), min_size=1, max_size=60),
       st.sampled_from([1.0, 4.0]), st.sampled_from([0.0, 5.0, 20.0]), st.sampled_from([1, 2]), st.booleans())
def test_no_lost_request_leak_or_starvation_with_preemption(ops, ratio, quantum, retiring, conversations):
    # `conversations`: prompts carry message endpoints and a large extra-work fraction funds
    # anchor cuts, so preemption meets anchor copies and terminal captures too.
    config = PreemptionConfig(PreemptionPolicy.PRICE, price_ratio=ratio, quantum_ms=quantum, max_retiring=retiring)
    sched, d, rec = echo_driver(config, slots=2, fraction=0.9 if conversations else 0.05)
    handles, want = [], {}
    for op, pick, n in ops:
        if op == "admit":
            out = 1 + n % 40
            ends = (4, 8 + n // 2) if conversations else ()
            handles.append(d.submit(prompt(n, 10 + n), out, ends, output_len=out))
            want[handles[-1]] = out
        elif op == "cancel":
            cancel_pick(d, handles, pick)
        else:
            d.step()
    d.run()  # raises StalledDriver if anything could never run again
    assert_whole_outputs(d, handles, want)
    assert_nothing_held(sched)
    assert not d.core._requests  # every request was detached from the core

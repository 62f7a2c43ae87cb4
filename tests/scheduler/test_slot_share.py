"""A client's share of the running slots (helios/scheduler/slot_share.py), stepped by hand: a greedy
client's requests hold every slot and another client's request arrives (issue 42's greedy-client case)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.config import PolicyConfig, PreemptionConfig, PreemptionPolicy, SchedulerConfig
from helios.engine.echo_core import EchoSimCore
from helios.graphs import Catalog, GraphKind
from helios.prepare import Capacities
from helios.runtime.driver import SyncDriver
from helios.scheduler import FinishReason, Scheduler
from helios.scheduler.slot_share import SlotShares

from tests.scheduler.conftest import MS, FixedCosts, assert_whole_outputs, cancel_pick
from tests.scheduler.test_state_operations import TABLE

PRICE = PreemptionConfig(PreemptionPolicy.PRICE, quantum_ms=20.0)
PLAIN = {k: v for k, v in TABLE.items() if k.kind not in (GraphKind.SNAPSHOT, GraphKind.RESTORE)}
SLOTS = 4


def driver(slot_share=True, preemption=PRICE, table=TABLE, slots=SLOTS):
    """EchoSimCore over `table` (each request echoes its prompt, so its tokens do not depend on the
    schedule) on a clock that moves 1 ms per reading."""
    catalog = Catalog(table)
    core = EchoSimCore(Capacities(slots, (64,)), request_slots=slots, max_context=8192, pace=0.0)
    core.catalog, core.cost_model = catalog, FixedCosts(table)
    config = SchedulerConfig(request_slots=slots, preemption=preemption, slot_share=slot_share)
    sched = Scheduler(catalog, PolicyConfig(), config)
    sched.seed_costs({sh: [int(ms * MS)] for sh, ms in table.items()}, 0)
    clock = itertools.count(0, MS)
    return sched, SyncDriver(sched, core, clock=lambda: next(clock))


def prompt(i, n=60):
    return [32 + (7 * i + k) % 90 for k in range(n)]


def holders(sched, d, handles) -> list[int]:
    return [h for h in handles if sched.is_live(h) and sched.request_row(h).slot is not None]


def hog_fills_every_slot(**kw):
    """Ten 60-token requests with 40 tokens each from client "hog": four run, six wait."""
    sched, d = driver(**kw)
    hog = [d.submit(prompt(i), 40, client="hog", output_len=40) for i in range(10)]
    for _ in range(40):
        d.step()
        if len(holders(sched, d, hog)) == SLOTS and all(sched.request_row(h).output_done > 0
                                                         for h in holders(sched, d, hog)):
            break
    assert len(holders(sched, d, hog)) == SLOTS  # the hog alone fills every slot
    return sched, d, hog


def frames_until_slot(sched, d, handle, limit=200) -> int:
    """Frames committed after `handle` arrived until one gave it a slot (that frame included)."""
    for n in range(1, limit):
        d.step()
        if sched.request_row(handle).slot is not None:
            return n
    raise AssertionError(f"request {handle} got no slot in {limit} frames")


def test_canary_gets_a_slot_within_one_frame_while_the_hog_holds_every_slot():
    sched, d, hog = hog_fills_every_slot()
    canary = d.submit(prompt(50, 20), 8, client="canary", output_len=8)
    # One frame retires a hog row (its snapshot); the next gives the canary the freed slot.
    assert frames_until_slot(sched, d, canary) <= 2
    assert any(p.shape.kind is GraphKind.SNAPSHOT for p in d.history[-2:])
    assert len(holders(sched, d, hog)) == SLOTS - 1
    d.run()
    # The preempted hog row resumed with the tokens of an uninterrupted run (the share off).
    _, off, off_hog = hog_fills_every_slot(slot_share=False)
    off_canary = off.submit(prompt(50, 20), 8, client="canary", output_len=8)
    off.run()
    assert [d.requests[h].tokens for h in hog + [canary]] == [off.requests[h].tokens for h in off_hog + [off_canary]]
    assert all(len(d.requests[h].tokens) == 40 for h in hog)


def test_without_the_share_the_canary_waits_behind_the_hogs_waiters():
    sched, d, hog = hog_fills_every_slot(slot_share=False)
    canary = d.submit(prompt(50, 20), 8, client="canary", output_len=8)
    waited = frames_until_slot(sched, d, canary)
    assert waited > 10  # a hog row had to end first (price preemption needs a ratio and a quantum)
    on_sched, on, _ = hog_fills_every_slot()
    assert waited > frames_until_slot(on_sched, on, on.submit(prompt(50, 20), 8, client="canary", output_len=8))


def test_without_preemption_the_first_free_slot_goes_to_the_poorer_client():
    # Slot admission alone: the hog's six waiters, which have waited longer and are priced higher,
    # are held back while the canary (holding no slot) waits.
    sched, d, hog = hog_fills_every_slot(preemption=PreemptionConfig(), table=PLAIN)
    canary = d.submit(prompt(50, 20), 8, client="canary", output_len=8)
    waiting_hog = [h for h in hog if sched.request_row(h).slot is None and sched.request_row(h).output_done == 0]
    while sched.request_row(canary).slot is None:
        d.step()
        started = [h for h in waiting_hog if sched.request_row(h).slot is not None]
        assert not started or sched.request_row(canary).slot is not None
    # The hog's four rows ended together: the four free slots were water-filled, one to the canary
    # (its one waiter) and three to the hog, in one prefill.
    assert len(holders(sched, d, hog)) == 3 and sched.resources.free_slots == 0
    # Off, a hog waiter takes the first free slot.
    off_sched, off, off_hog = hog_fills_every_slot(slot_share=False, preemption=PreemptionConfig(), table=PLAIN)
    off_canary = off.submit(prompt(50, 20), 8, client="canary", output_len=8)
    off_waiting = [h for h in off_hog if off_sched.request_row(h).slot is None]
    while off_sched.request_row(off_canary).slot is None:
        off.step()
        if any(off_sched.is_live(h) and off_sched.request_row(h).slot is not None for h in off_waiting):
            break
    assert off_sched.request_row(off_canary).slot is None


def test_a_lone_client_still_fills_every_slot():
    runs = []
    for on in (True, False):
        sched, d = driver(slot_share=on)
        solo = [d.submit(prompt(i), 30 + i, client="bench", output_len=30 + i) for i in range(16)]
        while any(d.requests[h].finish is None for h in solo):
            d.step()
            if len([h for h in solo if sched.is_live(h)]) >= SLOTS and d.history[-1].shape.kind is GraphKind.DECODE:
                assert len(holders(sched, d, solo)) == SLOTS  # work-conserving: no slot idles
        runs.append([(p.shape, tuple(p.handles)) for p in d.history])
    assert runs[0] == runs[1]  # one client: the same decisions as without the share


def test_two_clients_within_their_shares_decide_as_without_the_share():
    runs = []
    for on in (True, False):
        sched, d = driver(slot_share=on)
        hs = [d.submit(prompt(i), 12 + i, client="ab"[i % 2], output_len=12 + i) for i in range(4)]
        d.run()
        runs.append(([(p.shape, tuple(p.handles)) for p in d.history], [d.requests[h].tokens for h in hs]))
    assert runs[0] == runs[1]


def test_each_of_two_clients_gets_half_the_slots_while_both_wait():
    sched, d, hog = hog_fills_every_slot()
    canaries = [d.submit(prompt(60 + i, 20), 30, client="canary", output_len=30) for i in range(4)]
    for _ in range(12):
        d.step()
    assert len(holders(sched, d, canaries)) == 2 and len(holders(sched, d, hog)) == 2


def test_with_more_clients_than_slots_each_newcomer_takes_one_from_the_richest():
    # Max-min by count: four newcomers of four other clients take slots from the hog while it would
    # still hold at least as many as the taker afterwards (3 >= 1, 2 >= 1, 1 >= 1; not 0 >= 1).
    sched, d, hog = hog_fills_every_slot()
    others = [d.submit(prompt(70 + i, 20), 30, client=f"c{i}", output_len=30) for i in range(4)]
    for _ in range(12):
        d.step()
    assert len(holders(sched, d, hog)) == 1 and len(holders(sched, d, others)) == 3


def test_clients_one_slot_apart_never_pass_a_slot_back_and_forth():
    # 3 slots, a holds 2 and b holds 1, both with waiters: moving a slot would only swap the two.
    sched, d = driver(slots=3)
    a = [d.submit(prompt(i), 60, client="a", output_len=60) for i in range(2)]
    b = [d.submit(prompt(10 + i), 60, client="b", output_len=60) for i in range(1)]
    for _ in range(10):
        d.step()
    a += [d.submit(prompt(20 + i), 60, client="a", output_len=60) for i in range(2)]
    b += [d.submit(prompt(30 + i), 60, client="b", output_len=60) for i in range(2)]
    seen = len(d.history)
    for _ in range(30):
        d.step()
    assert not any(p.shape.kind is GraphKind.SNAPSHOT for p in d.history[seen:])
    assert sorted((len(holders(sched, d, a)), len(holders(sched, d, b)))) == [1, 2]


def test_free_slots_are_water_filled_by_weight():
    def fill(held, weight, demand, slots):
        shares = SlotShares(np.zeros(0, np.int64), np.zeros(0, np.int64), np.array(held), np.array(weight, float),
                            np.zeros(0, bool))
        return shares._water_fill(np.array(demand), slots).tolist()
    assert fill([4, 0], [1, 1], [6, 1], 1) == [0, 1]  # the newcomer's client first
    assert fill([0, 0], [1, 1], [6, 1], 4) == [3, 1]  # work-conserving: what one leaves, the other takes
    assert fill([2, 2], [1, 1], [3, 3], 1) == [1, 1]  # a tie: both keep a waiter, price decides
    assert fill([0, 0], [2, 1], [9, 9], 3) == [2, 1]  # weight 2 gets two slots for the other's one
    assert fill([1, 0], [1, 1], [0, 5], 2) == [0, 2]  # a client without waiters takes nothing


# ---- invariants with preemption, three clients, cancellations -----------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([0, 6]),
       st.lists(st.tuples(st.sampled_from(["admit", "admit", "cancel", "step", "step", "step"]),
                          st.integers(0, 7), st.integers(1, 60), st.sampled_from("aabc")), min_size=1, max_size=60),
       st.sampled_from([1, 2]), st.booleans())
def test_no_lost_request_or_leaked_slot_or_page_with_shares_and_preemption(greedy, ops, retiring, price):
    # `greedy`: client "a" first opens that many long requests and they run (it holds every slot when
    # "b" arrives, so the share rule retires one of its rows), then random arrivals, cancellations
    # and steps.
    ops = ([("admit", 0, 39 - i, "a") for i in range(greedy)] + [("step", 0, 1, "a")] * 2 * greedy
           + [("admit", 0, 12, "b")] * bool(greedy) + ops)
    preemption = PreemptionConfig(PreemptionPolicy.PRICE if price else PreemptionPolicy.OFF, quantum_ms=5.0,
                                  max_retiring=retiring)
    sched, d = driver(preemption=preemption, table=TABLE if price else PLAIN)
    handles, want = [], {}
    for op, pick, n, client in ops:
        if op == "admit":
            out = 1 + n % 40
            handles.append(d.submit(prompt(n, 10 + n), out, client=client, output_len=out))
            want[handles[-1]] = out
        elif op == "cancel":
            cancel_pick(d, handles, pick)
        else:
            d.step()
    d.run()  # raises StalledDriver if anything could never run again
    assert_whole_outputs(d, handles, want)
    assert sched.resources.free_slots == SLOTS and sched.resources.free_pages == sched.resources.total_pages
    assert not sched.state.captures and not sched.state.restoring and not sched.state.held and not len(sched.requests)
    assert not d.core._requests

"""VTC (Sheng et al., OSDI'24): virtual token counters, counter lift, bounded service gap."""

from __future__ import annotations

import pytest

from helios.baselines import VTCScheduler, make_scheduler
from helios.config import SchedulerConfig
from helios.engine.sim_core import SimCore
from helios.graphs import GraphKind
from helios.scheduler.request_spec import RequestSpec
from helios.sim.loop import Arrival, Simulation

from .support import CATALOG, AffineCost, Stepper, simulate


def vtc(slots: int = 4, **options) -> VTCScheduler:
    return VTCScheduler(CATALOG, config=SchedulerConfig(request_slots=slots), **options)


def test_prompt_charged_at_admission_and_each_decode_token_at_w_q():
    """Rule: c += w_p * prompt tokens when admitted; c += w_q per generated decode token."""
    st = Stepper(vtc(input_weight=1.0, output_weight=2.0))
    st.admit(RequestSpec(300, 5, cached_tokens=20, client="a"))
    plan, _ = st.step()
    assert plan.shape.kind is GraphKind.PREFILL and st.sched.counters["a"] == 280
    plan, _ = st.step()
    assert plan.shape.kind is GraphKind.DECODE and st.sched.counters["a"] == 282
    st.run()
    assert st.sched.counters["a"] == 280 + 2 * 4  # four decode steps after the prefill's token


def test_counter_lift_on_return():
    """Rule (lift): a client returning to the queue gets max(own, min over backlogged clients)."""
    st = Stepper(vtc(slots=1))
    sched = st.sched
    for _ in range(3):
        st.admit(RequestSpec(100, 3, client="heavy"))
    for _ in range(6):  # heavy is served and still has waiting requests
        st.step()
    heavy = sched.counters["heavy"]
    assert heavy > 0 and "heavy" in sched.backlogged()
    st.admit(RequestSpec(50, 2, client="light"))  # a new client: 0 -> lifted
    assert sched.counters["light"] == heavy
    st.admit(RequestSpec(50, 2, client="light"))  # already backlogged: no lift
    assert sched.counters["light"] == heavy
    st.run()
    # A returning client whose own counter is above the backlogged minimum keeps its own.
    sched.counters["light"] = 10_000.0
    sched.counters["heavy"] = 1.0
    st.admit(RequestSpec(100, 3, client="heavy"))
    st.admit(RequestSpec(100, 3, client="heavy"))
    st.admit(RequestSpec(50, 2, client="light"))
    assert sched.counters["light"] == 10_000.0
    # And one below it is raised to the minimum among backlogged clients.
    st.run()
    sched.counters["light"], sched.counters["heavy"] = 0.0, 500.0
    st.admit(RequestSpec(100, 3, client="heavy"))
    st.admit(RequestSpec(100, 3, client="heavy"))
    st.admit(RequestSpec(50, 2, client="light"))
    assert sched.counters["light"] == 500.0


def test_smallest_counter_is_admitted_first():
    """Rule: a new mini batch takes the backlogged client with the smallest counter first."""
    st = Stepper(vtc(slots=1))
    st.admit(RequestSpec(64, 2, client="a"))
    st.admit(RequestSpec(64, 2, client="b"))  # arrives later, but has the smaller counter
    st.sched.counters.update({"a": 100.0, "b": 40.0})
    plan, _ = st.step()
    assert st.sched.requests[plan.handles[0]].spec.client == "b"


def weighted_service_gap(name: str, **options) -> tuple[float, float]:
    """Max |service(heavy) - service(light)| while both are backlogged, and the VTC bound 2U."""
    w_p, w_q = 1.0, 2.0
    heavy = [Arrival(0, RequestSpec(512, 64, client="heavy"), output_len=64, client="heavy")] * 24
    light = [Arrival(1_000_000, RequestSpec(64, 16, client="light"), output_len=16, client="light")] * 24
    config = SchedulerConfig(request_slots=4)
    served = {"heavy": 0.0, "light": 0.0}
    gap = [0.0]
    sched = make_scheduler(name, CATALOG, None, config, **options)
    commit = sched.commit

    def watched(plan, fence):
        commit(plan, fence)
        for lane in plan.lanes:
            spec = sched.requests[lane.handle].spec
            first = lane.prompt_tokens and lane.prompt_start == spec.cached_tokens
            served[spec.client] += w_p * spec.prompt_tokens if first else 0.0
            served[spec.client] += w_q * (plan.shape.kind is GraphKind.DECODE)
        if {"heavy", "light"} <= {sched.requests.specs[r].client for r in sched.waiting()}:
            gap[0] = max(gap[0], abs(served["heavy"] - served["light"]))

    sched.commit = watched
    sim = Simulation(sched, SimCore(CATALOG, AffineCost()))
    sim.add(heavy + light)
    sim.run()
    assert all(log.finish is not None for log in sim.logs.values())
    # U = max(w_p * L_input, w_q * M), M = tokens a full running batch can hold.
    u = max(w_p * 512, w_q * config.request_slots * (512 + 64))
    return gap[0], 2 * u


def test_service_gap_of_backlogged_clients_stays_within_the_vtc_bound():
    """Rule (Theorem: |W_f - W_g| <= 2U for backlogged clients); FCFS on the same trace does not."""
    gap, bound = weighted_service_gap("vtc")
    assert gap <= bound
    fcfs_gap, _ = weighted_service_gap("vllm-fcfs")
    assert fcfs_gap > bound > 4 * gap


@pytest.mark.parametrize("clients", [("a",), ("a", "b", "c")])
def test_counters_track_weighted_service(clients):
    """Rule: without lifts, each counter equals its client's weighted service."""
    arrivals = [Arrival(0, RequestSpec(100 + 10 * i, 5, client=clients[i % len(clients)]), output_len=5)
                for i in range(9)]
    sched, sim = simulate("vtc", arrivals, SchedulerConfig(request_slots=2))
    for c in clients:
        expected = sum(1.0 * (100 + 10 * i) + 2.0 * 4 for i in range(9) if clients[i % len(clients)] == c)
        assert sched.counters[c] >= expected  # equality unless a lift raised it
    if len(clients) == 1:
        assert sched.counters["a"] == expected

"""The class-aware baselines (issue 40), stepped by hand with synthetic requests: vLLM V1's priority
policy, EDF on the first-token deadline under Sarathi's budget, and VTC weighted by tenant."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from helios.baselines import EdfScheduler, VllmPriorityScheduler, VTCScheduler, make_scheduler
from helios.baselines.vllm_priority import preemption_victim
from helios.config import SchedulerConfig
from helios.graphs import GraphKind
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.service_class import ServiceClass

from .support import CATALOG, Stepper, simulate, workload

GOLD = ServiceClass("gold", ttft_ms=50.0, priority=0)
BRONZE = ServiceClass("bronze", ttft_ms=5000.0, priority=5)
BATCH = ServiceClass("batch", deadline_ms=60_000.0, priority=9)


def prefilled(plan) -> list[int]:
    return [l.handle for l in plan.lanes if l.prompt_tokens]


def starts(st: Stepper, steps: int) -> list[int]:
    """Handles in the order their first prompt chunk ran, over `steps` steps."""
    order = []
    for _ in range(steps):
        plan, _ = st.step()
        order += [h for h in prefilled(plan) if h not in order]
    return order


def test_priority_waiting_queue_is_priority_then_arrival():
    """Rule: the waiting heap orders by (priority, arrival): a later urgent request starts first, and
    inside one priority requests start in arrival order (FCFS inside a class)."""
    st = Stepper(VllmPriorityScheduler(CATALOG, config=SchedulerConfig(request_slots=8), token_budget=64,
                                       packed=True))
    low1 = st.admit(RequestSpec(64, 2, service_class=BRONZE))
    low2 = st.admit(RequestSpec(64, 2, service_class=BRONZE))
    high1 = st.admit(RequestSpec(64, 2, service_class=GOLD))
    high2 = st.admit(RequestSpec(64, 2, service_class=GOLD))
    assert starts(st, 6) == [high1, high2, low1, low2]


def test_explicit_priority_overrides_the_class_tier():
    st = Stepper(VllmPriorityScheduler(CATALOG, config=SchedulerConfig(request_slots=8), token_budget=64,
                                       packed=True))
    gold = st.admit(RequestSpec(64, 2, service_class=GOLD))
    urgent = st.admit(RequestSpec(64, 2, service_class=BRONZE, priority=-3))
    plan, _ = st.step()
    assert prefilled(plan) == [urgent] and gold not in prefilled(plan)


def test_priority_running_requests_keep_their_chunks_first():
    """Rule: running (partially prefilled) requests are served before the waiting heap, even when a more
    urgent request arrives meanwhile: V1 does not preempt for a waiting request."""
    st = Stepper(VllmPriorityScheduler(CATALOG, config=SchedulerConfig(request_slots=8), token_budget=100,
                                       packed=True))
    low = st.admit(RequestSpec(300, 2, service_class=BRONZE))
    plan, _ = st.step()
    assert prefilled(plan) == [low]
    high = st.admit(RequestSpec(64, 2, service_class=GOLD))
    plan, _ = st.step()
    lanes = {l.handle: l.prompt_tokens for l in plan.lanes}
    assert lanes[low] == 100 and high not in lanes  # the budget went to the running prefill
    assert preemption_victim([(0, 5, 1), (5, 1, 2), (5, 3, 3)]) == 3  # V1's victim: max (priority, arrival)
    assert preemption_victim([]) is None


def test_priority_head_of_line_blocks_lower_priority():
    """Rule: an urgent waiting request that cannot get a slot blocks every less urgent one."""
    st = Stepper(VllmPriorityScheduler(CATALOG, config=SchedulerConfig(request_slots=1), token_budget=64,
                                       packed=True))
    first = st.admit(RequestSpec(64, 5, service_class=BATCH))
    st.step()
    st.admit(RequestSpec(64, 2, service_class=BRONZE))
    gold = st.admit(RequestSpec(64, 2, service_class=GOLD))
    plan, _ = st.step()
    assert [l.handle for l in plan.lanes] == [first] and plan.shape.kind is GraphKind.DECODE
    st.run()
    # The gold request started as soon as the slot came free.
    starts = [prefilled(p) for p, _ in st.log if prefilled(p)]
    assert starts[1] == [gold]


def test_edf_orders_prompts_by_first_token_deadline():
    """Rule: prompt chunks go by arrival + class first-token target; no target means no deadline (last)."""
    st = Stepper(EdfScheduler(CATALOG, config=SchedulerConfig(request_slots=8), token_budget=64, packed=True))
    none = st.admit(RequestSpec(64, 2))  # default class: no target
    loose = st.admit(RequestSpec(64, 2, service_class=BRONZE))  # deadline 5000 ms
    st.now += 1_000_000_000  # one second later, a tight request: deadline 1050 ms
    st.sched.advance_to(st.now)
    tight = st.admit(RequestSpec(64, 2, service_class=GOLD))
    assert starts(st, 5) == [tight, loose, none]


def test_edf_per_token_target_and_stall_free_budget():
    """A per-token target gives a long prompt a later deadline; every running decode rides each iteration
    and prompts fill what the budget leaves (Sarathi's rule)."""
    per_token = ServiceClass("summ", ttft_per_token_ms=1.0)
    st = Stepper(EdfScheduler(CATALOG, config=SchedulerConfig(request_slots=8), token_budget=128, packed=True))
    d = st.admit(RequestSpec(16, 50, service_class=GOLD))
    st.step()  # d prefilled; now decoding
    long = st.admit(RequestSpec(1000, 2, service_class=per_token))  # deadline now + 1000 ms
    short = st.admit(RequestSpec(100, 2, service_class=per_token))  # deadline now + 100 ms
    plan, _ = st.step()
    lanes = {l.handle: l for l in plan.lanes}
    assert lanes[d].output_rows == 1 and lanes[d].prompt_tokens == 0
    assert lanes[short].prompt_tokens == 100 and lanes[long].prompt_tokens == 127 - 100
    assert sum(l.prompt_tokens for l in plan.lanes) + 1 == 128


def test_edf_blocked_admission_still_serves_residents():
    st = Stepper(EdfScheduler(CATALOG, config=SchedulerConfig(request_slots=2), token_budget=64, packed=True))
    a = st.admit(RequestSpec(200, 3, service_class=BRONZE))  # resident after its first chunk
    b = st.admit(RequestSpec(64, 30, service_class=GOLD))
    st.step()
    st.step()
    c = st.admit(RequestSpec(64, 2, service_class=GOLD))  # no slot left: blocked, earliest deadline
    plan, _ = st.step()
    assert a in prefilled(plan) and c not in [l.handle for l in plan.lanes]


def test_weighted_vtc_charges_by_tenant_weight():
    """Rule (weighted VTC): a tenant's charges are divided by its weight."""
    st = Stepper(VTCScheduler(CATALOG, config=SchedulerConfig(request_slots=4)))
    st.admit(RequestSpec(300, 3, client="heavy", tenant_weight=3.0))
    st.admit(RequestSpec(300, 3, client="light"))
    st.run()
    c = st.sched.counters
    assert c["light"] == 300 + 2 * 2 and c["heavy"] == pytest.approx(300 / 3 + 2 * 2 / 3)


def test_weighted_vtc_serves_backlogged_tenants_by_weight():
    """Two backlogged tenants, weights 3 and 1: the heavy one is admitted about three times as often."""
    arrivals = workload(n=40, clients=("a",), gap_ms=0.0, prompt=(200, 200), output=(4, 4))
    from dataclasses import replace
    arrivals = [replace(a, spec=replace(a.spec, client="w3" if i % 2 else "w1",
                                        tenant_weight=3.0 if i % 2 else 1.0),
                        client="w3" if i % 2 else "w1") for i, a in enumerate(arrivals)]
    sched, sim = simulate("vtc", arrivals, SchedulerConfig(request_slots=2))
    first_half = sorted(sim.logs.values(), key=lambda log: log.publications[0][0])[:16]
    assert sum(log.client == "w3" for log in first_half) >= 11  # ~3/4 of the early starts


def test_new_baselines_drain_a_mixed_workload():
    arrivals = workload(n=30)
    classes = (GOLD, BRONZE, BATCH)
    from dataclasses import replace
    arrivals = [replace(a, spec=replace(a.spec, service_class=classes[i % 3])) for i, a in enumerate(arrivals)]
    for name in ("vllm-priority", "edf"):
        sched, sim = simulate(name, arrivals, SchedulerConfig(request_slots=4), packed=True)
        assert all(log.finish is not None for log in sim.logs.values()), name
        assert sched.resources.free_slots == 4
    assert make_scheduler("edf", CATALOG).name == "edf"


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), picks=st.lists(st.integers(0, 2), min_size=8, max_size=8),
       slots=st.integers(1, 4), name=st.sampled_from(("vllm-priority", "edf")))
def test_class_baselines_lose_nothing_and_leak_nothing(seed, picks, slots, name):
    """Invariant: every request of every class finishes, and every slot and page comes back."""
    from dataclasses import replace

    classes = (GOLD, BRONZE, BATCH)
    arrivals = [replace(a, spec=replace(a.spec, service_class=classes[picks[i]]))
                for i, a in enumerate(workload(n=8, seed=seed, prompt=(8, 600), output=(1, 12)))]
    sched, sim = simulate(name, arrivals, SchedulerConfig(request_slots=slots), packed=True)
    assert len(sim.logs) == 8 and all(log.finish is not None for log in sim.logs.values())
    assert sched.resources.free_slots == slots and sched.resources.free_pages == sched.resources.total_pages

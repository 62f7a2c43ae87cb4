"""vLLM V1-style FCFS and Sarathi-Serve: arrival order, token budgets, decodes first."""

from __future__ import annotations

from collections import defaultdict

import pytest

from helios.baselines import SarathiScheduler, VllmFcfsScheduler, make_scheduler
from helios.config import SchedulerConfig
from helios.graphs import GraphKind
from helios.scheduler.request_spec import RequestSpec

from .support import CATALOG, FCFS_PREFILL, Stepper, simulate, workload


def first_prefill_fence(traces) -> dict[int, int]:
    first = {}
    for t in traces:
        if t.shape.kind.is_prefill:
            for h in t.handles:
                first.setdefault(h, t.fence)
    return first


@pytest.mark.parametrize("name", FCFS_PREFILL)
def test_later_arrival_never_starts_prefill_before_an_earlier_one(name):
    """Rule (FCFS): first prefill chunks start in arrival order, whatever the prompt lengths."""
    arrivals = workload(20, seed=5, gap_ms=2.0, prompt=(8, 3000))  # a backlog of mixed lengths
    sched, sim = simulate(name, arrivals, SchedulerConfig(request_slots=4, kv_pages=2048))
    first = first_prefill_fence(sched.traces)
    order = sorted(first, key=lambda h: (first[h], h))
    assert order == sorted(first) and len(first) == 20


def iterations(traces):
    per = defaultdict(list)
    for t in traces:
        per[t.extra["iteration"]].append(t)
    return per


@pytest.mark.parametrize("name,budget", [("vllm-fcfs", 300), ("vllm-fcfs", 2048), ("sarathi", 128), ("sarathi", 512)])
def test_token_budget_respected_per_iteration(name, budget):
    """Rule: one iteration (decode graph + following prefill graph) uses <= token_budget tokens."""
    sched, sim = simulate(name, workload(20, seed=7, gap_ms=4.0), SchedulerConfig(request_slots=16),
                          token_budget=budget)
    per = iterations(sched.traces)
    assert len(per) >= 20
    for graphs in per.values():
        assert len(graphs) <= 2
        if len(graphs) == 2:  # the decode half comes first
            assert [g.shape.kind for g in graphs] == [GraphKind.DECODE, GraphKind.PREFILL]
        decode = sum(len(g.handles) for g in graphs if g.shape.kind is GraphKind.DECODE)
        prompt = sum(g.extra["prompt_tokens"] for g in graphs if g.shape.kind.is_prefill)
        assert 0 < decode + prompt <= budget
        assert graphs[-1].extra["iteration_tokens"] == decode + prompt


def _check_decodes_first(log):
    for i, (plan, decodes) in enumerate(log):
        if plan.shape.kind is GraphKind.DECODE:
            assert set(plan.handles) == set(decodes)  # every running decode is served
        elif decodes:  # prefill while decodes run: only as the second half of an iteration
            assert log[i - 1][0].shape.kind is GraphKind.DECODE


@pytest.mark.parametrize("cls,budget", [(VllmFcfsScheduler, 512), (SarathiScheduler, 256)])
def test_decodes_never_starved_by_prefill(cls, budget):
    """Rule (decode first / stall-free): a long prompt never delays a running decode by more
    than one chunk, and every decode step serves all running decodes."""
    st = Stepper(cls(CATALOG, token_budget=budget))
    short = [st.admit(RequestSpec(32, 60)) for _ in range(3)]
    for _ in range(3):
        st.step()
    assert {int(st.sched.requests.handle[r]) for r in st.sched.running_decodes()} == set(short)
    st.admit(RequestSpec(5000, 4))
    st.admit(RequestSpec(3000, 4))
    st.run()
    prefills = [p for p, d in st.log if p.shape.kind.is_prefill and d]
    assert len(prefills) >= 8 and all(sum(l.prompt_tokens for l in p.lanes) <= budget for p in prefills)
    _check_decodes_first(st.log)


def test_sarathi_includes_all_decodes_even_beyond_the_budget():
    """Rule (Sarathi stall-free): all ongoing decodes join the iteration even when they alone
    exhaust the chunk budget; the iteration then carries no prefill."""
    st = Stepper(SarathiScheduler(CATALOG, config=SchedulerConfig(request_slots=16), chunk_size=64))
    for _ in range(6):
        st.admit(RequestSpec(4, 30))
    for _ in range(3):
        st.step()
    assert len(st.sched.running_decodes()) == 6
    st.sched.token_budget = 4  # the decodes alone now exceed the chunk budget
    st.admit(RequestSpec(200, 2))
    for _ in range(5):
        plan, _ = st.step()
        assert plan.shape.kind is GraphKind.DECODE and len(plan.handles) == 6
    _check_decodes_first(st.log)


def test_vllm_running_cap_follows_the_budget():
    """Rule (vLLM V1): max_num_seqs <= max_num_batched_tokens."""
    assert VllmFcfsScheduler(CATALOG, token_budget=3).max_running == 3
    assert make_scheduler("vllm-fcfs", CATALOG).max_running == 16
    assert make_scheduler("vllm-fcfs", CATALOG).max_num_batched_tokens == 2048
    assert make_scheduler("sarathi", CATALOG).chunk_size == 512


@pytest.mark.parametrize("cls", [VllmFcfsScheduler, SarathiScheduler])
def test_graphs_are_padded_to_the_smallest_fitting_capacity(cls):
    """Rule: decode runs the smallest bucket >= n; prefill the least padded (B, C) holding its rows."""
    st = Stepper(cls(CATALOG, config=SchedulerConfig(request_slots=16)))
    for i, arrival in enumerate(workload(16, seed=11, prompt=(8, 700))):
        st.admit(arrival.spec)
    st.run()
    assert {p.shape.kind for p, _ in st.log} == {GraphKind.DECODE, GraphKind.PREFILL}
    for plan, _ in st.log:
        n = len(plan.lanes)
        widest = max(l.prompt_tokens for l in plan.lanes)
        fits = [s for s in CATALOG.of_kind(plan.shape.kind) if s.batch_capacity >= n and s.token_capacity >= widest]
        assert plan.shape == min(fits, key=lambda s: (s.target_capacity, s.token_capacity, s.batch_capacity))

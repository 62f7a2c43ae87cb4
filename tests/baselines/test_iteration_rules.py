"""vLLM and Sarathi-Serve iterations: a batch fixed at its start, run as one packed forward.

vLLM V1 (`Scheduler.schedule`, vllm/v1/core/sched/scheduler.py) and Sarathi-Serve
(`SarathiScheduler._schedule`, sarathi/core/scheduler/sarathi_scheduler.py) both build one batch per
iteration and run it as one varlen forward over the real tokens; only decode-only batches replay a
captured (padded) CUDA graph.
"""

from __future__ import annotations

import pytest

from helios.baselines import SarathiScheduler, VllmFcfsScheduler
from helios.config import SchedulerConfig
from helios.errors import ConfigError
from helios.graphs import GraphKind
from helios.scheduler.request_spec import RequestSpec

from .support import CATALOG, Stepper, simulate, workload

BOTH = (VllmFcfsScheduler, SarathiScheduler)
CONFIG = SchedulerConfig(request_slots=16)


@pytest.mark.parametrize("name,budget", [("vllm-fcfs", 300), ("vllm-fcfs", 2048), ("sarathi", 128),
                                         ("sarathi", 512)])
def test_packed_iteration_is_one_forward_within_the_budget(name, budget):
    """Rule (one forward per iteration): every iteration is ONE plan; one with prompt chunks is a packed
    forward of decodes plus chunks within the budget, a decode-only one the smallest captured decode graph."""
    sched, sim = simulate(name, workload(20, seed=7, gap_ms=4.0), CONFIG, token_budget=budget, packed=True)
    iterations = [t.extra["iteration"] for t in sched.traces]
    assert iterations == list(range(1, len(sched.traces) + 1))
    kinds = {t.shape.kind for t in sched.traces}
    assert kinds == {GraphKind.PACKED, GraphKind.DECODE}
    for t in sched.traces:
        if t.shape.kind is GraphKind.DECODE:
            n = len(t.handles)
            assert t.shape.batch_capacity == min(s.batch_capacity for s in CATALOG.of_kind(GraphKind.DECODE)
                                                 if s.batch_capacity >= n)
        else:
            assert t.extra["prompt_tokens"] > 0 and t.extra["iteration_tokens"] <= budget
    assert len(sim.logs) == 20 and all(r.finish is not None for r in sim.logs.values())


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("packed", [True, False])
def test_batch_is_fixed_when_the_iteration_starts(cls, packed):
    """Rule (fixed batch): a request arriving while an iteration runs never joins it; its first chunk
    goes into the next iteration, together with that iteration's decodes."""
    st = Stepper(cls(CATALOG, config=CONFIG, packed=packed))
    decoder = st.admit(RequestSpec(32, 50))
    st.step()  # its prefill
    plan, fence = st.dispatch()  # an iteration of one decode starts ...
    assert plan.shape.kind is GraphKind.DECODE and plan.handles == (decoder,)
    late = st.admit(RequestSpec(200, 4))  # ... and a request arrives while it runs
    st.finish(plan, fence)
    plan, _ = st.step()
    assert decoder in plan.handles  # a new iteration: the decode comes with (or before) the chunk
    if packed:
        assert plan.shape.kind is GraphKind.PACKED and set(plan.handles) == {decoder, late}
    else:
        assert plan.shape.kind is GraphKind.DECODE
        follow, _ = st.step()
        assert follow.shape.kind is GraphKind.PREFILL and follow.handles == (late,)


@pytest.mark.parametrize("packed", [True, False])
def test_sarathi_budget_starts_from_zero_after_the_device_idled(packed):
    """Rule (Sarathi budget per iteration): the decode count of an iteration that ended before the
    device went idle is not carried into the next iteration's chunk budget."""
    st = Stepper(SarathiScheduler(CATALOG, config=CONFIG, chunk_size=128, packed=packed))
    for _ in range(3):
        st.admit(RequestSpec(20, 2))
    st.run()  # prefill, then one decode iteration of three rows that finishes them all; idle
    assert st.log[-1][0].shape.kind is GraphKind.DECODE and len(st.log[-1][0].lanes) == 3
    st.admit(RequestSpec(500, 2))
    plan, _ = st.step()
    assert [l.prompt_tokens for l in plan.lanes] == [128]


def test_vllm_prompts_per_step_limited_by_budget_and_seqs_not_by_prepared_shapes():
    """Rule (vLLM packs prompts): a step takes every waiting prompt that fits the token budget and
    max_num_seqs; no B x C prefill envelope limits it (the catalog allows 8 rows only at C = 64)."""
    st = Stepper(VllmFcfsScheduler(CATALOG, config=CONFIG, packed=True))
    for _ in range(10):
        st.admit(RequestSpec(200, 4))
    plan, _ = st.step()
    assert plan.shape.kind is GraphKind.PACKED
    assert [l.prompt_tokens for l in plan.lanes] == [200] * 10
    mapped = Stepper(VllmFcfsScheduler(CATALOG, config=CONFIG))
    for _ in range(10):
        mapped.admit(RequestSpec(200, 4))
    plan, _ = mapped.step()
    assert plan.shape.batch_capacity * plan.shape.token_capacity <= 1024  # the prepared-graph mapping


def test_packed_must_be_a_bool():
    with pytest.raises(ConfigError):
        VllmFcfsScheduler(CATALOG, packed="yes")

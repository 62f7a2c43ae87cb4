"""Every scheduler in the registry is a drop-in protocol implementation."""

from __future__ import annotations

import pickle

import pytest

from helios.baselines import SCHEDULERS, make_scheduler
from helios.config import SchedulerConfig
from helios.errors import ConfigError, InvalidCompletion, StalePlan
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler import Scheduler
from helios.scheduler.plan import CompletionRecord, ExecutionTiming
from helios.scheduler.request_spec import RequestSpec

from .support import ALL, BASELINES, CATALOG, Stepper, records, simulate, timing, workload


def test_registry_names_and_unknown_name():
    """Rule: the registry holds exactly these names; an unknown one lists the valid names."""
    assert list(SCHEDULERS) == ["helios", "vllm-fcfs", "sarathi", "vtc", "direct", "vllm-priority", "edf"]
    with pytest.raises(ValueError) as err:
        make_scheduler("fifo", CATALOG)
    for name in SCHEDULERS:
        assert name in str(err.value)


@pytest.mark.parametrize("name", ALL)
def test_drop_in_shape(name):
    """Rule: same constructor shape and the attributes the simulator and server read."""
    sched = make_scheduler(name, CATALOG, None, SchedulerConfig(request_slots=8))
    assert isinstance(sched, Scheduler)
    for attr in ("stats", "traces", "requests", "resources", "queue", "costs", "now_ns"):
        assert hasattr(sched, attr)
    assert sched.plan() is None  # nothing admitted


def test_options_reach_the_baseline():
    assert make_scheduler("sarathi", CATALOG, token_budget=128).token_budget == 128
    assert make_scheduler("vllm-fcfs", CATALOG, max_num_batched_tokens=4).max_running == 4


@pytest.mark.parametrize("name", BASELINES)
def test_catalog_without_prefill_is_rejected(name):
    with pytest.raises(ConfigError):
        make_scheduler(name, Catalog([GraphShape(GraphKind.DECODE, 4)]))


@pytest.mark.parametrize("name", ALL)
def test_simulation_completes_every_request(name):
    """Rule: no lost requests; every slot and page is free at the end."""
    arrivals = workload(20, seed=3)
    sched, sim = simulate(name, arrivals, SchedulerConfig(request_slots=8, kv_pages=1024))
    assert len(sim.logs) == 20
    assert all(log.finish is not None for log in sim.logs.values())
    assert all(log.output_tokens >= 1 for log in sim.logs.values())
    assert not sched.requests and not len(sched.queue)
    assert sched.resources.free_slots == sched.resources.total_slots
    assert sched.resources.free_pages == sched.resources.total_pages
    assert sum(sched.stats.executions.values()) == len(sim.steps)


def _bad_completions(plan, fence):
    good = records(plan)
    lane = plan.lanes[0]
    first = good[0]
    yield fence + 1, good, timing()  # not in flight
    yield fence, good[:-1] + [good[-1]] * 2, timing()  # wrong lane count
    yield fence, [CompletionRecord(first.handle, first.epoch, lane.prompt_tokens + 1, first.tokens)] + good[1:], timing()
    yield fence, [CompletionRecord(first.handle, first.epoch + 1, lane.prompt_tokens, first.tokens)] + good[1:], timing()
    yield fence, [CompletionRecord(first.handle, first.epoch, lane.prompt_tokens, (1, 2, 3))] + good[1:], timing()
    yield fence, [CompletionRecord(first.handle, first.epoch, lane.prompt_tokens, (-1,) * lane.output_rows)] + good[1:], timing()
    yield fence, good, ExecutionTiming((-5,))
    yield fence, "nonsense", timing()


@pytest.mark.parametrize("name", ALL)
def test_malformed_completion_raises_and_changes_nothing(name):
    """Rule: complete() validates every lane first; a bad completion leaves state as it was."""
    st = Stepper(make_scheduler(name, CATALOG, None, SchedulerConfig(request_slots=8)))
    for i in range(3):
        st.admit(RequestSpec(40 + 30 * i, 6, client="ab"[i % 2]))
    kinds = set()
    while len(kinds) < 2:  # check a prefill frame and a decode frame
        plan, fence = st.dispatch()
        st.now += 5_000_000
        st.sched.advance_to(st.now)
        before = pickle.dumps(st.sched)
        for bad in _bad_completions(plan, fence):
            with pytest.raises(InvalidCompletion):
                st.sched.complete(*bad)
            assert pickle.dumps(st.sched) == before
        kinds.add(plan.shape.kind)
        st.sched.complete(fence, records(plan), timing())
    st.run()
    assert not st.sched.requests


@pytest.mark.parametrize("name", ALL)
def test_cancel_holds_resources_through_the_last_fence(name):
    """Rule: a cancelled request keeps its slot and pages until its in-flight fence completes."""
    sched = make_scheduler(name, CATALOG, None, SchedulerConfig(request_slots=4))
    st = Stepper(sched)
    h = st.admit(RequestSpec(100, 8))
    plan, fence = st.dispatch()
    assert plan.handles == (h,)
    sched.cancel(h, st.now)
    assert sched.resources.free_slots == 3
    with pytest.raises(StalePlan):  # nothing else may be planned against the cancelled request
        stale = plan
        sched.commit(stale, fence + 1)
    out = st.finish(plan, fence)
    assert out == [] and h not in sched.requests
    assert sched.resources.free_slots == 4 and sched.resources.free_pages == sched.resources.total_pages
    assert sched.plan() is None

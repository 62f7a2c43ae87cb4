"""Host-time histograms (helios.runtime.host_times) and the step loop's decision hook: bucket
edges follow Prometheus's `le` (an observation equal to a bound is in that bucket), and the loop
reports exactly one decision per dispatched frame, timed from before plan to after commit."""

from hypothesis import given
from hypothesis import strategies as st

from helios.config import SchedulerConfig
from helios.engine.echo_core import AffineCost
from helios.engine.sim_core import SimCore
from helios.prepare import ordinary_catalog
from helios.runtime.host_times import HOST_TIME_BOUNDS_NS, HostTimes
from helios.runtime.step import StepLoop
from helios.scheduler import Scheduler
from helios.scheduler.request_spec import RequestSpec

CATALOG = ordinary_catalog(max_batch=4, prefill_chunks=(64,), max_prefill_tokens=64)


def test_an_observation_on_a_bound_is_in_that_bucket():
    t = HostTimes()
    for ns in (0, HOST_TIME_BOUNDS_NS[0], HOST_TIME_BOUNDS_NS[0] + 1, HOST_TIME_BOUNDS_NS[-1] + 1, -5):
        t.observe(ns)
    buckets = dict(t.cumulative())
    assert buckets["1e-05"] == 3  # 0, the bound itself, and the negative one clamped to 0
    assert buckets["2.5e-05"] == 4 and buckets["0.1"] == 4 and buckets["+Inf"] == 5
    assert t.count == 5 and t.total_ns == 2 * HOST_TIME_BOUNDS_NS[0] + 1 + HOST_TIME_BOUNDS_NS[-1] + 1


@given(st.lists(st.integers(0, 10**9), max_size=50))
def test_cumulative_buckets_match_a_direct_count(values):
    t = HostTimes()
    for v in values:
        t.observe(v)
    bounds = [b / 1e9 for b in HOST_TIME_BOUNDS_NS] + [float("inf")]
    assert [n for _, n in t.cumulative()] == [sum(v / 1e9 <= b for v in values) for b in bounds]
    copy = t.copy()
    t.observe(1)
    assert copy.count == len(values) and copy.total_ns == sum(values)


def test_the_step_loop_times_each_dispatched_frames_plan_and_commit():
    sched = Scheduler(CATALOG, config=SchedulerConfig(request_slots=4, kv_pages=64, page_tokens=16,
                                                      max_context=256, selection_slots=4))
    core = SimCore(CATALOG, AffineCost(), seed=0)
    ticks = iter(range(0, 10**6, 7))  # a timer that advances 7 ns per read
    decisions = []
    loop = StepLoop(sched, lambda: 0, core.detach, on_decision=decisions.append, timer=lambda: next(ticks))
    for _ in range(3):
        h = sched.admit(RequestSpec(40, 4), 0)
        core.attach(h, 40)
        loop.attached(h)
    frames = 0
    while True:
        batch = []
        if not loop.dispatch(lambda plan, fence: batch.append((plan, fence)), limit=1):
            break
        frames += 1
        for plan, fence in batch:
            loop.finish(fence, core.execute(plan, fence), lambda g: True)
    assert frames > 0 and decisions == [7] * frames  # one read before plan, one after commit

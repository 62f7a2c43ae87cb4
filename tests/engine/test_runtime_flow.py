"""Runtime loop: worker completion, cancellation, faults, idle sleep, graceful stop."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from runtime_helpers import Gate, PacedSimCore, make_runtime, resources, snapshot  # noqa: E402

from helios.runtime.runtime import RuntimeClosed  # noqa: E402
from helios.runtime.stream import SamplingParams  # noqa: E402
from helios.errors import InvalidRequest  # noqa: E402
from helios.graphs import GraphKind  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def drain(stream, timeout=20.0):
    events = []
    while (event := stream.next_event(timeout)) is not None:
        events.append(event)
    return events


@pytest.fixture
def runtime():
    rt, sched, core = make_runtime()
    rt.start()
    yield rt, sched, core
    assert rt.stop(timeout=10)


def test_actual_worker_completion_and_publication(runtime):
    """Rule: concurrent requests all complete with exactly max_tokens tokens, or at EOS."""
    rt, sched, core = runtime
    initial = resources(sched)
    jobs = [(20 + 13 * i, 4 + 3 * i, (3 + i) if i % 2 else None) for i in range(6)]  # prompt, max, eos at
    streams, lock = {}, threading.Lock()

    def submit(i, prompt, max_tokens, eos_at):
        options = {"output_len": eos_at} if eos_at else {}
        s = rt.submit(list(range(1, prompt + 1)), max_tokens=max_tokens, core_options=options, client=f"c{i}")
        with lock:
            streams[i] = s

    threads = [threading.Thread(target=submit, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for i, (prompt, max_tokens, eos_at) in enumerate(jobs):
        s = streams[i]
        events = drain(s)
        assert [e.finish_reason for e in events[:-1]] == [None] * (len(events) - 1)
        ids = [t for e in events for t in e.token_ids]
        assert ids == s.token_ids
        if eos_at:  # EOS after eos_at generated tokens; the EOS token itself is not shown
            assert (s.finish_reason, len(ids), s.usage.completion_tokens) == ("stop", eos_at - 1, eos_at)
            assert core.eos_id not in ids
        else:
            assert (s.finish_reason, len(ids), s.usage.completion_tokens) == ("length", max_tokens, max_tokens)
        assert s.usage.prompt_tokens == prompt
        assert s.metrics.ttft_ns is not None and s.metrics.ttft_ns >= 0
        assert all(g >= 0 for g in s.metrics.gaps_ns)
    assert rt.wait_idle(10)
    assert core.fences == sorted(set(core.fences)) and core.fences[0] == 1
    assert sum(rt.stats.executions_by_shape.values()) == len(core.fences)
    assert sum(rt.scheduler_stats.executions.values()) == len(core.fences)
    assert resources(sched) == initial


def test_async_iteration_from_an_event_loop(runtime):
    """Rule: a stream is async-iterable; events reach asyncio consumers from the runtime thread."""
    rt, _, _ = runtime

    async def consume(n):
        s = rt.submit([1, 2, 3], max_tokens=n)
        return [e async for e in s], s

    async def main():
        return await asyncio.wait_for(asyncio.gather(consume(5), consume(9)), 20)

    for (events, s), n in zip(asyncio.run(main()), (5, 9)):
        assert events[-1].finish_reason == "length"
        assert sum(len(e.token_ids) for e in events) == n == s.usage.completion_tokens


def test_idle_runtime_sleeps_instead_of_polling(runtime):
    """Rule: with no work the runtime thread waits on its condition variable (no busy loop)."""
    rt, _, _ = runtime
    drain(rt.submit([1, 2], max_tokens=3))
    assert rt.wait_idle(10)
    time.sleep(0.05)
    before = rt.stats.loop_wakeups
    time.sleep(0.3)
    assert rt.stats.loop_wakeups - before <= 1


def test_bad_requests_are_rejected_without_side_effects(runtime):
    """Rule: an unservable request raises InvalidRequest and leaks nothing."""
    rt, sched, _ = runtime
    initial = resources(sched)
    for prompt, kw in (([], {}), ([1], {"max_tokens": 0}), ([1] * 600, {}), ([1], {"stop": "x"}),
                       ([1], {"temperature": -1.0})):
        with pytest.raises(InvalidRequest):
            rt.submit(prompt, **kw)
    assert resources(sched) == initial and snapshot(sched).live == 0


@pytest.mark.parametrize("kind", [GraphKind.PREFILL, GraphKind.DECODE])
def test_cancel_mid_frame_frees_slot_and_pages_for_reuse(kind):
    """Rule: cancelling during a prefill or a decode frame ends the stream "cancelled" at once;
    the slot and pages return through the fence, and the next request reuses them."""
    # One slot and exactly one request's pages: the second request can only run on reuse.
    rt, sched, core = make_runtime(slots=1, pages=8)
    gate = core.hook = Gate(kind)
    initial = resources(sched)
    with rt:
        s = rt.submit(list(range(100)), max_tokens=28)  # 128 tokens = 8 pages; two prefill chunks
        assert gate.entered.wait(10)
        s.cancel()
        assert s.finish_reason == "cancelled"
        assert resources(sched) == (0, 0)  # still owned by the in-flight fence
        gate.release.set()
        assert rt.wait_idle(10)
        assert resources(sched) == initial
        events = drain(s)
        assert events[-1].finish_reason == "cancelled"
        s.cancel()  # idempotent
        nxt = rt.submit(list(range(100)), max_tokens=28)
        drain(nxt)
        assert (nxt.finish_reason, len(nxt.token_ids)) == ("length", 28)
        assert rt.wait_idle(10)
        assert resources(sched) == initial


def test_core_fault_fails_only_its_own_requests():
    """Rule: a core exception fails the requests of that frame ("error"); others complete and
    the runtime keeps serving."""
    rt, sched, core = make_runtime()
    initial = resources(sched)
    with rt:
        healthy = [rt.submit(list(range(30)), max_tokens=40) for _ in range(2)]
        for s in healthy:
            s.next_event(10)  # both decoding: the poisoned prefill cannot share their frames
        bad = rt.submit(list(range(30)), max_tokens=40, core_options={"poison": True})
        drain(bad)
        assert bad.finish_reason == "error" and "injected fault" in bad.error
        (fence,) = core.faults.raise_on
        assert core.plans[fence] == (bad.handle,)
        for s in healthy:
            drain(s)
            assert (s.finish_reason, len(s.token_ids)) == ("length", 40)
        after = rt.submit([5, 6, 7], max_tokens=4)
        drain(after)
        assert after.finish_reason == "length"
        assert rt.stats.faults == 1 and rt.error is None
        assert rt.wait_idle(10)
        assert resources(sched) == initial


def test_invalid_engine_completion_fails_the_frame():
    """Rule: records the scheduler rejects are resolved like a fault, not a crash."""

    class Lying(PacedSimCore):
        def run(self, plan, fence):
            ex = super().run(plan, fence)
            bad = tuple(type(r)(r.handle, r.epoch, r.prompt_tokens + 1, r.tokens) for r in ex.records)
            return type(ex)(bad, ex.timing, ex.duration_ns) if fence == 1 else ex

    rt, sched, _ = make_runtime(Lying)
    with rt:
        s = rt.submit([1, 2, 3], max_tokens=4)
        drain(s)
        assert s.finish_reason == "error" and "invalid completion" in s.error
        ok = rt.submit([1, 2, 3], max_tokens=4)
        drain(ok)
        assert ok.finish_reason == "length"


def test_graceful_stop_with_requests_in_flight_ends_within_bound():
    """Rule: stop() stops admitting, cancels in-flight requests and joins within its bound
    (stop() itself reports whether the threads ended in time; no wall-clock assertion)."""
    rt, sched, core = make_runtime(scale=1.0)
    rt.start()
    streams = [rt.submit(list(range(20)), max_tokens=400) for _ in range(4)]
    for s in streams:
        s.next_event(10)
    assert rt.stop(timeout=10.0)  # True: both threads joined within the bound
    assert all(s.finish_reason == "cancelled" for s in streams)
    assert all(not t.is_alive() for t in rt._threads)
    with pytest.raises(RuntimeClosed):
        rt.submit([1], max_tokens=1)


def test_stop_with_drain_lets_short_requests_finish():
    """Rule: stop(drain_s=...) lets requests finish normally before the bound."""
    rt, _, _ = make_runtime()
    rt.start()
    streams = [rt.submit([1, 2, 3], SamplingParams(max_tokens=6)) for _ in range(3)]
    assert rt.stop(timeout=10, drain_s=10)
    assert [s.finish_reason for s in streams] == ["length"] * 3

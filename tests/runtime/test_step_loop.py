"""The one step loop (helios.runtime.step): its detach rule, its publication rule, and the
invariants every host inherits from it (no lost requests, no leaked slots or pages)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from helios.config import SchedulerConfig
from helios.engine.echo_core import AffineCost
from helios.engine.sim_core import SimCore
from helios.prepare import ordinary_catalog
from helios.runtime.driver import SyncDriver
from helios.runtime.step import StepLoop, visible_tokens
from helios.scheduler import Scheduler
from helios.scheduler.plan import FinishReason, GeneratedToken
from helios.scheduler.request_spec import RequestSpec
from helios.sim.loop import Arrival, Simulation

CATALOG = ordinary_catalog(max_batch=4, prefill_chunks=(64, 256), max_prefill_tokens=256)


def scheduler(slots: int = 4) -> Scheduler:
    return Scheduler(CATALOG, config=SchedulerConfig(request_slots=slots, kv_pages=256, page_tokens=16,
                                                     max_context=512, selection_slots=slots))


class Spy:
    """A scheduler seen through the protocol, recording published_output and complete* calls."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name.startswith("complete") or name.startswith("published_output"):
            def record(*args):
                if name == "published_outputs":  # a batch: one published_output per handle, in order
                    self.calls += [("published_output", (h, args[1])) for h in args[0]]
                else:
                    self.calls.append((name, args[:2] if name == "published_output" else args[0]))
                return attr(*args)
            return record
        return attr


class WatchedCore(SimCore):
    """SimCore that checks the detach rule when it is applied and records what it executed."""

    def __init__(self, sched, **kw):
        super().__init__(CATALOG, AffineCost(), **kw)
        self.sched = sched
        self.detached: list[int] = []
        self.executed: list[tuple[int, ...]] = []

    def execute(self, plan, fence):
        assert not set(plan.handles) & set(self.detached), "a detached request was executed"
        self.executed.append(plan.handles)
        return super().execute(plan, fence)

    def detach(self, handle) -> None:
        assert not self.sched.is_live(handle), f"request {handle} detached while the scheduler holds it"
        assert handle not in self.detached, f"request {handle} detached twice"
        self.detached.append(handle)
        super().detach(handle)


def test_visible_tokens_never_show_the_terminating_eos():
    assert visible_tokens(GeneratedToken(1, 1, (5, 0), FinishReason.EOS)) == (5,)
    assert visible_tokens(GeneratedToken(1, 1, (0,), FinishReason.EOS)) == ()
    assert visible_tokens(GeneratedToken(1, 1, (5, 6), FinishReason.LENGTH)) == (5, 6)


def test_detach_rule_waits_until_the_scheduler_retires_the_request():
    """Detach rule: a finished request is detached only once `not is_live(handle)`, even when a
    queued frame still names it when its finishing burst is published."""
    sched = scheduler()
    core = WatchedCore(sched, seed=1)
    driver = SyncDriver(sched, core, clock=lambda: 0, depth=2)  # two frames in flight
    handles = [driver.submit([1] * 40, max_tokens=6) for _ in range(3)]
    driver.run()
    assert sorted(core.detached) == handles
    assert all(driver.requests[h].finish is FinishReason.LENGTH for h in handles)


def test_publication_rule_reports_only_visible_bursts_right_after_publishing():
    """Publication rule: published_output(handle, fence) is reported for exactly the bursts the
    host made visible, before the next completion is processed."""
    spy = Spy(scheduler())
    core = SimCore(CATALOG, AffineCost(), seed=0, eos_id=0)
    sim = Simulation(spy, core)
    # Output length 1: the only burst is the terminating EOS, which shows nothing.
    sim.add([Arrival(0, RequestSpec(40, 8), output_len=1), Arrival(0, RequestSpec(40, 8), output_len=4)])
    sim.run()
    published = [args for name, args in spy.calls if name == "published_output"]
    assert {h for h, _ in published} == {1}  # handle 0 never showed a token
    bursts = [n for _, n in sim.logs[1].publications]  # the log counts the EOS-only last burst too
    assert bursts == [1, 1, 1, 1] and len(published) == 3
    for i, (name, args) in enumerate(spy.calls):
        if name == "published_output":  # right after the completion of the same fence
            previous = next(a for n, a in reversed(spy.calls[:i]) if n.startswith("complete"))
            assert previous == args[1]


def test_step_loop_publishes_when_the_host_says_visible():
    spy = Spy(scheduler())
    core = SimCore(CATALOG, AffineCost(), seed=0)
    loop = StepLoop(spy, lambda: 0, core.detach)
    h = spy.admit(RequestSpec(40, 3), 0)
    core.attach(h, 40)
    loop.attached(h)
    frames = []
    while loop.dispatch(lambda plan, fence: frames.append((plan, fence)), limit=1):
        plan, fence = frames.pop()
        loop.finish(fence, core.execute(plan, fence), lambda g: False)  # e.g. a held-back stop prefix
    assert not spy.is_live(h)
    assert [n for n, _ in spy.calls if n == "published_output"] == []


def test_cancelled_requests_are_detached_after_retirement_in_the_simulator():
    """Detach rule, cancellation: the simulator detaches a cancelled request too, once retired."""
    sched = scheduler()
    core = WatchedCore(sched, seed=2)
    sim = Simulation(sched, core)
    sim.add([Arrival(0, RequestSpec(200, 50), output_len=50), Arrival(0, RequestSpec(40, 5), output_len=5)])
    sim.cancel_at(1, 0)  # the first request, mid-prefill
    sim.run()
    assert sorted(core.detached) == [0, 1]
    assert sim.logs[0].finish is None and sim.logs[1].finish is FinishReason.EOS


def test_a_failed_frame_ends_its_requests_and_returns_their_resources():
    sched = scheduler()
    core = WatchedCore(sched, seed=3)
    loop = StepLoop(sched, lambda: 0, core.detach)
    for _ in range(2):
        h = sched.admit(RequestSpec(40, 5), 0)
        core.attach(h, 40)
        loop.attached(h)
    frames = []
    loop.dispatch(lambda plan, fence: frames.append((plan, fence)), limit=1)
    plan, fence = frames[0]
    loop.fail(fence, plan)
    assert sorted(core.detached) == sorted(plan.handles)
    snap = sched.snapshot()
    assert snap.free_slots == snap.total_slots and snap.free_pages == snap.total_pages


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 300), st.integers(1, 24), st.integers(1, 24),
                          st.none() | st.integers(0, 120)), min_size=1, max_size=10),
       st.integers(0, 2 ** 16))
def test_no_lost_requests_and_no_leaked_slots_or_pages(requests, seed):
    """Every request ends, is detached exactly once after retirement, and every slot and page
    comes back, whatever the arrivals and cancellations."""
    sched = scheduler(slots=2)
    core = WatchedCore(sched, seed=seed)
    sim = Simulation(sched, core)
    for arrive_ms, prompt, max_out, out_len, cancel_ms in requests:
        sim.add([Arrival(arrive_ms * 1_000_000, RequestSpec(prompt, max_out), output_len=out_len)])
    handles_by_arrival = list(range(len(requests)))  # handles are given in admission order
    for (arrive_ms, *_, cancel_ms), h in zip(sorted(requests, key=lambda r: r[0]), handles_by_arrival):
        if cancel_ms is not None:
            sim.cancel_at((arrive_ms + cancel_ms) * 1_000_000, h)
    sim.run()
    assert sorted(sim.logs) == handles_by_arrival
    assert sorted(core.detached) == handles_by_arrival
    assert not any(sched.is_live(h) for h in sim.logs)
    snap = sched.snapshot()
    assert snap.free_slots == snap.total_slots and snap.free_pages == snap.total_pages

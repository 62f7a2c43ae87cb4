"""Decision cost with the decision log on (nobody reading it) and off, at 1, 16 and 64 active requests.

Two identical schedulers (bench catalog of helios.sim.overhead, costs seeded, long-lived streams)
are driven through the production step loop, one with a DecisionLog and one without, in lockstep
blocks of BLOCK decisions alternating which goes first, so both see the same machine load. Both
make the same decisions (the log never changes the scheduler). Printed: the mean decision (step
loop dispatch: plan, commit and, with the log, its record) and completion (complete, publish, and
the measured duration) per frame in microseconds, the median on/off ratio of paired blocks, the
record call alone, the garbage collector's time per decision with and without the ring (its entries
keep each decision's view and candidates alive), their sum as a share of the decision ("added"),
the decision's ratio to the catalog's shortest decode graph, and the cost of formatting the ring
once read (per decision).
Run: PYTHONPATH=. .venv/bin/python bench/decision_log.py [decisions]"""

import gc
import statistics
import sys
import time

from helios.config import SchedulerConfig
from helios.engine.core import Execution
from helios.graphs import GraphKind
from helios.runtime.decisions import DecisionLog
from helios.runtime.step import StepLoop
from helios.scheduler import CompletionRecord, ExecutionTiming, RequestSpec, Scheduler
from helios.sim.overhead import bench_catalog
from helios.sim.synthetic_cost import SyntheticCostModel

BLOCK = 20


class Driven:
    """One scheduler on a virtual clock, one frame at a time, through the step loop."""

    def __init__(self, active: int, log: DecisionLog | None):
        catalog = bench_catalog()
        model = SyntheticCostModel.realistic_small()
        self.sched = Scheduler(catalog, config=SchedulerConfig(request_slots=64, kv_pages=1 << 16, max_context=16384))
        self.sched.seed_costs({shape: [model.duration_ns(shape, [])] for shape in catalog}, 0)
        for _ in range(active):
            self.sched.admit(RequestSpec(64, 10_000), 0)  # long-lived streams
        self.now = 0
        self.loop = StepLoop(self.sched, lambda: self.now, lambda h: None, decisions=log)
        self.frame = None
        self.shortest = min(model.duration_ns(sh, [64]) for sh in catalog.of_kind(GraphKind.DECODE))

    def _submit(self, plan, fence):
        self.frame = (plan, fence)

    def step(self) -> tuple[float, float]:
        """(decision s, completion s) of one frame."""
        t0 = time.perf_counter()
        self.loop.dispatch(self._submit, limit=1)
        t1 = time.perf_counter()
        plan, fence = self.frame
        dur = plan.estimated_duration_ns
        self.now += dur
        records = tuple(CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (11,) * l.output_rows)
                        for l in plan.lanes)
        result = Execution(records, ExecutionTiming((dur,), wall_ns=dur), dur)
        t2 = time.perf_counter()
        self.loop.finish(fence, result, lambda g: True)
        return t1 - t0, time.perf_counter() - t2


class GcTimer:
    """Time the cyclic garbage collector spends, by gc callbacks (the log keeps objects alive longer)."""

    def __init__(self):
        self.total = 0.0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start


def compare(active: int, decisions: int, gc_timer: GcTimer, reading: bool = False) -> dict:
    """`reading`: a reader polls the log after every block (the log then keeps each decision's detail)."""
    log = DecisionLog()
    off, on = Driven(active, None), Driven(active, log)
    for d in (off, on):  # past the prompts, into steady decoding, with the ring full
        for _ in range(active + log.maxlen + 20):
            d.step()
    spent = {id(off): [0.0, 0.0, 0.0], id(on): [0.0, 0.0, 0.0]}
    ratios = []
    for block in range(decisions // BLOCK):
        pair = {}
        for d in ((off, on) if block % 2 == 0 else (on, off)):
            acc, gc0, t = spent[id(d)], gc_timer.total, 0.0
            for _ in range(BLOCK):
                a, b = d.step()
                t += a
                acc[1] += b
            acc[0] += t
            acc[2] += gc_timer.total - gc0
            if reading and d is on:
                log.since(log.last)  # a poll that finds nothing new: the detail is kept from here on
            pair[id(d)] = t
        ratios.append(pair[id(on)] / pair[id(off)])
    n = decisions // BLOCK * BLOCK
    # The record itself, alone: what the step loop adds per decision besides the collector.
    plan = on.frame[0]
    detail = on.sched.selection_detail(plan)
    t0 = time.perf_counter()
    for i in range(20_000):
        log.record(plan, i, 0, on.sched.selection_detail(plan))
    record_us = (time.perf_counter() - t0) / 20_000 * 1e6
    del detail
    t0 = time.perf_counter()
    formatted = log.since(0)
    fmt_us = (time.perf_counter() - t0) / max(1, len(formatted)) * 1e6
    off_us, on_us = spent[id(off)][0] / n * 1e6, spent[id(on)][0] / n * 1e6
    gc_off, gc_on = spent[id(off)][2] / n * 1e6, spent[id(on)][2] / n * 1e6
    return {"active": active, "off_us": off_us, "on_us": on_us, "median_ratio": statistics.median(ratios),
            "record_us": record_us, "gc_off_us": gc_off, "gc_on_us": gc_on,
            "added": (record_us + max(0.0, gc_on - gc_off)) / off_us,
            "of_shortest": on_us * 1e3 / on.shortest, "format_us": fmt_us}


def main(decisions: int = 1000) -> None:
    timer = GcTimer()
    print(f"{'active':>9}  {'decision off / on (us)':>22}  {'median on/off':>13}  {'record (us)':>11}  "
          f"{'gc off / on (us)':>16}  {'added':>6}  {'on / shortest decode':>20}  {'format (us)':>11}")
    for active, reading in ((1, False), (16, False), (64, False), (64, True)):
        r = compare(active, decisions, timer, reading)
        print(f"{str(r['active']) + (' read' if reading else ''):>9}  {r['off_us']:>10.1f} / {r['on_us']:<9.1f}  {r['median_ratio']:>13.3f}  "
              f"{r['record_us']:>11.2f}  {r['gc_off_us']:>7.2f} / {r['gc_on_us']:<6.2f}  {r['added']:>6.2%}  "
              f"{r['of_shortest']:>20.2%}  {r['format_us']:>11.1f}")
    print("added = (record + the collector's extra time) / decision with the log off; median on/off: of "
          f"paired {BLOCK}-decision blocks (noisy on a shared machine); 'read': a reader polls after every block")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)

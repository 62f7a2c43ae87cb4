"""Decision cost with the decision log on (nobody reading it) and off, at 1, 16 and 64 active requests.

Two identical schedulers (bench catalog of helios.sim.overhead, costs seeded, long-lived streams)
are driven through the production step loop, one with a DecisionLog and one without, in lockstep
blocks of BLOCK decisions alternating which goes first, so both see the same machine load. Both
make the same decisions (the log never changes the scheduler). Printed: the mean decision (step
loop dispatch: plan, commit and, with the log, its record) and completion (complete, publish, and
the measured duration) per frame in microseconds, the ratio on/off, and the decision's ratio to
the catalog's shortest decode graph. Then the cost of formatting the ring once read.
Run: PYTHONPATH=. .venv/bin/python bench/decision_log.py [decisions]"""

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

BLOCK = 50


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


def compare(active: int, decisions: int) -> dict:
    log = DecisionLog()
    off, on = Driven(active, None), Driven(active, log)
    for d in (off, on):  # past the prompts, into steady decoding
        for _ in range(active + 20):
            d.step()
    spent = {id(off): [0.0, 0.0], id(on): [0.0, 0.0]}
    for block in range(decisions // BLOCK):
        for d in ((off, on) if block % 2 == 0 else (on, off)):
            acc = spent[id(d)]
            for _ in range(BLOCK):
                a, b = d.step()
                acc[0] += a
                acc[1] += b
    n = decisions // BLOCK * BLOCK
    t0 = time.perf_counter()
    formatted = log.since(0)
    fmt_us = (time.perf_counter() - t0) / max(1, len(formatted)) * 1e6
    off_us, on_us = spent[id(off)][0] / n * 1e6, spent[id(on)][0] / n * 1e6
    return {"active": active, "off_us": off_us, "on_us": on_us, "ratio": on_us / off_us,
            "complete_off_us": spent[id(off)][1] / n * 1e6, "complete_on_us": spent[id(on)][1] / n * 1e6,
            "of_shortest": on_us * 1e3 / on.shortest, "format_us": fmt_us, "held": len(formatted)}


def main(decisions: int = 1000) -> None:
    print(f"{'active':>6}  {'decision off (us)':>17}  {'on (us)':>8}  {'on/off':>7}  {'completion off/on (us)':>22}  "
          f"{'on / shortest decode':>20}  {'format when read (us/decision)':>30}")
    for active in (1, 16, 64):
        r = compare(active, decisions)
        print(f"{r['active']:>6}  {r['off_us']:>17.1f}  {r['on_us']:>8.1f}  {r['ratio']:>7.3f}  "
              f"{r['complete_off_us']:>10.1f} / {r['complete_on_us']:<9.1f}  {r['of_shortest']:>20.2%}  "
              f"{r['format_us']:>30.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)

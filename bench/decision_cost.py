"""Per-decision cost (plan + commit + complete + publish) at 64 active, as the median and 10th
percentile of single decisions, which a machine shared with other jobs skews far less than
bench/plan_overhead.py's mean. The balanced preset on the overhead catalog (helios.sim.overhead).
Compare two trees by running it alternately with each on PYTHONPATH:

    for i in 1 2 3; do for d in OLD NEW; do PYTHONPATH=$d python bench/decision_cost.py; done; done
"""

import statistics
import sys
import time

from helios.config import SchedulerConfig, preset
from helios.graphs import GraphKind
from helios.scheduler import CompletionRecord, ExecutionTiming, RequestSpec, Scheduler
from helios.sim.overhead import bench_catalog, cost_models


def decisions(model, active: int = 64, iterations: int = 900) -> list[float]:
    """Microseconds of each of `iterations` decisions once every request decodes."""
    catalog = bench_catalog()
    s = Scheduler(catalog, preset("balanced"), SchedulerConfig(request_slots=64, kv_pages=1 << 16))
    s.seed_costs({shape: [model.duration_ns(shape, [])] for shape in catalog}, 0)
    for _ in range(active):
        s.admit(RequestSpec(64, iterations + 100), 0)
    fence, now, clock = 0, 0, time.perf_counter

    def run(plan) -> float:
        nonlocal fence, now
        fence += 1
        t0 = clock()
        s.commit(plan, fence)
        t1 = clock()
        now += plan.estimated_duration_ns
        s.advance_to(now)
        records = [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (11,) * l.output_rows) for l in plan.lanes]
        timing = ExecutionTiming((plan.estimated_duration_ns,), wall_ns=plan.estimated_duration_ns)
        t2 = clock()
        out = s.complete(fence, records, timing)
        s.published_outputs([g.handle for g in out], fence)
        return (t1 - t0) + (clock() - t2)  # the records are the core's work, outside the decision

    while (p := s.plan()) is not None and p.shape.kind is not GraphKind.DECODE:
        run(p)
    times = []
    for _ in range(iterations):
        t0 = clock()
        p = s.plan()
        planned = clock() - t0
        times.append((planned + run(p)) * 1e6)
    return sorted(times)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 900
    for name, model in cost_models().items():
        times = decisions(model, iterations=n)
        shortest = min(model.duration_ns(sh, [64]) for sh in bench_catalog().of_kind(GraphKind.DECODE)) / 1e3
        med = statistics.median(times)
        print(f"{name}: median {med:.1f} us ({med / shortest:.2%} of the shortest decode graph), "
              f"p10 {times[len(times) // 10]:.1f} us")

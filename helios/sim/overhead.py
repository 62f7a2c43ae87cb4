"""Scheduler overhead per decision (plan + commit + complete + publish), on a virtual clock.

Shared by `flare bench` and bench/plan_overhead.py. The ratio divides the wall time of one
decision by the catalog's shortest decode-graph duration; the target is at most 2% at 64
active requests.
"""

from __future__ import annotations

import time

from helios.config import SchedulerConfig
from helios.graphs import GraphKind
from helios.prepare import ordinary_catalog
from helios.scheduler import CompletionRecord, ExecutionTiming, RequestSpec, Scheduler
from helios.sim.costmodel import SyntheticCostModel

CHUNKS = (64, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096)


def bench_catalog():
    # decode at 7 buckets + prefill and scored prefill at every (bucket, chunk) within 16k tokens.
    return ordinary_catalog(64, CHUNKS, max_prefill_tokens=16384, scored_prefill=True)


def cost_models() -> dict:
    """The two catalogs the overhead is reported against: a fast ~7B model on one H100 (the
    hard case) and Llama-2-70B at TP2 on A100s calibrated from Vidur's profiles."""
    from helios.sim.costmodel import VidurCostModel

    return {"synthetic 7B/H100": SyntheticCostModel.realistic_small(),
            "vidur 70B/A100 TP2": VidurCostModel.from_data("a100-70b-tp2")}


def measure(active: int, iterations: int = 300, model=None) -> dict:
    catalog = bench_catalog()
    model = model or SyntheticCostModel.realistic_small()
    s = Scheduler(catalog, config=SchedulerConfig(request_slots=64, kv_pages=1 << 16))
    s.seed_costs({shape: [model.duration_ns(shape, [])] for shape in catalog}, 0)
    for _ in range(active):
        s.admit(RequestSpec(64, 1_000_000_000 // 1_000_000), 0)  # long-lived streams
    fence, now = 0, 0

    def run(plan) -> float:
        nonlocal fence, now
        fence += 1
        t0 = time.perf_counter()
        s.commit(plan, fence)
        dur = plan.estimated_duration_ns
        now += dur
        s.advance_to(now)
        records = [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (11,) * l.output_rows) for l in plan.lanes]
        out = s.complete(fence, records, ExecutionTiming((dur,), wall_ns=dur))
        for g in out:
            s.published_output(g.handle, fence)
        return time.perf_counter() - t0

    while (p := s.plan()) is not None and p.shape.kind is not GraphKind.DECODE:
        run(p)
    total = 0.0
    for _ in range(iterations):
        t0 = time.perf_counter()
        p = s.plan()
        total += time.perf_counter() - t0
        total += run(p)
    shortest = min(model.duration_ns(sh, [64]) for sh in catalog.of_kind(GraphKind.DECODE))
    per = total / iterations
    return {"active": active, "graphs": len(catalog), "decision_us": per * 1e6,
            "shortest_decode_us": shortest / 1e3, "ratio": per * 1e9 / shortest, "last": p.shape.label()}


def print_overhead(iterations: int = 300) -> list[dict]:
    out = []
    for name, model in cost_models().items():
        rows = [measure(n, iterations, model) for n in (1, 4, 16, 64)]
        print(f"{name}: {rows[0]['graphs']} graphs; shortest decode graph {rows[0]['shortest_decode_us']:.0f} us")
        print(f"{'active':>6}  {'decision (us)':>13}  {'ratio to shortest decode':>24}  last graph")
        for r in rows:
            print(f"{r['active']:>6}  {r['decision_us']:>13.1f}  {r['ratio']:>23.2%}  {r['last']}")
        out += rows
    return out

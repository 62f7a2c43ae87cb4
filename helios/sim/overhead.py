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
from helios.scheduler.service_class import BUILTIN_CLASSES, DEFAULT_CLASS
from helios.sim.synthetic_cost import SyntheticCostModel

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


PARTS = ("plan", "commit", "complete", "publish")


def decision_parts(active: int, iterations: int = 300, model=None, classes: bool = False) -> list[dict]:
    """Wall seconds of each of `iterations` decisions once every stream decodes, split into
    PARTS. The completion records are the core's work: they are built outside the timed parts.
    `classes`: the streams cycle through the built-in interactive, standard and batch classes
    (per-row weights and adaptation times) instead of the default class."""
    catalog = bench_catalog()
    model = model or SyntheticCostModel.realistic_small()
    s = Scheduler(catalog, config=SchedulerConfig(request_slots=64, kv_pages=1 << 16))
    s.seed_costs({shape: [model.duration_ns(shape, [])] for shape in catalog}, 0)
    mix = [c for c in BUILTIN_CLASSES if c.has_targets] if classes else [DEFAULT_CLASS]
    left = {}  # prompt tokens each stream has still to be served
    for i in range(active):  # long-lived streams
        left[s.admit(RequestSpec(64, 1_000_000_000 // 1_000_000, service_class=mix[i % len(mix)]), 0)] = 64
    fence, now = 0, 0
    clock = time.perf_counter

    def run(plan, part: dict) -> None:
        nonlocal fence, now
        fence += 1
        t0 = clock()
        s.commit(plan, fence)
        t1 = clock()
        dur = plan.estimated_duration_ns
        now += dur
        s.advance_to(now)
        records = [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (11,) * l.output_rows) for l in plan.lanes]
        timing = ExecutionTiming((dur,), wall_ns=dur)
        t2 = clock()
        out = s.complete(fence, records, timing)
        t3 = clock()
        s.published_outputs([g.handle for g in out], fence)  # as the step loop reports a frame's bursts
        part.update(commit=t1 - t0, complete=t3 - t2, publish=clock() - t3)

    # Warm up until every stream decodes: with classes a consumed prompt's decode can win a decision
    # before the other prompts are served, and the timed decisions must all be decode decisions.
    while (p := s.plan()) is not None and (p.shape.kind is not GraphKind.DECODE or any(left.values())):
        for h, n in zip(p.lanes.handle.tolist(), p.lanes.prompt_tokens.tolist()):
            left[h] -= n
        run(p, {})
    parts = []
    for _ in range(iterations):
        t0 = clock()
        p = s.plan()
        part = {"plan": clock() - t0}
        run(p, part)
        parts.append(part)
    return parts


def shortest_decode_ns(model) -> float:
    return min(model.duration_ns(sh, [64]) for sh in bench_catalog().of_kind(GraphKind.DECODE))


def measure(active: int, iterations: int = 300, model=None, classes: bool = False) -> dict:
    """Mean wall time per decision and per part of it (see `decision_parts`)."""
    model = model or SyntheticCostModel.realistic_small()
    parts = decision_parts(active, iterations, model, classes)
    spent = {k: sum(p[k] for p in parts) for k in PARTS}
    shortest = shortest_decode_ns(model)
    per = sum(spent.values()) / iterations
    return {"active": active, "graphs": len(bench_catalog()), "decision_us": per * 1e6,
            "shortest_decode_us": shortest / 1e3, "ratio": per * 1e9 / shortest,
            "parts_us": {k: v / iterations * 1e6 for k, v in spent.items()}}


def print_overhead(iterations: int = 300, classes: bool = False) -> list[dict]:
    out = []
    for name, model in cost_models().items():
        rows = [measure(n, iterations, model, classes) for n in (1, 4, 16, 64)]
        print(f"{name}: {rows[0]['graphs']} graphs; shortest decode graph {rows[0]['shortest_decode_us']:.0f} us")
        print(f"{'active':>6}  {'decision (us)':>13}  {'ratio to shortest decode':>24}")
        for r in rows:
            print(f"{r['active']:>6}  {r['decision_us']:>13.1f}  {r['ratio']:>23.2%}")
        parts = rows[-1]["parts_us"]
        print(f"  at {rows[-1]['active']} active: " + ", ".join(f"{k} {v:.1f} us" for k, v in parts.items()))
        out += rows
    return out

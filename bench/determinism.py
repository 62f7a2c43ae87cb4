"""Determinism check for scheduler refactors: seeded trace runs whose per-request results (arrival,
every publication and prefill with its time, finish reason and time) and per-step frames (graph,
handles, start, end, estimate) are written to a JSON file, and compared with an earlier file.

    PYTHONPATH=. .venv/bin/python bench/determinism.py record OUT.json [LABEL ...]
    PYTHONPATH=. .venv/bin/python bench/determinism.py compare BEFORE.json AFTER.json

`record` runs every configuration in CONFIGS and SYNTHETIC; `compare` prints the first differences
per configuration and exits 1 when any result differs.

The trace runs never plan a state operation (their catalogs have no snapshot or restore graph), so
SYNTHETIC adds hand-stepped runs on a virtual clock (`drive`) over a small measured catalog with
snapshot, restore and vision graphs: cached prefixes restored before their prefill, automatic
preemption, anchor cuts at message endpoints, terminal captures, vision windows with
their private snapshots, and cancellations, each frame recorded with its lanes, score and scale.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace

from helios.config import PreemptionConfig, PreemptionPolicy, SchedulerConfig
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler import CompletionRecord, ExecutionTiming, ImageSpan, RequestSpec, Scheduler
from helios.sim.experiment import Setup, default_slo, run_workload
from helios.sim.metrics import NS_PER_S
from helios.sim.workload import load_workload, rescale

# (label, scheduler, cost model, trace, window seconds, rate scale, mixed prefill, seed)
CONFIGS = (
    ("balanced-7b-azure", "helios-balanced", "realistic-small", "azure", 200.0, 3.0, False, 1),
    ("balanced-7b-azure-mixed", "helios-balanced", "realistic-small", "azure", 200.0, 3.0, True, 1),
    ("throughput-70b-azure", "helios-throughput", "h100-70b", "azure", 60.0, 1.0, False, 2),
    ("spec-7b-azure", "helios-spec", "realistic-small", "azure", 100.0, 3.0, False, 3),
    ("balanced-70b-mooncake-mixed", "helios-balanced", "h100-70b", "mooncake", 60.0, 1.0, True, 4),
    ("balanced-70b-multi", "helios-balanced", "h100-70b", "multi", 20.0, 1.2, True, 5),
    # The direct baseline selects decode rounds with Helios's decode candidates and prices: a change
    # to the scheduler's defaults reaches it too.
    ("direct-7b-azure", "direct", "realistic-small", "azure", 60.0, 3.0, False, 1),
)


def record_one(scheduler, cost_model, trace, window_s, scale, mixed, seed) -> dict:
    # The spec's form (one prompt row per mixed graph): the decisions it must keep (docs/packed-prompt-rows.md).
    setup = replace(Setup(), cost_model=cost_model, mixed_prefill=mixed, mixed_prompt_rows=1)
    base = load_workload(trace, window_s, seed=seed, max_context=setup.max_context)
    slo = default_slo(base, setup)
    res = run_workload(scheduler, rescale(base, scale), setup, seed=seed, slo=slo, scale=scale,
                       arrival_window_ns=int(window_s / scale * NS_PER_S), progress=False)
    sim = res.sim
    requests = {str(h): {"arrival_ns": log.arrival_ns, "prompt": log.prompt_tokens,
                         "publications": log.publications, "prefills": log.prefills,
                         "output_tokens": log.output_tokens,
                         "finish": None if log.finish is None else str(log.finish),
                         "finished_ns": log.finished_ns}
                for h, log in sorted(sim.logs.items())}
    steps = [[s.fence, s.label, list(s.handles), s.start_ns, s.end_ns, s.estimated_ns] for s in sim.steps]
    return {"requests": requests, "steps": steps}


MS = 1_000_000
_D, _P = GraphKind.DECODE, GraphKind.PREFILL
PREREQ_TABLE = {  # milliseconds
    GraphShape(_D, 1): 10, GraphShape(_D, 2): 11, GraphShape(_D, 4): 14, GraphShape(_P, 1, 64): 30,
    GraphShape(_P, 4, 64): 60, GraphShape(_P, 1, 256): 80, GraphShape(_P, 2, 256): 120,
    GraphShape(GraphKind.SNAPSHOT, 1): 2, GraphShape(GraphKind.SNAPSHOT, 2): 3,
    GraphShape(GraphKind.RESTORE, 1): 3, GraphShape(GraphKind.RESTORE, 4): 5,
    GraphShape(GraphKind.VISION, 1, 200): 20, GraphShape(GraphKind.VISION, 2, 200): 30,
}
IMAGES = (ImageSpan(20, 100), ImageSpan(130, 120), ImageSpan(300, 50), ImageSpan(360, 150))

# (label, request slots, extra-work fraction, automatic preemption, requests, image share, seed)
SYNTHETIC = (
    ("prereq-restores-anchors-preempt", 4, 0.2, True, 60, 0.0, 11),
    ("prereq-vision-windows", 4, 0.05, False, 40, 0.4, 12),
    ("prereq-everything-6-slots", 6, 0.1, True, 80, 0.2, 13),
)


def _request(rng: random.Random, images: float) -> RequestSpec:
    out = rng.randint(1, 24)
    if rng.random() < images:
        return RequestSpec(600, out, endpoints=(20, 300), images=IMAGES)
    prompt = rng.randint(20, 700)
    cached = rng.randrange(prompt) if rng.random() < 0.35 else 0
    cuts = sorted({rng.randrange(1, prompt) for _ in range(rng.randint(0, 3))})
    return RequestSpec(prompt, out, cached_tokens=cached, endpoints=tuple(cuts))


def drive(slots: int, fraction: float, preempt: bool, n: int, images: float, seed: int) -> dict:
    """A hand-stepped run through the protocol alone: seeded arrivals, durations within 20% of the
    table, up to two frames in flight, a cancellation now and then, automatic preemption."""
    rng = random.Random(seed)
    policy = PreemptionConfig(PreemptionPolicy.PRICE, quantum_ms=20.0) if preempt else PreemptionConfig()
    s = Scheduler(Catalog(PREREQ_TABLE), config=SchedulerConfig(
        request_slots=slots, kv_pages=slots * 64, max_context=2048, checkpoint_extra_work_fraction=fraction,
        window_snapshot_rows=2, preemption=policy))
    s.seed_costs({sh: [int(ms * MS)] for sh, ms in PREREQ_TABLE.items()}, 0)
    arrivals = sorted((rng.randrange(0, 3000) * MS, i, _request(rng, images)) for i in range(n))
    handles, steps, results, inflight = [], [], {}, []
    now, fence, k = 0, 0, 0
    while k < len(arrivals) or inflight or any(s.is_live(h) for h in handles):
        while k < len(arrivals) and arrivals[k][0] <= now:
            handles.append(s.admit(arrivals[k][2], now))
            k += 1
        if handles and rng.random() < 0.03:
            s.cancel(handles[rng.randrange(len(handles))], now)
        victims = s.preempt_due(now)
        while (p := s.plan()) is not None:
            fence += 1
            s.commit(p, fence)
            start = max([now] + [end for *_, end in inflight])
            inflight.append((p, fence, start, start + int(PREREQ_TABLE[p.shape] * MS * rng.uniform(0.8, 1.2))))
            l = p.lanes
            steps.append([fence, p.shape.label(), l.handle.tolist(), l.prompt_tokens.tolist(),
                          l.output_rows.tolist(), l.context_tokens.tolist(), p.estimated_duration_ns, p.score,
                          p.log_scale, p.reason.value, bool(p.anchor), bool(p.private_state), now, victims])
            victims = []
        if not inflight:
            if k == len(arrivals):
                break  # nothing in flight, nothing planned, nothing left to arrive
            now = max(now, arrivals[k][0])
            continue
        p, f, start, end = inflight.pop(0)
        now = max(now, end)
        s.advance_to(now)
        records = [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (7,) * l.output_rows) for l in p.lanes]
        out = s.complete(f, records, ExecutionTiming((end - start,), wall_ns=end - start))
        s.published_outputs([g.handle for g in out if g.tokens], f)
        for g in out:
            r = results.setdefault(str(g.handle), {"tokens": 0, "publications": [], "finish": None})
            r["tokens"] += len(g.tokens)
            r["publications"].append([f, now, len(g.tokens)])
            if g.finish is not None:
                r["finish"] = [str(g.finish), now]
    return {"requests": results, "steps": steps}


def record(path: str, only=()) -> None:
    """Every configuration, or those labelled in `only`."""
    out = {}
    for run, configs in ((record_one, CONFIGS), (drive, SYNTHETIC)):
        for label, *args in configs:
            if only and label not in only:
                continue
            out[label] = run(*args)
            print(f"{label}: {len(out[label]['requests'])} requests, {len(out[label]['steps'])} steps")
    with open(path, "w") as f:
        json.dump(out, f)


def compare(before_path: str, after_path: str) -> int:
    before, after = (json.load(open(p)) for p in (before_path, after_path))
    bad = 0
    for label in before:
        a, b = before[label], after.get(label)
        if b is None:
            print(f"{label}: missing in {after_path}")
            bad += 1
            continue
        diffs = [h for h in a["requests"] if a["requests"][h] != b["requests"].get(h)]
        diffs += [h for h in b["requests"] if h not in a["requests"]]
        step_diff = next((i for i, (x, y) in enumerate(zip(a["steps"], b["steps"])) if x != y), None)
        if step_diff is None and len(a["steps"]) != len(b["steps"]):
            step_diff = min(len(a["steps"]), len(b["steps"]))
        ok = not diffs and step_diff is None
        bad += not ok
        print(f"{label}: {len(a['requests'])} requests, {len(a['steps'])} steps: "
              + ("identical" if ok else f"{len(diffs)} requests differ (first {diffs[:5]}), "
                 f"first differing step {step_diff}"))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        record(sys.argv[2], sys.argv[3:])
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)

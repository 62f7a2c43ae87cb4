"""Determinism check for scheduler refactors: seeded trace runs whose per-request results (arrival,
every publication and prefill with its time, finish reason and time) and per-step frames (graph,
handles, start, end, estimate) are written to a JSON file, and compared with an earlier file.

    PYTHONPATH=. .venv/bin/python bench/determinism.py record OUT.json
    PYTHONPATH=. .venv/bin/python bench/determinism.py compare BEFORE.json AFTER.json

`record` runs every configuration in CONFIGS; `compare` prints the first differences per
configuration and exits 1 when any result differs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

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
    setup = replace(Setup(), cost_model=cost_model, mixed_prefill=mixed)
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


def record(path: str) -> None:
    out = {}
    for label, *args in CONFIGS:
        out[label] = record_one(*args)
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
        record(sys.argv[2])
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)

"""Per-graph times of TorchCore's prepared graphs on this CPU, for several engine settings in one run.

Graphs: decode at B = 1, 4, 16, 32 (rows at KV position --context) and prefill of one 64- and
one 256-token chunk. Each setting runs in its own subprocess (the OpenMP wait policy is read once,
when torch loads), the settings alternate for --passes passes so drifting machine load hits them
alike, and each cell is the median over passes of each pass's median of --repeats runs.

Settings: fp32 weights with passive threads (OMP_WAIT_POLICY=PASSIVE, what `flare run` set until
2026-12-04), then fp32, bf16 and int8 weights with the short spin `flare run` sets now
(GOMP_SPINCOUNT=10000, helios/server/openmp.py). Ratios are against the first setting; bf16 reads
"n/a" on a CPU without native bfloat16. The load average is printed, since on a shared 2-core
machine it moves every figure.

Run: .venv/bin/python bench/graph_profile.py [--threads 2] [--passes 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from helios.server.openmp import SPIN_COUNT

SETTINGS = {"fp32, passive threads": ("fp32", {"OMP_WAIT_POLICY": "PASSIVE"}),
            "fp32": ("fp32", {"GOMP_SPINCOUNT": SPIN_COUNT}), "bf16": ("bf16", {"GOMP_SPINCOUNT": SPIN_COUNT}),
            "int8": ("int8", {"GOMP_SPINCOUNT": SPIN_COUNT})}


def measure(weights: str, threads: int, repeats: int, context: int) -> dict[str, float] | None:
    from helios.engine.torch_core import TorchCore
    from helios.errors import ConfigError
    from helios.graphs import GraphKind, GraphShape

    try:  # a fixed thread count: the governor (helios.engine.cpu_threads) would move with the load
        core = TorchCore(request_slots=32, max_batch=32, max_context=1024, prefill_chunks=(64, 256), weights=weights,
                         num_threads=threads)
    except ConfigError:  # bf16 on a CPU without it
        return None
    shapes = [GraphShape(GraphKind.DECODE, b) for b in (1, 4, 16, 32)] + \
             [GraphShape(GraphKind.PREFILL, 1, c) for c in (64, 256)]
    out = {}
    for shape in shapes:
        ctx = 0 if shape.kind.is_prefill else context
        core.time_graph(shape, ctx)  # first run: one-off costs
        out[shape.label()] = statistics.median(core.time_graph(shape, ctx) for _ in range(repeats)) / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--child", metavar="WEIGHTS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.threads, args.repeats, args.context)))
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()}, torch threads: {args.threads})")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for _ in range(args.passes):
        for name, (weights, policy) in SETTINGS.items():
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            env.update(policy)
            cmd = [sys.executable, __file__, "--child", weights, "--threads", str(args.threads),
                   "--repeats", str(args.repeats), "--context", str(args.context)]
            line = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            runs[name].append(json.loads(line))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    table = {name: {g: statistics.median(r[g] for r in rs) for g in rs[0]} if rs[0] else None
             for name, rs in runs.items()}
    base = next(iter(table.values()))
    graphs = list(base)
    print(f"{'ms (ratio to first)':<24}" + "".join(f"{g:>22}" for g in graphs))
    for name, cells in table.items():
        row = "".join(f"{cells[g]:>12.1f} ({base[g] / cells[g]:4.2f}x)" for g in graphs) if cells else "  n/a"
        print(f"{name:<24}" + row)


if __name__ == "__main__":
    main()

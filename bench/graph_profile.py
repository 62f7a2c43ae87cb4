"""Per-graph times of TorchCore's prepared graphs on this CPU, for several engine settings in one run.

Graphs: decode at B = 1, 4, 16, 32 (rows at KV position --context) and prefill of one 64- and
one 256-token chunk. Each setting runs in its own subprocess (the OpenMP wait policy is read once,
when torch loads), the settings alternate for --passes passes so drifting machine load hits them
alike, and each cell is the median over passes of each pass's median of --repeats runs.

Settings: fp32 weights with libgomp's default (spinning) wait policy, the same with
OMP_WAIT_POLICY=PASSIVE (what `flare run` sets), and int8 weights (`--weights int8`) with passive
threads. Ratios are against the first setting. The load average is printed, since on a shared
2-core machine it moves every figure.

Run: .venv/bin/python bench/graph_profile.py [--threads 2] [--passes 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SETTINGS = {"fp32, spinning threads": ("fp32", None), "fp32, passive threads": ("fp32", "PASSIVE"),
            "int8, passive threads": ("int8", "PASSIVE")}


def measure(weights: str, threads: int, repeats: int, context: int) -> dict[str, float]:
    import torch

    from helios.engine.torch_core import TorchCore
    from helios.graphs import GraphKind, GraphShape

    torch.set_num_threads(threads)
    core = TorchCore(request_slots=32, max_batch=32, max_context=1024, prefill_chunks=(64, 256), weights=weights)
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
    ap.add_argument("--child", nargs=2, metavar=("WEIGHTS", "POLICY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], args.threads, args.repeats, args.context)))
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()}, torch threads: {args.threads})")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for _ in range(args.passes):
        for name, (weights, policy) in SETTINGS.items():
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            cmd = [sys.executable, __file__, "--child", weights, policy or "-", "--threads", str(args.threads),
                   "--repeats", str(args.repeats), "--context", str(args.context)]
            line = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            runs[name].append(json.loads(line))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    table = {name: {g: statistics.median(r[g] for r in rs) for g in rs[0]} for name, rs in runs.items()}
    base = next(iter(table.values()))
    graphs = list(base)
    print(f"{'ms (ratio to first)':<24}" + "".join(f"{g:>22}" for g in graphs))
    for name, cells in table.items():
        print(f"{name:<24}" + "".join(f"{cells[g]:>12.1f} ({base[g] / cells[g]:4.2f}x)" for g in graphs))


if __name__ == "__main__":
    main()

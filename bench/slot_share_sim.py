"""Client slot shares in the simulator: the multi-client fairness trace (one heavy client at 4x the
rate of each light one, prompts 4x longer) with `SchedulerConfig.slot_share` on against off, in one
run, on the same seeded arrivals (docs/scheduling-utility.md, "Client slot shares").

The simulator's catalogs have no snapshot or restore graphs, so this measures slot admission alone
(the water-filled free slots), not share preemption. Printed per mode: throughput, TTFT and gap
percentiles, SLO attainment, Jain's index over the clients' service, and each client's TTFT p50/p99.

Run: PYTHONPATH=. .venv/bin/python bench/slot_share_sim.py [--slots 16] [--window 20] [--scale 1.2]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helios.sim.experiment import Setup, default_slo, run_workload  # noqa: E402
from helios.sim.metrics import NS_PER_S, ttft_ms  # noqa: E402
from helios.sim.workload import load_workload, rescale  # noqa: E402


class ShareSetup(Setup):
    """Setup whose scheduler config has client slot shares on."""

    def config(self):
        return replace(super().config(), slot_share=True)


def run(on: bool, args) -> dict:
    setup = (ShareSetup if on else Setup)(cost_model=args.cost_model, request_slots=args.slots, mixed_prefill=True)
    base = load_workload("multi", args.window, seed=args.seed, max_context=setup.max_context)
    res = run_workload("helios-balanced", rescale(base, args.scale), setup, seed=args.seed,
                       slo=default_slo(base, setup), scale=args.scale,
                       arrival_window_ns=int(args.window / args.scale * NS_PER_S), progress=False)
    by_client: dict[str, list[float]] = {}
    for log in res.sim.logs.values():
        if (t := ttft_ms(log)) is not None:
            by_client.setdefault(log.client, []).append(t)
    return {"metrics": res.metrics, "ttft": {c: (float(np.percentile(v, 50)), float(np.percentile(v, 99)), len(v))
                                           for c, v in sorted(by_client.items())}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--scale", type=float, default=1.2)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--cost-model", default="h100-70b")
    args = p.parse_args()
    out = {on: run(on, args) for on in (False, True)}
    for on, r in out.items():
        m = r["metrics"]
        mode = "on " if on else "off"
        print(f"slot_share {mode}: {m.finished}/{m.requests} finished, output {m.output_tok_s:.0f} tok/s, "
              f"TTFT p50/p99 {m.ttft_p50_ms:.0f}/{m.ttft_p99_ms:.0f} ms, gap p99 {m.gap_p99_ms:.0f} ms, "
              f"SLO {m.slo_attainment:.3f}, Jain {m.jain if m.jain is None else round(m.jain, 3)}")
        for c, (p50, p99, n) in r["ttft"].items():
            print(f"    {c}: {n} requests, TTFT p50/p99 {p50:.0f}/{p99:.0f} ms")
    off, on = out[False]["metrics"], out[True]["metrics"]
    print(f"on/off: output tok/s {on.output_tok_s / off.output_tok_s:.3f}x, SLO attainment "
          f"{on.slo_attainment / off.slo_attainment:.3f}x, TTFT p99 {on.ttft_p99_ms / off.ttft_p99_ms:.3f}x")


if __name__ == "__main__":
    main()

"""Scheduler cost per speculative round, in the adaptive-speculation bench's setup.

bench/plan_overhead.py measures ordinary decode. Speculative rounds cost the host more: plan
prices every (D, W, P) program with its predicted allocation, and completion updates each lane's
acceptance and confidence estimates. This runs `concurrency` long-lived streams (64-token
prompts) for `--window-ms` of virtual time in SimCore (synthetic ~7B on one H100, MT-Bench
acceptance), under fixed K=2 and adaptive widths, and times every scheduler call on the wall
clock: plan, commit, complete, publish, advance and preemption checks. Printed per executed round,
with the ratio to that run's mean graph and to the shortest speculative graph of the catalog.

Run: .venv/bin/python bench/speculative_overhead.py [--levels 1,4,16,64] [--window-ms 2000]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import adaptive_speculation as bench  # noqa: E402

from helios.config import SpeculationMode  # noqa: E402
from helios.graphs import GraphKind  # noqa: E402
from helios.sim.synthetic_cost import SyntheticCostModel  # noqa: E402

PARTS = {"plan": ("plan",), "commit": ("commit",), "publish": ("published_outputs",),
         "complete": ("complete", "complete_packed_round", "complete_with_survival",
                      "complete_packed_round_with_survival"),
         "other": ("advance_to", "preempt_due")}


def instrumented(spent: dict):
    def instrument(scheduler) -> None:
        for part, names in PARTS.items():
            for name in names:
                call = getattr(scheduler, name)

                def timed(*args, _call=call, _part=part, **kwargs):
                    t0 = time.perf_counter()
                    try:
                        return _call(*args, **kwargs)
                    finally:
                        spent[_part] += time.perf_counter() - t0
                setattr(scheduler, name, timed)  # the instance's attribute shadows the method
    return instrument


def measure(concurrency: int, widths: list[int], mode: SpeculationMode, window_ms: float, policy: str) -> dict:
    spent = dict.fromkeys(PARTS, 0.0)
    sim = bench._simulation(concurrency, widths, mode, 1, 1 << 20, policy, until_ns=int(window_ms * 1e6),
                            instrument=instrumented(spent))
    rounds = [s for s in sim.steps if s.label.startswith("speculative")]
    busy_ms = sum(s.end_ns - s.start_ns for s in rounds) / 1e6
    n = len(sim.steps)
    return {"rounds": len(rounds), "per_round_us": {k: v / n * 1e6 for k, v in spent.items()},
            "decision_us": sum(spent.values()) / n * 1e6, "mean_graph_us": busy_ms / max(len(rounds), 1) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--window-ms", type=float, default=2000.0)
    ap.add_argument("--policy", default="throughput")
    args = ap.parse_args()
    model = SyntheticCostModel.realistic_small()
    shortest = min(model.duration_ns(s, [64]) for s in bench.catalog(range(1, 9), 64).of_kind(GraphKind.SPECULATIVE))
    print(f"policy {args.policy}; {args.window_ms:.0f} ms of virtual time per run; shortest speculative graph "
          f"{shortest / 1e3:.0f} us")
    print(f"{'conc':>4}  {'widths':>8}  {'rounds':>6}  {'decision (us)':>13}  {'/ mean graph':>12}  "
          f"{'/ shortest':>10}  per round: " + ", ".join(PARTS))
    for c in (int(x) for x in args.levels.split(",")):
        for name, widths, mode in (("K=2", [3], SpeculationMode.FIXED),
                                   ("adaptive", list(range(1, 9)), SpeculationMode.ADAPTIVE)):
            r = measure(c, widths, mode, args.window_ms, args.policy)
            parts = ", ".join(f"{v:.0f}" for v in r["per_round_us"].values())
            print(f"{c:>4}  {name:>8}  {r['rounds']:>6}  {r['decision_us']:>13.0f}  "
                  f"{r['decision_us'] / r['mean_graph_us']:>12.1%}  {r['decision_us'] * 1e3 / shortest:>10.1%}  {parts}",
                  flush=True)


if __name__ == "__main__":
    main()

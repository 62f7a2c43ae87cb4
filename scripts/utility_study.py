"""The issue-12 what-if study: Helios variants and baselines at fixed loads, one row per run.

    python scripts/utility_study.py --traces azure,mooncake --loads 0.4 --seeds 0 \
        --schedulers 'helios-balanced,helios-balanced[stall_pricing=0],sarathi' [--mixed-prefill] [--jobs 2]

Each run is `experiment.run_workload` on the first `--window-s` seconds of the trace at the nominal load,
with the report's SLOs (docs/simulator.md); the output is a Markdown table (attainment, TTFT p50/p99, gap
p99, Jain, and the share of prompt tokens a prefix-cache hit saved). Scheduler names take PolicyConfig overrides in
brackets (`experiment.split_variant`) and a `+reuse` suffix (automatic prefix reuse, `experiment.split_reuse`). This is
the quick single-load view used while developing the utility; `flare sim report` adds seeds, the goodput
bisection and the plots.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

from helios.cli import _names
from helios.sim.experiment import Setup, default_slo, load_workload, nominal_load, rescale, run_workload
from helios.sim.metrics import NS_PER_S


def one(trace: str, scheduler: str, load: float, window_s: float, seed: int, mixed: bool) -> dict:
    setup = Setup(mixed_prefill=mixed) if mixed else Setup()
    base = load_workload(trace, window_s, seed=0)
    scale = load / nominal_load(base, int(window_s * NS_PER_S), setup)
    t0 = time.perf_counter()
    r = run_workload(scheduler, rescale(base, scale), setup, seed=seed, slo=default_slo(base, setup), scale=scale,
                     arrival_window_ns=int(window_s / scale * NS_PER_S), progress=False)
    return {"trace": trace, "scheduler": scheduler, "load": load, "seed": seed, "m": r.metrics,
            "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="azure,mooncake")
    ap.add_argument("--schedulers", type=_names, default=["helios-balanced", "sarathi"])
    ap.add_argument("--loads", default="0.4")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--mixed-prefill", action="store_true", help="Helios gets the mixed catalog")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    jobs = [(t, s, float(load), a.window_s, int(seed), a.mixed_prefill) for t in a.traces.split(",")
            for s in a.schedulers for load in a.loads.split(",") for seed in a.seeds.split(",")]
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(one, *zip(*jobs)))
    print("| trace | scheduler | load | seed | rate (req/s) | SLO attained | TTFT p50 | TTFT p99 | gap p99 | Jain |"
          " prefill saved | wall (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r["m"]
        jain = "n/a" if m.jain is None else f"{m.jain:.3f}"
        print(f"| {r['trace']} | `{r['scheduler']}` | {r['load']:g} | {r['seed']} | {m.offered_rate:.2f} | "
              f"{m.slo_attainment:.2f} | {m.ttft_p50_ms:,.0f} | {m.ttft_p99_ms:,.0f} | {m.gap_p99_ms:,.0f} | {jain} | "
              f"{m.prefill_saved:.1%} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()

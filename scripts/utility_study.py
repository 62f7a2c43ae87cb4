"""The issue-12 what-if study: Helios variants and baselines at fixed loads, one row per run.

    python scripts/utility_study.py --traces azure,mooncake --loads 0.4 --seeds 0 \
        --schedulers 'helios-balanced,helios-balanced[stall_pricing=0],sarathi' [--mixed-prefill] [--jobs 2] \
        [--min-requests 1000]

Each run is `experiment.run_workload` on the first `--window-s` seconds of the trace at the nominal load,
with the report's SLOs (docs/simulator.md); `--min-requests N` replaces the window by the report's (the shortest
start of each trace holding N requests). The output is a Markdown table (attainment, the requests that missed the
TTFT SLO and those that missed the gap SLO, TTFT p50/p99, gap p99, Jain, the share of prompt tokens a prefix-cache
hit saved, and the device-busy seconds of the run). Scheduler names take PolicyConfig overrides in
brackets (`experiment.split_variant`) and a `+reuse` suffix (automatic prefix reuse, `experiment.split_reuse`). This is
the quick single-load view used while developing the utility; `flare sim report` adds seeds, the goodput
bisection and the plots.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from helios.cli import _names
from helios.sim.experiment import default_slo, nominal_load, run_workload, setup_from_flags
from helios.sim.metrics import NS_PER_S, request_gaps_ms, ttft_ms
from helios.sim.workload import load_workload, rescale, window_for


def one(trace: str, scheduler: str, load: float, window_s: float, seed: int, min_requests: int, engine: dict) -> dict:
    setup = setup_from_flags(**engine)  # the engine's flags, None where not given
    if min_requests:
        window_s = window_for(trace, min_requests, max_context=setup.max_context)
    base = load_workload(trace, window_s, seed=0)
    scale = load / nominal_load(base, int(window_s * NS_PER_S), setup)
    slo = default_slo(base, setup)
    t0 = time.perf_counter()
    r = run_workload(scheduler, rescale(base, scale), setup, seed=seed, slo=slo, scale=scale,
                     arrival_window_ns=int(window_s / scale * NS_PER_S), progress=False)
    ttft_missed = gap_missed = 0
    for log in r.sim.logs.values():  # metrics.meets_slo's two conditions, counted apart
        if log.publications:
            ttft_missed += ttft_ms(log) > slo.ttft_ms
            gaps = request_gaps_ms(log)
            gap_missed += gaps.size > 0 and float(np.quantile(gaps, slo.gap_quantile)) > slo.gap_ms
    busy_s = sum(step.end_ns - step.start_ns for step in r.sim.steps) / NS_PER_S
    return {"trace": trace, "scheduler": scheduler, "load": load, "seed": seed, "m": r.metrics,
            "wall_s": time.perf_counter() - t0, "ttft_missed": ttft_missed, "gap_missed": gap_missed,
            "busy_s": busy_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="azure,mooncake")
    ap.add_argument("--schedulers", type=_names, default=["helios-balanced", "sarathi"])
    ap.add_argument("--loads", default="0.4")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--mixed-prefill", action="store_true", help="Helios gets the mixed catalog")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--prefill-capacity", type=int, help="the most prompt tokens in one prefill graph (flare sim report's flag)")
    ap.add_argument("--mixed-prompt-capacity", type=int, help="the largest mixed prompt chunk (flare sim report's flag)")
    ap.add_argument("--cost-model", help="the cost model (flare sim report's flag; default h100-70b)")
    ap.add_argument("--min-requests", type=int, default=0,
                    help="the report's windows: each trace's shortest start holding this many requests")
    a = ap.parse_args()
    engine = {"mixed_prefill": a.mixed_prefill, "prefill_capacity": a.prefill_capacity,
              "mixed_prompt_capacity": a.mixed_prompt_capacity, "cost_model": a.cost_model}
    jobs = [(t, s, float(load), a.window_s, int(seed), a.min_requests, engine)
            for t in a.traces.split(",")
            for s in a.schedulers for load in a.loads.split(",") for seed in a.seeds.split(",")]
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(one, *zip(*jobs)))
    print("| trace | scheduler | load | seed | rate (req/s) | SLO attained | missed TTFT | missed gap | TTFT p50 |"
          " TTFT p99 | gap p99 | Jain | prefill saved | busy (s) | wall (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r["m"]
        jain = "n/a" if m.jain is None else f"{m.jain:.3f}"
        print(f"| {r['trace']} | `{r['scheduler']}` | {r['load']:g} | {r['seed']} | {m.offered_rate:.2f} | "
              f"{m.slo_attainment:.3f} | {r['ttft_missed']} | {r['gap_missed']} | {m.ttft_p50_ms:,.0f} | "
              f"{m.ttft_p99_ms:,.0f} | {m.gap_p99_ms:,.0f} | {jain} | {m.prefill_saved:.1%} | {r['busy_s']:,.0f} | "
              f"{r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()

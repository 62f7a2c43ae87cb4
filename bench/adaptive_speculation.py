"""Adaptive speculation against every fixed width K = 0..7, in SimCore.

Acceptance: the per-position curve measured on MT-Bench in vLLM (PR 26498, via
data/specdecode_per_position_acceptance_vllm_issues.csv) with per-request variation
(AcceptanceModel: each request's rates scaled by 2*Beta(k, k), sd 0.25). Durations: the
synthetic ~7B-on-H100 model (SyntheticCostModel.realistic_small), every graph measured before
the run, with a 200 ms freshness interval (TTL_NS). Acceptance draws are paired (SimCore's
paired_acceptance): a request's draft at output position i is accepted on the same uniform draw in
every run, so fixed and adaptive widths are compared on the same luck rather than on independent
streams whose spread (several percent at 256 tokens) exceeds the differences being measured.
Each run serves `concurrency` requests of 64-token prompts and 256 output tokens to
completion; useful tokens/s = committed output tokens / makespan. Printed as ratios to the best
fixed K at each concurrency, all measured in this one run.

Then one line per exploration demonstration (helios/sim/exploration_demo.py): a graph whose
duration drifts (timing refresh), and acceptance that turns from zero to high mid-stream
(acceptance learning), each against the same run with ledgers that never earn.

Run: .venv/bin/python bench/adaptive_speculation.py [--quick]
"""

import sys
from dataclasses import replace

from helios.config import SchedulerConfig, SpeculationMode, preset
from helios.engine.sim_core import SimCore
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import speculative_shapes
from helios.scheduler import RequestSpec, Scheduler
from helios.sim.acceptance import AcceptanceModel
from helios.sim import exploration_demo
from helios.sim.costmodel import SyntheticCostModel
from helios.sim.loop import Arrival, Simulation

R = 256  # --speculative-token-capacity
# Timing freshness matched to the run: contexts grow from 64 to 320 tokens within about two seconds,
# so a cost sample taken at the start no longer describes a graph late in the run. A stale entry is
# replaced by its next valid observation instead of being blended into a median with samples from a
# much shorter context (the lag that kept adaptive below the best fixed width at 4 and 16 streams).
TTL_NS = 200_000_000


def catalog(widths, max_batch):
    shapes = speculative_shapes(max_batch, widths, R)
    b = 1
    while b <= max_batch:
        shapes.append(GraphShape(GraphKind.PREFILL, b, 64))
        b *= 2
    return Catalog(shapes)


def run(concurrency, widths, mode, seed, output=256, policy="balanced"):
    cat = catalog(widths, 64)
    model = SyntheticCostModel.realistic_small()
    config = SchedulerConfig(kv_pages=1 << 16, speculation=mode)
    s = Scheduler(cat, replace(preset(policy), estimate_ttl_ns=TTL_NS), config)
    s.seed_costs({shape: [model.duration_ns(shape, [64])] for shape in cat}, 0)
    core = SimCore(cat, model, seed=seed, noise=0.03, acceptance=AcceptanceModel(seed=seed), paired_acceptance=True)
    sim = Simulation(s, core)
    sim.add(Arrival(0, RequestSpec(64, output)) for _ in range(concurrency))
    sim.run()
    tokens = sum(log.output_tokens for log in sim.logs.values())
    return tokens / (sim.now_ns / 1e9)


def main():
    quick = "--quick" in sys.argv
    levels = (1, 4) if quick else (1, 4, 16, 64)
    seeds = (1,) if quick else (1, 2)
    # Throughput drops the cadence preferences; balanced trades some tokens for deliveries.
    for policy in ("throughput", "balanced"):
        print(f"\npolicy {policy}")
        print(f"{'conc':>4}  " + "  ".join(f"K={k:<4}" for k in range(8)) + "  adaptive  (ratio to best fixed K)")
        for c in levels:
            fixed = [sum(run(c, [k + 1], SpeculationMode.FIXED, sd, policy=policy) for sd in seeds) / len(seeds)
                     for k in range(8)]
            adaptive = sum(run(c, range(1, 9), SpeculationMode.ADAPTIVE, sd, policy=policy)
                           for sd in seeds) / len(seeds)
            best = max(fixed)
            cells = "  ".join(f"{f / best:6.3f}" for f in fixed)
            print(f"{c:>4}  {cells}  {adaptive / best:8.3f}   best fixed K={fixed.index(best)} "
                  f"at {best:,.0f} tok/s; adaptive {adaptive:,.0f} tok/s")

    demonstrations()


def demonstrations():
    print("\nexploration demonstrations (SimCore; with the ledger / with a ledger that never earns)")
    on, off = exploration_demo.drift(True), exploration_demo.drift(False)
    print(f"drift: W=6 30% slower from 1 s to 4 s; last 2 s of 9: {on.tokens_per_s:,.0f} tok/s with timing "
          f"refresh, {off.tokens_per_s:,.0f} without ({on.tokens_per_s / off.tokens_per_s:.2f}x); "
          f"{on.executions['timing_refresh']} refreshes; final width {_width(on)} vs {_width(off)}")
    on, off = exploration_demo.acceptance(True), exploration_demo.acceptance(False)
    print(f"acceptance: 4 streams, zero for 300 rounds then 0.9; 2.5-7 s: {on.tokens_per_s:,.0f} tok/s with "
          f"acceptance learning, {off.tokens_per_s:,.0f} without ({on.tokens_per_s / off.tokens_per_s:.2f}x); "
          f"{on.executions['acceptance_learning']} probes; mean width {_width(on)} vs {_width(off)}")


def _width(result):
    widths = result.final_widths
    return f"{sum(w * n for w, n in widths.items()) / max(1, sum(widths.values())):.1f}"


if __name__ == "__main__":
    main()

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

The `adaptive` column is the default acceptance estimate (AcceptanceEstimate.CONDITIONAL, a spec
deviation: docs/speculation.md), cold. The `spec` column is the spec's estimate, cold
(acceptance_estimate="spec"): per-depth means from the untrained prior 0.5^d, which at depth 5-7 is
7-15x below this curve (0.22, 0.16, 0.12), so at concurrency 1 it stays at K=3-5 while the best fixed
K is 6-7. The `preseeded` column is the default estimate with its population acceptance prior
preseeded (the spec's "preseeded acceptance histories") from `calibrated_prior`: what the scheduler's
own prior learns from 16 other requests served at the widest program.

Then one line per exploration demonstration (helios/sim/exploration_demo.py): a graph whose
duration drifts (timing refresh), and acceptance that turns from zero to high mid-stream
(acceptance learning), each against the same run with ledgers that never earn.

Run: .venv/bin/python bench/adaptive_speculation.py [--quick | --levels 1,4 --seeds 1 ...] (--help)
"""

import argparse
from dataclasses import replace

import numpy as np

from helios.config import AcceptanceEstimate, SchedulerConfig, SpeculationMode, preset, study_preset
from helios.engine.sim_core import SimCore
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import speculative_shapes
from helios.scheduler import RequestSpec, Scheduler
from helios.sim.acceptance import AcceptanceModel
from helios.sim import exploration_demo
from helios.sim.synthetic_cost import SyntheticCostModel
from helios.sim.loop import Arrival, Simulation

R = 256  # --speculative-token-capacity
# Timing freshness matched to the run: contexts grow from 64 to 320 tokens within about two seconds,
# so a cost sample taken at the start no longer describes a graph late in the run. A stale entry is
# replaced by its next valid observation instead of being blended into a median with samples from a
# much shorter context (the lag that kept adaptive below the best fixed width at 4 and 16 streams).
TTL_NS = 200_000_000
STEADY_NS = 1_000_000_000  # the steady-state table's window: about one closed-batch makespan


def catalog(widths, max_batch):
    shapes = speculative_shapes(max_batch, widths, R)
    b = 1
    while b <= max_batch:
        shapes.append(GraphShape(GraphKind.PREFILL, b, 64))
        b *= 2
    return Catalog(shapes)


def _simulation(concurrency, widths, mode, seed, output, policy, prior=None, acceptance_seed=None, max_steps=None,
                until_ns=None, estimate=AcceptanceEstimate.CONDITIONAL, instrument=None):
    cat = catalog(widths, 64)
    model = SyntheticCostModel.realistic_small()
    config = SchedulerConfig(kv_pages=1 << 16, speculation=mode)
    s = Scheduler(cat, replace(preset(policy), estimate_ttl_ns=TTL_NS), config,
                  study=replace(study_preset(policy), acceptance_estimate=estimate))
    s.seed_costs({shape: [model.duration_ns(shape, [64])] for shape in cat}, 0)
    if prior is not None:
        s.seed_acceptance(prior)
    if instrument is not None:  # bench/speculative_overhead.py times the scheduler's calls
        instrument(s)
    acceptance = AcceptanceModel(seed=seed if acceptance_seed is None else acceptance_seed)
    core = SimCore(cat, model, seed=seed, noise=0.03, acceptance=acceptance, paired_acceptance=True)
    sim = Simulation(s, core)
    sim.add(Arrival(0, RequestSpec(64, output)) for _ in range(concurrency))
    sim.run(until_ns=until_ns, max_steps=max_steps)
    return sim


def run(concurrency, widths, mode, seed, output=256, policy="balanced", prior=None,
        estimate=AcceptanceEstimate.CONDITIONAL):
    sim = _simulation(concurrency, widths, mode, seed, output, policy, prior, estimate=estimate)
    tokens = sum(log.output_tokens for log in sim.logs.values())
    return tokens / (sim.now_ns / 1e9)


def steady(concurrency, widths, mode, seed, policy="balanced", prior=None, window_ns=STEADY_NS,
           estimate=AcceptanceEstimate.CONDITIONAL):
    """Tokens/s with all `concurrency` requests in flight for the whole window (none finishes):
    the rate a server holding that many streams sees, without the closed batch's tail, in which the
    slowest requests run alone after the others have finished and set the makespan."""
    sim = _simulation(concurrency, widths, mode, seed, 1 << 20, policy, prior, until_ns=window_ns,
                      estimate=estimate)
    tokens = sum(n for log in sim.logs.values() for t, n in log.publications if t <= window_ns)
    return tokens / (window_ns / 1e9)


def calibrated_prior(seed, policy="balanced", requests=16, steps=200):
    """The population acceptance prior a deployment would preseed (the spec's "preseeded acceptance
    histories"): what the scheduler's own population prior has learned after `steps` frames of
    calibration requests at the widest program. Their acceptance multipliers come from another seed
    than the measured requests' (no measured request's luck is known in advance), and they never
    finish during calibration: the prior moves 1/64 toward each observation, so a tail of the last
    few slow requests would leave it describing them alone. Only the widest program observes every
    depth; adaptive selection alone never offers a depth its cold prior (0.5^d) prices below cost."""
    sim = _simulation(requests, [8], SpeculationMode.FIXED, seed, 1 << 20, policy, acceptance_seed=seed + 1000,
                      max_steps=steps)
    return np.asarray(sim.scheduler.snapshot().acceptance_prior)


def _row(c, policy, seeds, priors, measure):
    def mean(widths, mode, prior=False, estimate=AcceptanceEstimate.CONDITIONAL):
        return sum(measure(c, widths, mode, sd, policy=policy, prior=priors[sd] if prior else None,
                           estimate=estimate) for sd in seeds) / len(seeds)
    fixed = [mean([k + 1], SpeculationMode.FIXED) for k in range(8)]
    adaptive = mean(range(1, 9), SpeculationMode.ADAPTIVE)
    spec = mean(range(1, 9), SpeculationMode.ADAPTIVE, estimate=AcceptanceEstimate.SPEC)
    preseeded = mean(range(1, 9), SpeculationMode.ADAPTIVE, prior=True)
    best = max(fixed)
    cells = "  ".join(f"{f / best:6.3f}" for f in fixed)
    print(f"{c:>4}  {cells}  {adaptive / best:8.3f}  {spec / best:6.3f}  {preseeded / best:9.3f}   best fixed "
          f"K={fixed.index(best)} at {best:,.0f} tok/s; adaptive {adaptive:,.0f}, spec {spec:,.0f}, "
          f"preseeded {preseeded:,.0f} tok/s", flush=True)


def _arguments(argv=None):
    p = argparse.ArgumentParser(description="Adaptive speculation against every fixed width K = 0..7 (SimCore).")
    p.add_argument("--quick", action="store_true", help="concurrency 1 and 4, seed 1 (while iterating)")
    p.add_argument("--levels", type=lambda v: tuple(int(x) for x in v.split(",")), help="concurrencies, e.g. 1,4")
    p.add_argument("--seeds", type=lambda v: tuple(int(x) for x in v.split(",")), help="seeds, e.g. 1,2")
    p.add_argument("--policies", default="throughput,balanced", help="presets, comma-separated")
    p.add_argument("--no-demos", action="store_true", help="skip the exploration demonstrations")
    p.add_argument("--steady", action="store_true", help="also the steady-state table (no request finishes)")
    a = p.parse_args(argv)
    a.levels = a.levels or ((1, 4) if a.quick else (1, 4, 16, 64))
    a.seeds = a.seeds or ((1,) if a.quick else (1, 2))
    return a


def main(argv=None):
    args = _arguments(argv)
    seeds = args.seeds
    # Throughput drops the cadence preferences; balanced trades some tokens for deliveries.
    for policy in args.policies.split(","):
        priors = {sd: calibrated_prior(sd, policy) for sd in seeds}
        print(f"\npolicy {policy}")
        print(f"{'conc':>4}  " + "  ".join(f"K={k:<4}" for k in range(8))
              + "  adaptive  spec    preseeded  (ratio to best fixed K)")
        for c in args.levels:
            _row(c, policy, seeds, priors, run)
        if args.steady:
            print(f"steady state, policy {policy}: all requests in flight for {STEADY_NS / 1e9:.0f} s")
            for c in args.levels:
                _row(c, policy, seeds, priors, steady)

    if not args.no_demos:
        demonstrations()


def demonstrations():
    print("\nexploration demonstrations (SimCore; with the ledger / with a ledger that never earns)")
    on, off = exploration_demo.drift(True), exploration_demo.drift(False)
    print(f"drift: W=6 30% slower from 1 s to 4 s; last 2 s of 9: {on.tokens_per_s:,.0f} tok/s with timing "
          f"refresh, {off.tokens_per_s:,.0f} without ({on.tokens_per_s / off.tokens_per_s:.2f}x); "
          f"{on.executions['timing_refresh']} refreshes; final width {_width(on)} vs {_width(off)}")
    on, off = exploration_demo.acceptance(True), exploration_demo.acceptance(False)
    print(f"acceptance: 4 streams, prior zero, acceptance zero for 300 rounds then 0.9, durations without a KV "
          f"term; 2.5-7 s: {on.tokens_per_s:,.0f} tok/s with "
          f"acceptance learning, {off.tokens_per_s:,.0f} without ({on.tokens_per_s / off.tokens_per_s:.2f}x); "
          f"{on.executions['acceptance_learning']} probes; mean width {_width(on)} vs {_width(off)}")


def _width(result):
    widths = result.final_widths
    return f"{sum(w * n for w, n in widths.items()) / max(1, sum(widths.values())):.1f}"


if __name__ == "__main__":
    main()

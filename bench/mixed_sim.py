"""Helios in the simulator with and without the mixed catalog (`--mixed-prefill`), on both traces.

For each trace, one load, Helios balanced runs twice on the same workload and seed: with the
separate catalog, then with the mixed one added. Printed per run: SLO attainment, TTFT p50, gap p99,
output tokens/s, the graphs by kind, and the padding share of the token-parallel layers:
- prefill graphs: (B x C - real prompt tokens) / real prompt tokens, over every prefill graph run;
- mixed graphs: (max packed extent - real tokens) / real tokens, real tokens being the prompt row's
  chunk plus the decode rows' output rows.

Run: .venv/bin/python bench/mixed_sim.py [--window-s 60] [--load 0.6] [--cost-model h100-70b]

Measured (2026-12-01, `--window-s 30`, load 0.6, h100-70b, with the scheduler side of issue 10 merged:
mixed selection and packed prefill rows):
    trace mixed   SLO  TTFT p50  gap p99 out tok/s pad prefill pad mixed  graphs
    azure False  1.00      331ms    244ms       181        0.05       nan  decode 763, prefill 103
    azure  True  0.95      409ms    140ms       181        0.04      0.08  decode 656, mixed 207, prefill 16
 mooncake False  0.43     3369ms    452ms       129        0.01       nan  decode 3653, prefill 500
 mooncake  True  0.63     4894ms    378ms       128        0.01      0.01  decode 2395, mixed 1993, prefill 42
Mixed graphs cut the decoders' gap p99 on both traces and raise Mooncake's SLO attainment; they cost TTFT
p50 (prompt chunks now share their graph with decoders) and a little of Azure's attainment. One window, one
load: not the report's goodput sweep.
"""

from __future__ import annotations

import argparse
from collections import Counter

import helios.sim.experiment as experiment
from helios.engine.sim_core import SimCore
from helios.graphs import GraphKind
from helios.sim.experiment import Setup, default_slo, nominal_load, run_workload
from helios.sim.metrics import NS_PER_S
from helios.sim.workload import load_workload, rescale


class RecordingSimCore(SimCore):
    """SimCore that keeps (shape, prompt tokens, output rows) of every plan it runs."""

    runs: list = []

    def execute(self, plan, fence):
        RecordingSimCore.runs.append((plan.shape, plan.lanes.prompt_tokens.tolist(), plan.lanes.output_rows.tolist()))
        return super().execute(plan, fence)


def padding(runs) -> dict[str, float]:
    share = {}
    for kind in (GraphKind.PREFILL, GraphKind.MIXED):
        real = physical = 0
        for shape, prompt, outputs in runs:
            if shape.kind is not kind:
                continue
            if kind is GraphKind.PREFILL:
                used, size = sum(prompt), shape.batch_capacity * shape.token_capacity
            else:  # the prompt row's chunk plus each decode row's output rows
                used = sum(p if p else o for p, o in zip(prompt, outputs))
                size = shape.prefill_capacity + (shape.batch_capacity - 1) * shape.token_capacity
            real, physical = real + used, physical + size
        share[kind.value] = (physical - real) / real if real else float("nan")
    return share


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--load", type=float, default=0.6, help="nominal load (device-seconds offered per second)")
    ap.add_argument("--cost-model", default="h100-70b")
    ap.add_argument("--traces", default="azure,mooncake")
    args = ap.parse_args()
    experiment.SimCore = RecordingSimCore  # run_workload builds its core from this name
    print(f"{'trace':>9} {'mixed':>5} {'SLO':>5} {'TTFT p50':>9} {'gap p99':>8} {'out tok/s':>9} "
          f"{'pad prefill':>11} {'pad mixed':>9}  graphs")
    for trace in args.traces.split(","):
        for mixed in (False, True):
            setup = Setup(cost_model=args.cost_model, mixed_prefill=mixed)
            base = load_workload(trace, args.window_s, max_context=setup.max_context)
            window_ns = int(args.window_s * NS_PER_S)
            scale = args.load / nominal_load(base, window_ns, setup)
            RecordingSimCore.runs = []
            r = run_workload("helios-balanced", rescale(base, scale), setup, slo=default_slo(base, setup),
                             scale=scale, arrival_window_ns=int(window_ns / scale), progress=False)
            m, pad = r.metrics, padding(RecordingSimCore.runs)
            kinds = Counter(shape.kind.value for shape, _, _ in RecordingSimCore.runs)
            print(f"{trace:>9} {str(mixed):>5} {m.slo_attainment:5.2f} {m.ttft_p50_ms:8.0f}ms {m.gap_p99_ms:6.0f}ms "
                  f"{m.output_tok_s:9.0f} {pad['prefill']:11.2f} {pad['mixed']:9.2f}  "
                  + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))


if __name__ == "__main__":
    main()

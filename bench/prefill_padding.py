"""Padding share of Helios's prefill graphs in the simulator: padded prefill tokens per real
prompt token, over every prefill graph (B x C of capacity) a run executes.

    python -m bench.prefill_padding --traces azure,mooncake --window-s 20 --scale 1.0

Mixed graphs are reported separately (their prompt capacity C against their prompt row's work).
"""

from __future__ import annotations

import argparse

from helios.graphs import GraphKind
from helios.sim import experiment
from helios.sim.loop import Simulation


def measure(trace: str, window_s: float, scale: float, scheduler: str = "helios-balanced") -> dict:
    totals = {"prefill_capacity": 0, "prefill_tokens": 0, "prefill_graphs": 0, "multi_row_graphs": 0,
              "mixed_capacity": 0, "mixed_tokens": 0, "mixed_graphs": 0}
    submit = Simulation._submit

    def recording(self, plan, fence):
        shape, work = plan.shape, int(plan.lanes.prompt_tokens.sum())
        if shape.kind.is_prefill:
            totals["prefill_capacity"] += shape.batch_capacity * shape.token_capacity
            totals["prefill_tokens"] += work
            totals["prefill_graphs"] += 1
            totals["multi_row_graphs"] += shape.batch_capacity > 1
        elif shape.kind is GraphKind.MIXED and work:
            totals["mixed_capacity"] += shape.prefill_capacity
            totals["mixed_tokens"] += work
            totals["mixed_graphs"] += 1
        return submit(self, plan, fence)

    Simulation._submit = recording
    try:
        result = experiment.run_trace(scheduler, trace, window_s=window_s, scale=scale,
                                      setup=experiment.Setup(), progress=False)
    finally:
        Simulation._submit = submit
    t = totals
    t["padding_share"] = (t["prefill_capacity"] - t["prefill_tokens"]) / max(1, t["prefill_tokens"])
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="azure,mooncake")
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--scheduler", default="helios-balanced")
    args = ap.parse_args()
    for trace in args.traces.split(","):
        t = measure(trace, args.window_s, args.scale, args.scheduler)
        print(f"{trace}: padding share {t['padding_share']:.3f} padded tokens per prompt token "
              f"({t['prefill_capacity'] - t['prefill_tokens']} of {t['prefill_capacity']} capacity; "
              f"{t['prefill_graphs']} prefill graphs, {t['multi_row_graphs']} multi-row)", flush=True)


if __name__ == "__main__":
    main()

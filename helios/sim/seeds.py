"""Several seeds of one (trace, scheduler): mean and range of every metric and of the goodput.

The report runs each (trace, scheduler) once per seed. A claim rests on the mean; the range (min to
max over seeds) shows how far 3% timing noise alone moves it, which is the robustness criterion of
issue 12 (attainment per load must vary no more than the baselines' plus 0.05).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SeedGoodput:
    """Goodput over seeds: `goodput` is the mean, `low`/`high` the range, `per_seed` in seed order.
    `status` is the weakest of the seeds' statuses ("below" < "bracketed" < "at-least"), so a mean
    that rests on one unbracketed seed says so."""

    goodput: float
    low: float
    high: float
    per_seed: tuple[float, ...]
    status: str


_ORDER = {"below": 0, "bracketed": 1, "at-least": 2}


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(vals)) if vals else None


def _range(values) -> tuple[float, float] | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return (float(min(vals)), float(max(vals))) if vals else None


def combine(tasks: list[dict]) -> dict:
    """One result in the shape of a single task's (see report.run_task), from one task per seed:
    metrics are seed means, with `range` giving (min, max) per metric; TTFTs and gaps are pooled
    for the distribution plots; every seed's sweep points are kept for the attainment plot."""
    first = tasks[0]
    loads = {}
    for load, v in first["loads"].items():
        each = [t["loads"][load] for t in tasks]
        keys = v["metrics"].keys()
        loads[load] = {
            "scale": v["scale"],
            "metrics": {k: _mean([e["metrics"][k] for e in each]) for k in keys},
            "range": {k: _range([e["metrics"][k] for e in each]) for k in keys},
            "ttft_ms": np.concatenate([e["ttft_ms"] for e in each]),
            "gaps_ms": np.concatenate([e["gaps_ms"] for e in each]),
        }
    goodputs = tuple(t["goodput"].goodput for t in tasks)
    status = min((t["goodput"].status for t in tasks), key=_ORDER.__getitem__)
    return {"trace": first["trace"], "scheduler": first["scheduler"], "loads": loads,
            "goodput": SeedGoodput(float(np.mean(goodputs)), min(goodputs), max(goodputs), goodputs, status),
            "points": sorted(p for t in tasks for p in t["points"]),
            "runs": sum(t["runs"] for t in tasks), "wall_s": sum(t["wall_s"] for t in tasks)}

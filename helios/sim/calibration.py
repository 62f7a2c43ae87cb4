"""The Splitwise cross-check of the calibrated cost models (docs/cost-models.md).

The fit itself lives in helios.sim.splitwise, below the cost models; this report sits above both.
Run `python -m helios.sim.calibration` to print the cross-check table used in docs/cost-models.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from helios.sim.costmodel import VidurCostModel
from helios.sim.splitwise import fit_set, load_splitwise, points_for, predict_prompt_ms, predict_token_ms


@dataclass(frozen=True)
class CalibrationRow:
    config: str
    predicted_ms: float
    splitwise_ms: float
    rel_error: float  # (predicted - splitwise) / splitwise
    role: str  # "fit", "held-out" or "anomaly" (shown, excluded from the tolerance)


def calibration_report(profiles: Sequence[str] = ("a100-70b-tp2", "h100-70b"),
                       data_dir: str | Path | None = None) -> list[CalibrationRow]:
    """Predicted vs Splitwise prompt and per-token times for every llama2-70b point of each profile."""
    rows = []
    for name in profiles:
        model = VidurCostModel.from_data(name, data_dir)
        fit = {(what, pt) for what, pt in fit_set(points_for(model, data_dir))}
        for pt in points_for(model, data_dir):
            for what, measured, predicted in (("prompt", pt.prompt_ms, predict_prompt_ms(model, pt)),
                                              ("token", pt.token_ms, predict_token_ms(model, pt))):
                role = "anomaly" if pt.anomalous else "fit" if (what, pt) in fit else "held-out"
                config = f"{name} {what} p={pt.prompt_size} B={pt.batch_size}"
                rows.append(CalibrationRow(config, predicted, measured, (predicted - measured) / measured, role))
    return rows


def error_summary(rows: Sequence[CalibrationRow]) -> dict[str, tuple[int, float, float]]:
    """Per role: (count, mean |rel error|, max |rel error|)."""
    out = {}
    for role in sorted({r.role for r in rows}):
        errs = np.abs([r.rel_error for r in rows if r.role == role])
        out[role] = (len(errs), float(errs.mean()), float(errs.max()))
    return out


def markdown_table(rows: Sequence[CalibrationRow]) -> str:
    lines = ["| config | predicted ms | Splitwise ms | rel. error | role |", "|---|---:|---:|---:|---|"]
    lines += [f"| {r.config} | {r.predicted_ms:.1f} | {r.splitwise_ms:.1f} | {r.rel_error:+.1%} | {r.role} |"
              for r in rows]
    return "\n".join(lines)


def _main() -> None:
    for name in ("a100-70b-tp2", "h100-70b", "h100-7b"):
        m = VidurCostModel.from_data(name)
        print(f"{name}: overhead {m.overhead_ms:.2f} ms/graph, comm {m.comm_ms_per_token_layer * 1e3:.3f} "
              f"us/token/layer")
    rows = calibration_report()
    print(markdown_table(rows))
    for role, (n, mean, worst) in error_summary(rows).items():
        print(f"{role}: n={n} mean |err| {mean:.1%} max |err| {worst:.1%}")


if __name__ == "__main__":
    _main()


__all__ = ["CalibrationRow", "calibration_report", "error_summary", "load_splitwise", "markdown_table"]

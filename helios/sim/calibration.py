"""Splitwise end-to-end figures: fit the two terms Vidur's operator profiles lack, and cross-check the rest.

Vidur's mlp/attention profiles time single-GPU operators. A real forward pass also pays tensor-parallel
all-reduces (Vidur profiles these separately; that file is not in data/) and per-pass costs outside the
profiled operators (LM head, sampling, kernel-launch gaps). We model them as
    comm      = kappa * tokens per layer (two all-reduces of tokens x hidden activations; TP > 1 only)
    overhead  = c0 per graph
and fit (c0, kappa) by least squares on relative error to the Splitwise llama2-70b rows at batch 1 for the
profile's GPU and TP: prompt_time for prompts up to 4096 tokens (inside the profiled range) and token_time
for every prompt size. Everything else (batches 2..64, the 8192-token prompt) is held out.
Run `python -m helios.sim.calibration` to print the cross-check table used in docs/cost-models.md.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from helios.sim.costmodel import VidurCostModel, decode_shape, prefill_shape
from helios.sim.traces import data_file

SPLITWISE_FILE = "splitwise_perf_model.csv"
FIT_MAX_PROMPT = 4096  # largest profiled num_tokens: beyond it the linear ops are extrapolated


@dataclass(frozen=True)
class SplitwisePoint:
    """Mean of the Splitwise rows sharing (hardware, TP, prompt size, batch size)."""

    hardware: str
    tp: int
    prompt_size: int
    batch_size: int
    token_size: float  # mean generated tokens of the rows (sets the mean decode context)
    prompt_ms: float
    token_ms: float
    anomalous: bool = False  # prompt_time below that of a smaller batch at the same prompt size


@dataclass(frozen=True)
class CalibrationRow:
    config: str
    predicted_ms: float
    splitwise_ms: float
    rel_error: float  # (predicted - splitwise) / splitwise
    role: str  # "fit", "held-out" or "anomaly" (shown, excluded from the tolerance)


def load_splitwise(data_dir: str | Path | None = None, model: str = "llama2-70b") -> list[SplitwisePoint]:
    path = data_file(SPLITWISE_FILE, None if data_dir is None else Path(data_dir) / SPLITWISE_FILE)
    groups: dict[tuple[str, int, int, int], list[tuple[float, float, float]]] = defaultdict(list)
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["model"] != model:
                continue
            key = (r["hardware"], int(r["tensor_parallel"]), int(r["prompt_size"]), int(r["batch_size"]))
            groups[key].append((float(r["token_size"]), float(r["prompt_time"]), float(r["token_time"])))
    points = []
    for key in sorted(groups):
        tok, prompt, token = np.mean(groups[key], axis=0)
        smaller = [np.mean([g[1] for g in groups[k]]) for k in groups
                   if k[:3] == key[:3] and k[3] < key[3]]
        anomalous = bool(smaller) and prompt < max(smaller)
        points.append(SplitwisePoint(*key, float(tok), float(prompt), float(token), anomalous))
    return points


def predict_prompt_ms(model: VidurCostModel, pt: SplitwisePoint) -> float:
    """Prefill of batch_size prompts of prompt_size tokens as one graph, nothing cached."""
    return model.duration_ns(prefill_shape(pt.batch_size, pt.prompt_size), [0] * pt.batch_size) / 1e6


def predict_token_ms(model: VidurCostModel, pt: SplitwisePoint) -> float:
    """One decode step of batch_size rows at the mean context of the generation."""
    ctx = int(round(pt.prompt_size + pt.token_size / 2))
    return model.duration_ns(decode_shape(pt.batch_size), [ctx] * pt.batch_size) / 1e6


def _points_for(model: VidurCostModel, data_dir: str | Path | None) -> list[SplitwisePoint]:
    p = model.profile
    return [pt for pt in load_splitwise(data_dir) if pt.hardware == p.splitwise_hardware and pt.tp == p.tp]


def _fit_set(points: list[SplitwisePoint]) -> list[tuple[str, SplitwisePoint]]:
    out = []
    for pt in points:
        if pt.batch_size == 1 and not pt.anomalous:
            if pt.prompt_size <= FIT_MAX_PROMPT:
                out.append(("prompt", pt))
            out.append(("token", pt))
    return out


def fit_terms(base: VidurCostModel, data_dir: str | Path | None = None) -> tuple[float, float]:
    """(overhead_ms, comm_ms_per_token_layer) minimizing squared relative error on the fit set."""
    base = base.with_terms(0.0, 0.0)
    layers = base.profile.layers
    rows = []
    for what, pt in _fit_set(_points_for(base, data_dir)):
        if what == "prompt":
            y, pred, n = pt.prompt_ms, predict_prompt_ms(base, pt), pt.batch_size * pt.prompt_size
        else:
            y, pred, n = pt.token_ms, predict_token_ms(base, pt), pt.batch_size
        rows.append((y, pred, n * layers))
    if not rows:
        raise ValueError(f"no Splitwise rows to fit profile {base.profile.name}")
    y, pred, nl = (np.array(c, dtype=np.float64) for c in zip(*rows))
    target = (y - pred) / y
    if base.profile.tp > 1:
        (c0, kappa), *_ = np.linalg.lstsq(np.stack([1 / y, nl / y], axis=1), target, rcond=None)
    else:
        c0, kappa = 0.0, 0.0
    if base.profile.tp == 1 or kappa < 0:
        kappa = 0.0
        c0 = float(np.sum(target / y) / np.sum(1 / y ** 2))
    return max(float(c0), 0.0), float(kappa)


def calibration_report(profiles: Sequence[str] = ("a100-70b-tp2", "h100-70b"),
                       data_dir: str | Path | None = None) -> list[CalibrationRow]:
    """Predicted vs Splitwise prompt and per-token times for every llama2-70b point of each profile."""
    rows = []
    for name in profiles:
        model = VidurCostModel.from_data(name, data_dir)
        fit = {(what, pt) for what, pt in _fit_set(_points_for(model, data_dir))}
        for pt in _points_for(model, data_dir):
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


__all__ = ["CalibrationRow", "SplitwisePoint", "calibration_report", "error_summary", "fit_terms",
           "load_splitwise", "markdown_table"]

"""Splitwise end-to-end figures and the fit of the two terms Vidur's operator profiles lack.

Vidur's mlp/attention profiles time single-GPU operators. A real forward pass also pays tensor-parallel
all-reduces (Vidur profiles these separately; that file is not in data/) and per-pass costs outside the
profiled operators (LM head, sampling, kernel-launch gaps). We model them as
    comm      = kappa * tokens per layer (two all-reduces of tokens x hidden activations; TP > 1 only)
    overhead  = c0 per graph
and fit (c0, kappa) by least squares on relative error to the Splitwise llama2-70b rows at batch 1 for the
profile's GPU and TP: prompt_time for prompts up to 4096 tokens (inside the profiled range) and token_time
for every prompt size. Everything else (batches 2..64, the 8192-token prompt) is held out.
This module holds the data and the fit; the cost models use it, and helios.sim.calibration builds the
cross-check report on top of both (`python -m helios.sim.calibration`).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helios.engine.core import CostModel
from helios.graphs import GraphKind, GraphShape
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


def predict_prompt_ms(model: CostModel, pt: SplitwisePoint) -> float:
    """Prefill of batch_size prompts of prompt_size tokens as one graph, nothing cached."""
    return model.duration_ns(GraphShape(GraphKind.PREFILL, pt.batch_size, pt.prompt_size), [0] * pt.batch_size) / 1e6


def predict_token_ms(model: CostModel, pt: SplitwisePoint) -> float:
    """One decode step of batch_size rows at the mean context of the generation."""
    ctx = int(round(pt.prompt_size + pt.token_size / 2))
    return model.duration_ns(GraphShape(GraphKind.DECODE, pt.batch_size), [ctx] * pt.batch_size) / 1e6


def points_for(model, data_dir: str | Path | None) -> list[SplitwisePoint]:
    p = model.profile
    return [pt for pt in load_splitwise(data_dir) if pt.hardware == p.splitwise_hardware and pt.tp == p.tp]


def fit_set(points: list[SplitwisePoint]) -> list[tuple[str, SplitwisePoint]]:
    out = []
    for pt in points:
        if pt.batch_size == 1 and not pt.anomalous:
            if pt.prompt_size <= FIT_MAX_PROMPT:
                out.append(("prompt", pt))
            out.append(("token", pt))
    return out


def fit_terms(base, data_dir: str | Path | None = None) -> tuple[float, float]:
    """(overhead_ms, comm_ms_per_token_layer) of a VidurCostModel `base` minimizing squared relative
    error on the fit set."""
    base = base.with_terms(0.0, 0.0)
    layers = base.profile.layers
    rows = []
    for what, pt in fit_set(points_for(base, data_dir)):
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

"""Vidur per-layer operator profiles as interpolating tables (times in milliseconds, one GPU of the TP group).

Each table averages duplicate profile rows (the `median` statistic of each), then makes time non-decreasing
in the work along each axis by isotonic (least-squares monotone) regression. The raw medians wobble, and
some single points spike (e.g. a 2-token GEMM timed faster than a 1-token one, or one token count 20%
above its neighbours); a cost model that rewarded padding would mislead a scheduler, so the noise is
pooled with its neighbours rather than reproduced. A running maximum would do the same but carry every
spike forward to all larger sizes. `raw` keeps the unsmoothed grid for tests and docs/cost-models.md.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helios.sim.profile_input import check_monotone, numbers, read_rows

# Operators that run once per transformer layer on every token of the batch (the "MLP-side" ops of
# Vidur's mlp.csv). `emb` runs once per forward pass and is kept apart.
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
# The operators whose work grows with the MLP's intermediate size.
MLP_OPS = ("mlp_up_proj", "mlp_act", "mlp_down_proj")


def isotonic(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit of y (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in np.asarray(y, dtype=np.float64):
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks[-1]
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return np.concatenate([np.full(int(n), m) for m, n in blocks])


def _f(value: str) -> float:
    # Cells reach here checked (helios.sim.profile_input); only a column that a row's kind does not
    # use (a decode row's attn_prefill) may be empty.
    return float(value) if value not in ("", None) else 0.0


_EMB = "time_stats.emb.median"
_LAYER_COLUMNS = tuple(f"time_stats.{op}.median" for op in LAYER_OPS)
_ATTENTION_COLUMNS = {"False": ("time_stats.attn_decode.median", "time_stats.attn_input_reshape.median",
                                "time_stats.attn_output_reshape.median"),
                      "True": ("time_stats.attn_prefill.median", "time_stats.attn_input_reshape.median",
                               "time_stats.attn_output_reshape.median")}


@dataclass(frozen=True)
class LinearOpsTable:
    """Per-layer time of the token-parallel operators vs num_tokens, for one TP degree.

    Interpolation is piecewise-linear in num_tokens (the grid is 1, 2, 4, 8, then every 8 to 32 tokens up
    to 4096, so log vs linear spacing makes no practical difference). Beyond the largest profiled count
    the time grows in proportion to the tokens: at 4096 tokens the GEMMs are compute-bound.
    """

    tokens: np.ndarray
    layer_ms_grid: np.ndarray
    emb_ms_grid: np.ndarray
    raw: np.ndarray
    n_embd: int

    @classmethod
    def from_csv(cls, path: Path, tp: int, mlp_scale: float = 1.0, repairs: list | None = None) -> LinearOpsTable:
        """`mlp_scale` multiplies the MLP operators (`MLP_OPS`): another intermediate size, same hidden.
        A ProfileError names an empty, non-numeric or non-monotone cell, unless `repairs` (a list)
        collects the repairs made instead (helios.sim.profile_input)."""
        ops: dict[int, list[list[float]]] = defaultdict(list)  # num_tokens -> each row's op times + emb
        lines: dict[int, int] = {}
        n_embd = 0
        header, rows = read_rows(path)
        scale = np.array([mlp_scale if op in MLP_OPS else 1.0 for op in LAYER_OPS] + [1.0])
        for line, r in rows:
            if int(r["num_tensor_parallel_workers"]) != tp:
                continue
            n_embd = int(r["n_embd"])
            cells = numbers(path, header, line, r, _LAYER_COLUMNS + (_EMB,), repairs)
            if cells is not None:
                ops[int(r["num_tokens"])].append(list(np.array(cells) * scale))
                lines.setdefault(int(r["num_tokens"]), line)
        if not ops:
            raise ValueError(f"{path.name}: no rows with tensor parallel degree {tp}")
        tokens = np.array(sorted(ops), dtype=np.float64)
        per_op = np.array([np.mean(ops[int(n)], axis=0) for n in tokens])  # [T, ops + emb]
        mean = np.stack([per_op[:, :-1].sum(axis=1), per_op[:, -1]], axis=1)
        _check_tokens(path, header, tokens, [lines[int(n)] for n in tokens], per_op, repairs)
        return cls(tokens, isotonic(mean[:, 0]), isotonic(mean[:, 1]), mean[:, 0].copy(), n_embd)

    def _eval(self, grid: np.ndarray, n: float) -> float:
        top = self.tokens[-1]
        if n > top:
            return float(grid[-1] * n / top)
        return float(np.interp(max(n, self.tokens[0]), self.tokens, grid))

    def layer_ms(self, n: float) -> float:
        return self._eval(self.layer_ms_grid, n) if n > 0 else 0.0

    def emb_ms(self, n: float) -> float:
        return self._eval(self.emb_ms_grid, n) if n > 0 else 0.0


def _lerp_axis(axis: list[float], x: float) -> tuple[int, int, float]:
    """Bracketing indices and weight of x on a sorted axis, clamped at both ends."""
    if x <= axis[0]:
        return 0, 0, 0.0
    if x >= axis[-1]:
        return len(axis) - 1, len(axis) - 1, 0.0
    hi = bisect.bisect_right(axis, x)
    lo = hi - 1
    return lo, hi, (x - axis[lo]) / (axis[hi] - axis[lo])


@dataclass(frozen=True)
class DecodeAttentionTable:
    """attn_decode (+ its reshapes) per layer vs (batch_size, kv_cache_size), bilinear on the full grid.

    As in Vidur, a batch is summarized by its size and its mean KV length. Outside the grid: batch beyond
    the largest profiled is scaled in proportion (decode attention streams each row's KV once); KV beyond
    the largest is extended with the slope of the top quarter of the KV axis.
    """

    batches: list[float]
    kvs: list[float]
    grid: np.ndarray  # [batch, kv], monotone along both axes
    raw: np.ndarray

    @classmethod
    def from_rows(cls, rows: list[dict[str, str]]) -> DecodeAttentionTable:
        cells: dict[tuple[int, int], list[float]] = defaultdict(list)
        for r in rows:
            t = (_f(r["time_stats.attn_decode.median"]) + _f(r["time_stats.attn_input_reshape.median"])
                 + _f(r["time_stats.attn_output_reshape.median"]))
            cells[(int(r["batch_size"]), int(r["kv_cache_size"]))].append(t)
        batches = sorted({b for b, _ in cells})
        kvs = sorted({k for _, k in cells})
        raw = np.array([[np.mean(cells[(b, k)]) for k in kvs] for b in batches])
        # Isotonic along KV, then along batch: the projection preserves elementwise order, so the
        # second pass keeps the first pass's monotonicity.
        grid = np.apply_along_axis(isotonic, 0, np.apply_along_axis(isotonic, 1, raw))
        return cls([float(b) for b in batches], [float(k) for k in kvs], grid, raw)

    def _at(self, batch: float, kv: float) -> float:
        i0, i1, wb = _lerp_axis(self.batches, batch)
        j0, j1, wk = _lerp_axis(self.kvs, kv)
        g = self.grid
        top = g[i0, j0] * (1 - wk) + g[i0, j1] * wk
        bottom = g[i1, j0] * (1 - wk) + g[i1, j1] * wk
        return float(top * (1 - wb) + bottom * wb)

    def ms(self, batch: float, mean_kv: float) -> float:
        if batch <= 0:
            return 0.0
        scale = 1.0
        if batch > self.batches[-1]:
            scale, batch = batch / self.batches[-1], self.batches[-1]
        t = self._at(batch, mean_kv)
        if mean_kv > self.kvs[-1]:
            ref = self.kvs[bisect.bisect_left(self.kvs, 0.75 * self.kvs[-1])]
            slope = (self._at(batch, self.kvs[-1]) - self._at(batch, ref)) / (self.kvs[-1] - ref)
            t += max(slope, 0.0) * (mean_kv - self.kvs[-1])
        return t * scale


@dataclass(frozen=True)
class PrefillAttentionTable:
    """attn_prefill per layer vs (prefill_chunk_size, kv_cache_size) for one (equivalent) row.

    The profile is triangular (chunk + kv <= 4096). Inside it: linear along kv within each profiled chunk
    row, then linear between the two neighbouring chunk rows. Outside it the cost follows the work, fitted
    once by least squares over the whole profile as t = a + b*c + d*c*kv + e*c^2: past a row's last KV the
    row grows by d*c per extra KV token; chunks beyond the largest scale as c^2 from the largest row plus
    d*c*kv. Chunks below the smallest profiled (64) cost what 64 does (launch-bound there).
    """

    chunks: list[float]
    row_kvs: list[list[float]]
    row_ms: list[np.ndarray]  # monotone in kv within each row
    raw: dict[tuple[int, int], float]
    kv_slope: float  # d: ms per (query token x KV token)

    @classmethod
    def from_rows(cls, rows: list[dict[str, str]]) -> PrefillAttentionTable:
        cells: dict[tuple[int, int], list[float]] = defaultdict(list)
        for r in rows:
            cells[(int(r["prefill_chunk_size"]), int(r["kv_cache_size"]))].append(
                _f(r["time_stats.attn_prefill.median"]) + _f(r["time_stats.attn_input_reshape.median"])
                + _f(r["time_stats.attn_output_reshape.median"]))
        raw = {k: float(np.mean(v)) for k, v in cells.items()}
        chunks = sorted({c for c, _ in raw})
        row_kvs, row_ms = [], []
        for c in chunks:
            kvs = sorted(k for cc, k in raw if cc == c)
            row_kvs.append([float(k) for k in kvs])
            row_ms.append(isotonic(np.array([raw[(c, k)] for k in kvs])))
        # Keep the rows monotone in the chunk as well, at their shared KV points.
        for i in range(1, len(chunks)):
            prev = np.interp(row_kvs[i], row_kvs[i - 1], row_ms[i - 1])
            row_ms[i] = np.maximum(row_ms[i], prev)
        c = np.array([k[0] for k in raw], dtype=np.float64)
        kv = np.array([k[1] for k in raw], dtype=np.float64)
        y = np.array(list(raw.values()))
        features = np.stack([np.ones_like(c), c, c * kv, c * c], axis=1)
        coef, *_ = np.linalg.lstsq(features / y[:, None], np.ones_like(y), rcond=None)  # relative error
        return cls([float(x) for x in chunks], row_kvs, row_ms, raw, max(float(coef[2]), 0.0))

    def _row(self, i: int, kv: float) -> float:
        kvs, ms = self.row_kvs[i], self.row_ms[i]
        if kv >= kvs[-1]:
            return float(ms[-1] + self.kv_slope * self.chunks[i] * (kv - kvs[-1]))
        return float(np.interp(kv, kvs, ms))

    def ms(self, chunk: float, kv: float) -> float:
        if chunk <= 0:
            return 0.0
        kv = max(kv, 0.0)
        top = self.chunks[-1]
        if chunk > top:
            return self._row(len(self.chunks) - 1, 0.0) * (chunk / top) ** 2 + self.kv_slope * chunk * kv
        i0, i1, w = _lerp_axis(self.chunks, chunk)
        return self._row(i0, kv) * (1 - w) + self._row(i1, kv) * w


def _check_tokens(path, header, tokens, lines, per_op, repairs) -> None:
    """More tokens never make a layer (or the embedding) cheaper, past the tolerance; a drop is
    named by the operator column that fell most from the row with the largest time before it."""
    layer = per_op[:, :-1].sum(axis=1)
    points, best = [], 0
    for i in range(len(tokens)):
        op = int(np.argmax(per_op[best, :-1] - per_op[i, :-1]))
        points.append((tokens[i], lines[i], float(layer[i]), _LAYER_COLUMNS[op]))
        best = i if layer[i] >= layer[best] else best
    check_monotone(path, header, points, repairs, "the layer time")
    check_monotone(path, header, [(t, ln, float(e), _EMB) for t, ln, e in zip(tokens, lines, per_op[:, -1])],
                   repairs, "the embedding time")


def load_attention(path: Path, repairs: list | None = None) -> tuple[DecodeAttentionTable, PrefillAttentionTable]:
    """Both attention tables; a ProfileError names an empty or non-numeric cell that a row uses,
    unless `repairs` collects the rows dropped instead."""
    header, numbered = read_rows(path)
    rows = [r for line, r in numbered
            if numbers(path, header, line, r, _ATTENTION_COLUMNS.get(r["is_prefill"], ()), repairs) is not None]
    decode = [r for r in rows if r["is_prefill"] == "False"]
    prefill = [r for r in rows if r["is_prefill"] == "True"]
    return DecodeAttentionTable.from_rows(decode), PrefillAttentionTable.from_rows(prefill)


def equivalent_prefill_row(chunks: list[int], kvs: list[int]) -> tuple[float, float]:
    """One row with the same attention work as several prefill rows (Vidur's equivalent batch, refined).

    Vidur collapses rows into chunk sqrt(sum c_i^2) (keeping the quadratic causal term) and KV sum(kv_i).
    Summing KV overstates the c*kv term by sqrt(rows) for equal rows, so we instead pick kv_eq with
    c_eq * kv_eq = sum(c_i * kv_i); both terms of the work c*kv + c^2/2 are then preserved exactly.
    """
    c_eq = math.sqrt(sum(c * c for c in chunks))
    if c_eq == 0:
        return 0.0, 0.0
    return c_eq, sum(c * k for c, k in zip(chunks, kvs)) / c_eq


# Host-side steps Vidur times around each model step (vLLM-style engine), summed as the host overhead.
HOST_STEPS = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs")


@dataclass(frozen=True)
class HostOverheadTable:
    """Per-step host time (ms) vs batch size for one model, from vidur_a100_cpu_overheads.csv.

    Piecewise-linear in batch; outside the profiled 8..128 the end segments are extended (floored at 0).
    """

    batches: np.ndarray
    ms_grid: np.ndarray

    @classmethod
    def from_csv(cls, path: Path, model: str) -> HostOverheadTable:
        cells: dict[int, list[float]] = defaultdict(list)
        header, rows = read_rows(path)
        for line, r in rows:
            if r["model_name"] == model:
                steps = numbers(path, header, line, r, tuple(f"{s}_median" for s in HOST_STEPS), None)
                cells[int(r["batch_size"])].append(sum(steps))
        if not cells:
            raise ValueError(f"{path.name}: no host-overhead rows for model {model!r}")
        batches = np.array(sorted(cells), dtype=np.float64)
        return cls(batches, np.array([np.mean(cells[int(b)]) for b in batches]))

    def ms(self, batch: float) -> float:
        b, y = self.batches, self.ms_grid
        if len(b) == 1:
            return float(y[0])
        if batch < b[0]:
            return max(0.0, float(y[0] + (y[1] - y[0]) / (b[1] - b[0]) * (batch - b[0])))
        if batch > b[-1]:
            return float(y[-1] + (y[-1] - y[-2]) / (b[-1] - b[-2]) * (batch - b[-1]))
        return float(np.interp(batch, b, y))

"""Prepared-graph duration models for the simulator: Vidur-calibrated and synthetic (docs/cost-models.md).

A cost model answers one question: how long does this prepared graph take when these rows are active?
`context_lens` are the KV lengths (tokens already cached before the graph) of the ACTIVE rows. Padded rows
are absent from it, yet the graph still pays its physical shape: the token-parallel layers run on every
padded row and position, while attention only does work for the active rows.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from helios.errors import ConfigError
from helios.graphs import GraphKind, GraphShape
from helios.engine.core import CostModel  # noqa: F401  (re-exported: the protocol lives with the engines)
from helios.sim.cost_rows import check_packed, check_rows, linear_tokens
from helios.sim.splitwise import fit_terms
from helios.sim.traces import data_file
from helios.sim.profile_input import ProfileError
from helios.sim.vidur_tables import (LAYER_OPS, DecodeAttentionTable, LinearOpsTable,
                                     PrefillAttentionTable, equivalent_prefill_row, load_attention)

NS_PER_MS = 1_000_000
ATTENTION_FILE = "vidur_a100_llama2-70b-shape_tp2_attention.csv"

# A100-80GB SXM HBM2e 2.039 TB/s vs H100-80GB SXM HBM3 3.35 TB/s: decode attention is bandwidth-bound,
# and FlashAttention-2's forward runs roughly 1.5-1.7x the A100 rate on H100, so one factor serves both.
H100_OVER_A100_ATTENTION = 2.039 / 3.35


@dataclass(frozen=True)
class VidurProfile:
    """Which Vidur files make a model/GPU pair, and how the shared attention profile is adapted to it."""

    name: str
    mlp_file: str
    tp: int
    layers: int
    attention_scale: float  # multiplies the A100 70B-shape TP2 attention tables
    decode_kv_scale: float  # KV heads per GPU / 4: multiplies the KV-dependent part of decode attention
    splitwise_hardware: str | None  # Splitwise rows (llama2-70b, this TP) that fit overhead and comm terms
    default_overhead_ms: float = 0.0  # used only when there are no Splitwise rows to fit
    mlp_scale: float = 1.0  # multiplies the MLP operators: the model's intermediate size / the profiled one
    terms_from: str | None = None  # a profile whose fitted overhead and comm terms this one borrows


# The A100 "70b-shape" MLP file is CodeLlama-34B's MLP (n_expanded_embd 22016; 48 layers), not Llama-2-70B's
# (28672; 80 layers); its attention shape (hidden 8192, 64 q / 8 kv heads) fits both models.
CODELLAMA_34B_INTERMEDIATE = 22016
LLAMA2_70B_INTERMEDIATE = 28672

PROFILES = {
    # CodeLlama-34B on two A100s, the matched Vidur attention+mlp set as measured. No end-to-end figures
    # exist for it: it borrows the A100 TP2 terms fitted for the 70B estimate below (same hidden size and
    # GPUs, so the same all-reduce bytes per token and layer; the LM head and sampler are alike too).
    "a100-34b-tp2": VidurProfile("a100-34b-tp2", "vidur_a100_llama2-70b-shape_tp2_mlp.csv", 2, 48, 1.0, 1.0,
                                 None, terms_from="a100-70b-tp2"),
    # A Llama-2-70B estimate on two A100s: the same files with the MLP operators scaled by the intermediate
    # sizes 28672 / 22016 (the GEMMs' work and weight bytes grow in proportion), 80 layers; fitted to
    # Splitwise's A100 TP2 Llama-2-70B figures.
    "a100-70b-tp2": VidurProfile("a100-70b-tp2", "vidur_a100_llama2-70b-shape_tp2_mlp.csv", 2, 80, 1.0, 1.0,
                                 "a100-80gb", mlp_scale=LLAMA2_70B_INTERMEDIATE / CODELLAMA_34B_INTERMEDIATE),
    "h100-70b": VidurProfile("h100-70b", "vidur_h100_llama2-70b_mlp.csv", 2, 80, H100_OVER_A100_ATTENTION,
                             1.0, "h100-80gb"),
    # Llama-2-7B on one H100: 32 q heads per GPU as in the 70B TP2 profile, but 32 KV heads instead of 4,
    # so decode attention streams 8x the KV bytes; prefill attention is compute-bound on the q heads.
    # No end-to-end figures exist to fit the per-graph overhead: 1.5 ms is assumed (see the docs).
    "h100-7b": VidurProfile("h100-7b", "vidur_h100_llama2-7b_mlp.csv", 1, 32, H100_OVER_A100_ATTENTION,
                            8.0, None, default_overhead_ms=1.5),
}


class VidurCostModel:
    """Per-layer Vidur operator times x layers, plus embedding, TP communication and a per-graph overhead.

    duration = overhead + emb(n) + layers * (linear(n) + comm_per_token * n + attention)
    where n = linear_tokens(shape). Attention by kind, for the active rows:
      prefill      one equivalent row (vidur_tables.equivalent_prefill_row) of each row's chunk over its KV:
                   W tokens per row unless `chunks` says what each packed row really consumes
      decode       attn_decode(active rows, mean KV), as Vidur does
      speculative  verification reads each row's KV once for its W queries (memory-bound), so: decode
                   attention at mean KV + W - 1, times (1 + q * (W - 1)), where q is the profiled cost of
                   one more query per row: (prefill at chunk 64 / decode at batch 1 - 1) / 63, averaged
                   over the KV lengths both tables cover (`verify_query_cost`)
      mixed        the decode rows (chunk 0) as speculative (W = 1: plain decode) plus prefill attention of
                   each prompt row's chunk over its KV, as a packed forward prices its chunks
                   (`chunks_attention_ms`: several prompt rows sharing the prompt capacity pay for their
                   own chunks, no per-row padding); without `chunks`, every active row decodes and one
                   full prefill_capacity chunk over nothing cached stands for the prompt row
    `chunks` (optional, one per active row) are the prompt tokens each row consumes.
    """

    def __init__(self, profile: VidurProfile, linear: LinearOpsTable, decode: DecodeAttentionTable,
                 prefill: PrefillAttentionTable, *, overhead_ms: float, comm_ms_per_token_layer: float):
        self.profile = profile
        self.linear = linear
        self.decode = decode
        self.prefill = prefill
        self.overhead_ms = float(overhead_ms)
        self.comm_ms_per_token_layer = float(comm_ms_per_token_layer) if profile.tp > 1 else 0.0
        self.verify_query_cost = _verify_query_cost(decode, prefill)

    @classmethod
    def from_data(cls, profile: str = "a100-70b-tp2", data_dir: str | Path | None = None, *,
                  overhead_ms: float | None = None, comm_us_per_token_layer: float | None = None,
                  ) -> VidurCostModel:
        """Load a profile; the overhead and comm terms are fitted to Splitwise unless both are given."""
        if profile not in PROFILES:
            raise ConfigError("profile", f"unknown profile {profile!r}; known: {sorted(PROFILES)}")
        p = PROFILES[profile]
        linear, decode, prefill = _tables(str(data_path(p.mlp_file, data_dir)), p.tp,
                                          str(data_path(ATTENTION_FILE, data_dir)), p.mlp_scale)
        base = cls(p, linear, decode, prefill, overhead_ms=0.0, comm_ms_per_token_layer=0.0)
        if overhead_ms is not None and comm_us_per_token_layer is not None:
            return base.with_terms(overhead_ms, comm_us_per_token_layer / 1000.0)
        if p.terms_from is not None:
            lender = cls.from_data(p.terms_from, data_dir)
            return base.with_terms(lender.overhead_ms if overhead_ms is None else overhead_ms,
                                   lender.comm_ms_per_token_layer if comm_us_per_token_layer is None
                                   else comm_us_per_token_layer / 1000.0)
        if p.splitwise_hardware is None:
            return base.with_terms(p.default_overhead_ms if overhead_ms is None else overhead_ms,
                                   (comm_us_per_token_layer or 0.0) / 1000.0)
        fitted_overhead, fitted_comm = fit_terms(base, data_dir)
        return base.with_terms(fitted_overhead if overhead_ms is None else overhead_ms,
                               fitted_comm if comm_us_per_token_layer is None else comm_us_per_token_layer / 1e3)

    @classmethod
    def from_profile_dir(cls, directory: str | Path, *, layers: int = 80, overhead_ms: float = 0.0,
                         comm_us_per_token_layer: float = 0.0, tp: int | None = None,
                         repairs: list | None = None) -> VidurCostModel:
        """A user's Vidur profile (`flare sim report --profile DIR`): DIR holds Vidur's `attention.csv`
        and `mlp.csv` (or exactly one `*attention*.csv` and one `*mlp*.csv`) for one model and GPU.

        The TP degree is read from the MLP file (its smallest `num_tensor_parallel_workers`); nothing
        there gives the layer count or the per-graph overhead, so they are arguments (default: 80
        layers, Llama-2-70B, and no overhead; helios.sim.profile_shape reads them from flags or a
        model.json). `tp` picks the MLP file's rows of that TP degree (default: the smallest). A
        ConfigError names a missing file or column, and an empty, non-numeric or non-monotone cell by
        file, line and column, unless `repairs` (a list) collects the repairs made instead
        (helios.sim.profile_input).
        """
        directory = Path(directory)
        attention, mlp = _profile_file(directory, "attention"), _profile_file(directory, "mlp")
        _require_columns(mlp, ("num_tokens", "num_tensor_parallel_workers", "n_embd", "time_stats.emb.median")
                         + tuple(f"time_stats.{op}.median" for op in LAYER_OPS))
        _require_columns(attention, ("batch_size", "kv_cache_size", "prefill_chunk_size", "is_prefill",
                                     "time_stats.attn_decode.median", "time_stats.attn_prefill.median"))
        with open(mlp, newline="") as fh:
            try:
                degrees = {int(r["num_tensor_parallel_workers"]) for r in csv.DictReader(fh)}
            except ValueError as exc:
                raise ConfigError("profile", f"{mlp}: bad num_tensor_parallel_workers ({exc})") from None
        if tp is not None and tp not in degrees:
            raise ConfigError("profile", f"{mlp} has no rows for tensor parallelism {tp} (it has "
                                         f"{', '.join(map(str, sorted(degrees)))})")
        tp = min(degrees) if tp is None else tp
        profile = VidurProfile(f"dir:{directory.name}", mlp.name, tp, layers, 1.0, 1.0, None,
                               default_overhead_ms=overhead_ms)
        try:
            linear = LinearOpsTable.from_csv(mlp, tp, repairs=repairs)
            decode, prefill = load_attention(attention, repairs)
        except ProfileError as exc:
            raise ConfigError("profile", str(exc)) from None
        except (KeyError, ValueError) as exc:
            raise ConfigError("profile", f"{directory}: malformed profile ({type(exc).__name__}: {exc})") from None
        return cls(profile, linear, decode, prefill, overhead_ms=overhead_ms,
                   comm_ms_per_token_layer=comm_us_per_token_layer / 1000.0)

    def with_terms(self, overhead_ms: float, comm_ms_per_token_layer: float) -> VidurCostModel:
        return VidurCostModel(self.profile, self.linear, self.decode, self.prefill, overhead_ms=overhead_ms,
                              comm_ms_per_token_layer=comm_ms_per_token_layer)

    # -- components, in milliseconds -----------------------------------------------------------------

    def decode_attention_ms(self, rows: float, mean_kv: float) -> float:
        """Per-layer decode attention, adapted to the profile's GPU and KV heads."""
        t = self.decode.ms(rows, mean_kv)
        if self.profile.decode_kv_scale != 1.0 and rows > 0:
            floor = self.decode.ms(rows, 0.0)  # the KV-independent part (launch, q/o traffic)
            t = floor + self.profile.decode_kv_scale * (t - floor)
        return t * self.profile.attention_scale

    def prefill_attention_ms(self, chunks: list[int], kvs: list[int]) -> float:
        c_eq, kv_eq = equivalent_prefill_row(chunks, kvs)
        return self.prefill.ms(c_eq, kv_eq) * self.profile.attention_scale

    def attention_ms(self, shape: GraphShape, context_lens: Sequence[int],
                     chunks: Sequence[int] | None = None) -> float:
        kind, w = shape.kind, shape.token_capacity
        if kind.is_prefill:
            # Packed rows pay for their own tokens; without `chunks` each row is a full W-token chunk.
            rows = [w] * len(context_lens) if chunks is None else list(chunks)
            return self.prefill_attention_ms(rows, list(context_lens)) if context_lens else 0.0
        prompt: list[tuple[int, int]] = []
        decode = list(context_lens)
        if kind is GraphKind.MIXED:
            if chunks is None:
                prompt = [(shape.prefill_capacity, 0)]
            else:
                prompt = [(c, k) for c, k in zip(chunks, context_lens) if c > 0]
                decode = [k for c, k in zip(chunks, context_lens) if c <= 0]
        t = 0.0
        if decode:
            mean_kv = sum(decode) / len(decode)
            # W verification queries per row read the row's KV once: decode attention at KV + W - 1,
            # plus the profiled cost q of each extra query.
            t = self.decode_attention_ms(len(decode), mean_kv + w - 1) * (1 + self.verify_query_cost * (w - 1))
        # Each prompt row's causal chunk over its own cached prefix, as a packed forward runs it.
        t += self.chunks_attention_ms(prompt)
        return t

    def chunks_attention_ms(self, prefill: Sequence[tuple[int, int]]) -> float:
        """Per-layer attention of packed prompt chunks, (chunk, cached KV) each: varlen attention
        runs each request's chunk over its own KV, so per chunk, as Vidur 0.0.26 prices it. Shared by
        the packed forward (Sarathi-Serve, vLLM) and a mixed graph's prompt rows."""
        return sum(self.prefill_attention_ms([c], [k]) for c, k in prefill)

    def breakdown_ms(self, shape: GraphShape, context_lens: Sequence[int], *,
                     chunks: Sequence[int] | None = None) -> dict[str, float]:
        n = linear_tokens(shape)
        layers = self.profile.layers
        return {
            "overhead": self.overhead_ms,
            "embedding": self.linear.emb_ms(n),
            "linear": layers * self.linear.layer_ms(n),
            "comm": layers * self.comm_ms_per_token_layer * n,
            "attention": layers * self.attention_ms(shape, context_lens, chunks),
        }

    def duration_ns(self, shape: GraphShape, context_lens: Sequence[int], *,
                    chunks: Sequence[int] | None = None) -> int:
        """Graph time; `chunks` are the active rows' prompt tokens (prefill and mixed graphs)."""
        check_rows(shape, context_lens, chunks)
        total = sum(self.breakdown_ms(shape, context_lens, chunks=chunks).values())
        return int(round(total * NS_PER_MS))

    def chunked_duration_ns(self, shape: GraphShape, chunks: Sequence[int], context_lens: Sequence[int]) -> int:
        return self.duration_ns(shape, context_lens, chunks=chunks)


    def packed_breakdown_ms(self, chunks: Sequence[int], context_lens: Sequence[int]) -> dict[str, float]:
        """One varlen forward (vLLM, Sarathi-Serve): row i runs chunks[i] prompt tokens over context_lens[i]
        cached ones, or one decode query when chunks[i] is 0. The linear layers run once on the real
        packed tokens (no padding, one weight pass), prefill attention per chunk over its own context,
        decode attention over the decode rows (batch size and mean KV), one per-forward overhead."""
        n = sum(c if c > 0 else 1 for c in chunks)
        decode_kv = [k for c, k in zip(chunks, context_lens) if c <= 0]
        prefill = [(c, k) for c, k in zip(chunks, context_lens) if c > 0]
        attention = 0.0
        if decode_kv:
            attention += self.decode_attention_ms(len(decode_kv), sum(decode_kv) / len(decode_kv))
        attention += self.chunks_attention_ms(prefill)
        layers = self.profile.layers
        return {"overhead": self.overhead_ms, "embedding": self.linear.emb_ms(n),
                "linear": layers * self.linear.layer_ms(n), "comm": layers * self.comm_ms_per_token_layer * n,
                "attention": layers * attention}

    def packed_duration_ns(self, chunks: Sequence[int], context_lens: Sequence[int]) -> int:
        """Time of one packed varlen forward (see `packed_breakdown_ms`)."""
        check_packed(chunks, context_lens)
        return int(round(sum(self.packed_breakdown_ms(chunks, context_lens).values()) * NS_PER_MS))


def _verify_query_cost(decode: DecodeAttentionTable, prefill: PrefillAttentionTable) -> float:
    """Relative cost of one more query position per row, from a 64-query vs a 1-query row at batch 1."""
    c = prefill.chunks[0]
    kvs = [k for k in decode.kvs if k <= prefill.row_kvs[0][-1]]
    ratios = [prefill.ms(c, k) / decode.ms(1, k) - 1 for k in kvs]
    return max(sum(ratios) / len(ratios) / (c - 1), 0.0) if ratios else 0.0


@functools.lru_cache(maxsize=8)
def _tables(mlp_path: str, tp: int, attention_path: str, mlp_scale: float = 1.0
            ) -> tuple[LinearOpsTable, DecodeAttentionTable, PrefillAttentionTable]:
    # Parsing the 14k-row attention profile takes a noticeable fraction of a second; tables are immutable.
    return (LinearOpsTable.from_csv(Path(mlp_path), tp, mlp_scale), *_attention(attention_path))


@functools.lru_cache(maxsize=4)
def _attention(attention_path: str) -> tuple[DecodeAttentionTable, PrefillAttentionTable]:
    return load_attention(Path(attention_path))


def _profile_file(directory: Path, kind: str) -> Path:
    if not directory.is_dir():
        raise ConfigError("profile", f"profile directory not found: {directory}")
    exact = directory / f"{kind}.csv"
    if exact.is_file():
        return exact
    found = sorted(directory.glob(f"*{kind}*.csv"))
    if len(found) != 1:
        raise ConfigError("profile", f"{directory}: expected {kind}.csv (or exactly one *{kind}*.csv), "
                          f"found {', '.join(f.name for f in found) or 'none'}")
    return found[0]


def _require_columns(path: Path, columns) -> None:
    with open(path, newline="") as fh:
        header = next(csv.reader(fh), [])
    missing = [c for c in columns if c not in header]
    if missing:
        raise ConfigError("profile", f"{path}: missing column(s) {', '.join(missing)}")


def data_path(name: str, data_dir: str | Path | None) -> Path:
    """A data file by name: from `data_dir` when given, else the project's data folder."""
    return data_file(name, None if data_dir is None else Path(data_dir) / name)

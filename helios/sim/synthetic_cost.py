"""A documented affine cost model for tests and benches (docs/cost-models.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from helios.graphs import GraphKind, GraphShape
from helios.sim.cost_rows import check_packed, check_rows, linear_tokens


@dataclass(frozen=True)
class SyntheticCostModel:
    """A documented affine model for tests (all times in ns; a, b, c below).

    decode, speculative  a_dec + b_dec * n + c_kv * sum(ctx * W) / 1000
    prefill              a_pre + b_pre * n + c_pair * sum(c * (ctx + c / 2)) / 1e6, c = W or the row's chunk
    mixed                a_dec + b_dec (B - 1) W + c_kv sum(decode ctx * W) / 1000 + b_pre C
                         + c_pair c (ctx + c / 2) / 1e6 per prompt row (c = C over 0 without chunks):
                         several prompt rows sharing C pay each its own chunk's pairs, as the packed
                         forward prices them (no per-row padding)
    snapshot, restore    a_state; vision a_pre + b_pre * B * W
    n = linear_tokens(shape) (physical, padded) so padding always costs; context terms use active rows.
    """

    a_dec: float = 1_000_000
    b_dec: float = 10_000
    c_kv: float = 1_000
    a_pre: float = 1_000_000
    b_pre: float = 5_000
    c_pair: float = 1_000
    a_state: float = 200_000

    @classmethod
    def realistic_small(cls) -> SyntheticCostModel:
        """Loosely a 7-8B model (bf16, GQA) on one H100.

        Decode reads ~16 GB of weights per step (~5 ms at 3.35 TB/s) plus launch gaps: a_dec = 6.9 ms;
        each extra row ~0.06 ms; KV ~128 KB per token is ~0.04 ms per 1000 cached tokens read. So B=1
        at 1k context is ~7.0 ms and B=64 at 512 context ~12 ms. Prefill is compute-bound at ~0.04 ms
        per token after a 5 ms fixed part; attention ~1.3 ms per million query-key pairs.
        """
        return cls(a_dec=6_900_000, b_dec=60_000, c_kv=40_000, a_pre=5_000_000, b_pre=40_000,
                   c_pair=1_300_000, a_state=500_000)

    def duration_ns(self, shape: GraphShape, context_lens: Sequence[int], *,
                    chunks: Sequence[int] | None = None) -> int:
        kind, w = shape.kind, shape.token_capacity
        check_rows(shape, context_lens, chunks)
        if kind in (GraphKind.SNAPSHOT, GraphKind.RESTORE):
            return int(round(self.a_state))
        if kind is GraphKind.VISION:
            return int(round(self.a_pre + self.b_pre * shape.batch_capacity * w))
        if kind.is_prefill:
            rows = [w] * len(context_lens) if chunks is None else chunks
            pairs = sum(c * (k + c / 2) for c, k in zip(rows, context_lens))
            t = self.a_pre + self.b_pre * linear_tokens(shape) + self.c_pair * pairs / 1e6
            return int(round(t))
        decode, prompt = list(context_lens), []
        if kind is GraphKind.MIXED:
            prompt = [(shape.prefill_capacity, 0)]
            if chunks is not None:
                prompt = [(c, k) for c, k in zip(chunks, context_lens) if c > 0]
                decode = [k for c, k in zip(chunks, context_lens) if c <= 0]
        # Mixed: the decode formula on the (B - 1) x W decode rows, b_pre on the C prompt positions.
        rows = shape.target_capacity if kind is not GraphKind.MIXED else (shape.batch_capacity - 1) * w
        t = self.a_dec + self.b_dec * rows + self.c_kv * sum(decode) * w / 1000
        if kind is GraphKind.MIXED:
            t += self.b_pre * shape.prefill_capacity
            t += sum(self._chunk_pairs_ns(c, k) for c, k in prompt)
        return int(round(t))

    def _chunk_pairs_ns(self, chunk: int, kv: int) -> float:
        """A prompt chunk's causal attention over its own cached prefix (packed and mixed alike)."""
        return self.c_pair * chunk * (kv + chunk / 2) / 1e6

    def chunked_duration_ns(self, shape: GraphShape, chunks: Sequence[int], context_lens: Sequence[int]) -> int:
        return self.duration_ns(shape, context_lens, chunks=chunks)

    def packed_duration_ns(self, chunks: Sequence[int], context_lens: Sequence[int]) -> int:
        """One varlen forward: the decode formula's fixed part once, b_dec per decode row, the prefill
        terms (b_pre and pairs) per prompt chunk; nothing is padded."""
        check_packed(chunks, context_lens)
        t = self.a_dec
        for c, k in zip(chunks, context_lens):
            if c > 0:
                t += self.b_pre * c + self._chunk_pairs_ns(c, k)
            else:
                t += self.b_dec + self.c_kv * k / 1000
        return int(round(t))

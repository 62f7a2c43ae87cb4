"""Packed graphs for TorchCore: a mixed graph (prompt chunks plus decode rows) or a packed prefill
graph as ONE token sequence, laid out by prefix sums of the rows' query lengths.

Layout (the spec's "Mixed execution contract"):
- row b's query length n_b is its prompt chunk (a mixed graph's prompt row, or every row of a prefill
  graph), its pending token (an ordinary decode row) or its pending token and drafts (a
  copy-speculative row);
- row b's tokens sit at packed offsets off_b .. off_b + n_b - 1 with off_b = n_0 + ... + n_(b-1), in lane
  order and independent of slot ids; each prompt row sits at its own packed offset;
- a mixed graph's prompt rows share its prompt capacity C as one packed budget: the spec's one prompt
  row, or up to the shape's prompt_rows R (the extension of docs/scheduling-utility.md), none padded;
- the query lengths travel as one tensor [B] (zero for inactive rows); the per-position slots are
  derived from it on the device, so no second per-token layout is uploaded;
- the extent is the graph's maximum packed extent: C + (B - 1) W for a mixed graph (r >= 2 prompt rows
  need at most C + (B - r) W, so the extent holds them too), B x C for a prefill graph, whose rows
  may each exceed C as long as they fit together;
- positions past the last row (unused capacity) write only the scratch slot: no state changes;
- logits_at [B, S] names the packed positions each row samples from: the last prompt token for a
  prompt row (column 0), each of a decode row's positions for verification (columns 0 .. n_b - 1).
"""

from __future__ import annotations

from typing import Collection, Sequence

import torch

from helios.engine.model.packed import packed_forward
from helios.engine.torch_graphs import PAD_TOKEN, Packing, RowWork
from helios.graphs import GraphKind, GraphShape
from helios.scheduler.plan import ScheduledPlan


def packed_extent(shape: GraphShape) -> int:
    """Packed positions of a mixed or prefill graph (its maximum packed extent)."""
    if shape.kind is GraphKind.MIXED:
        # The prompt rows hold up to C tokens together, each of the other rows up to W.
        return shape.prefill_capacity + (shape.batch_capacity - 1) * shape.token_capacity
    if shape.kind.is_prefill:
        return shape.batch_capacity * shape.token_capacity
    raise ValueError(f"{shape.kind.value} graphs are not packed")


def needs_packing(plan: ScheduledPlan) -> bool:
    """Mixed plans, and prefill plans with a row longer than the chunk C, run packed; prefill rows that
    each fit C keep the rectangular prepared graph (the same layout and outputs as before packing)."""
    shape = plan.shape
    if shape.kind is GraphKind.MIXED:
        return True
    return shape.kind.is_prefill and int(plan.lanes.prompt_tokens.max(initial=0)) > shape.token_capacity


class PackedGraph:
    """Static buffers tokens/positions [T], query_lengths/slots [B], logits_at [B, S] of one shape."""

    def __init__(self, shape: GraphShape, scratch_slot: int, device: torch.device | str = "cpu"):
        self.shape = shape
        self.batch, self.extent = shape.batch_capacity, packed_extent(shape)
        self.columns = shape.token_capacity if shape.kind is GraphKind.MIXED else 1
        self.scratch_slot = scratch_slot
        self.device = torch.device(device)
        B, T, S = self.batch, self.extent, self.columns
        self.host = {
            "tokens": torch.full((T,), PAD_TOKEN, dtype=torch.long),
            "positions": torch.zeros(T, dtype=torch.long),
            "query_lengths": torch.zeros(B, dtype=torch.long),
            "slots": torch.full((B,), scratch_slot, dtype=torch.long),
            "logits_at": torch.zeros(B, S, dtype=torch.long),
        }
        self.buffers = self.host if self.device.type == "cpu" else {
            k: v.to(self.device) for k, v in self.host.items()}

    def pack(self, rows: Sequence[RowWork], prompt_rows: Collection[int]) -> Packing:
        """Fill the inputs for `rows` (lane order); `prompt_rows` are the indices of prompt chunks."""
        B, T = self.batch, self.extent
        if len(rows) > B:
            raise ValueError(f"{len(rows)} rows do not fit batch capacity {B}")
        mixed = self.shape.kind is GraphKind.MIXED
        prompt = sum(len(rows[b].tokens) for b in prompt_rows)
        if mixed and (len(prompt_rows) > self.shape.prompt_rows or prompt > self.shape.prefill_capacity):
            raise ValueError(f"prompt rows {sorted(prompt_rows)} hold {prompt} tokens; the graph takes at most "
                             f"{self.shape.prompt_rows} prompt rows of {self.shape.prefill_capacity} tokens together")
        h = self.host
        h["tokens"].fill_(PAD_TOKEN)
        h["positions"].zero_()  # unused capacity: scratch slot, position 0
        h["query_lengths"].zero_()
        h["slots"].fill_(self.scratch_slot)
        h["logits_at"].zero_()
        offset, offsets = 0, [0]
        for b, row in enumerate(rows):
            n = len(row.tokens)
            limit = (self.shape.prefill_capacity if b in prompt_rows else self.shape.token_capacity) if mixed else T
            if not 1 <= n <= limit:
                raise ValueError(f"row {b} has {n} query tokens; it may have 1..{limit}")
            if offset + n > T:
                raise ValueError(f"rows need {offset + n} packed tokens; the extent is {T}")
            h["tokens"][offset:offset + n] = torch.tensor(row.tokens, dtype=torch.long)
            h["positions"][offset:offset + n] = torch.arange(row.start, row.start + n)
            h["query_lengths"][b] = n
            h["slots"][b] = row.slot
            # A prompt row samples after its last token; a decode row at each of its positions.
            cols = torch.arange(self.columns)
            last = torch.full_like(cols, n - 1)
            h["logits_at"][b] = offset + (last if b in prompt_rows else torch.minimum(cols, last))
            offset += n
            offsets.append(offset)
        if self.buffers is not self.host:
            for k, v in self.host.items():
                self.buffers[k].copy_(v, non_blocking=True)
        mask = tuple(b < len(rows) and rows[b].sample for b in range(B))
        return Packing(tuple(offsets[i + 1] - offsets[i] for i in range(len(rows))), tuple(offsets),
                       tuple(h["slots"].tolist()), mask)

    def forward(self, model, cache, every_position: bool = False) -> torch.Tensor:
        """Logits [B, S, V] at logits_at for the packed inputs; with `every_position`, [T, V] at
        every packed position (index them with `self.buffers["logits_at"]` for the sampled ones)."""
        b = self.buffers
        return packed_forward(model, b["tokens"], b["positions"], b["query_lengths"], b["slots"], cache,
                              b["logits_at"], every_position)

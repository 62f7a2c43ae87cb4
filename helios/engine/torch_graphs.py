"""Prepared graphs for TorchCore: one static-shape buffer set per catalog shape, input packing,
and (on CUDA) a captured torch.cuda.CUDAGraph replayed per execution.

Packing rules (the spec's "Mixed execution contract", applied to our rectangular graphs):
- active rows come first, in lane order; row b carries its query tokens at positions
  start .. start + n - 1 of its own slot. The logical packed offset of row b is the prefix sum
  of the query lengths before it, independent of physical slot ids;
- a real row's unused tail holds padding tokens at positions strictly increasing past its last
  real position (the model's padding invariant: later real tokens overwrite them before any
  query can see them, so no valid state changes);
- rows past the active ones are padding: they write only the cache's scratch slot;
- the row sampling mask marks the rows that sample a token (decode and speculative rows, and
  prefill rows that finish their prompt); every other row's logits are ignored.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from helios.engine.model.llama import KV_WINDOW_QUANTUM
from helios.graphs import GraphKind, GraphShape

log = logging.getLogger(__name__)

PAD_TOKEN = 0
# An eager forward rounds its trimmed query length up to a multiple of this (see PreparedGraph.active).
QUERY_QUANTUM = 8


@dataclass(frozen=True, slots=True)
class RowWork:
    """One active row: its slot, query tokens, the KV position of the first one, whether it
    samples, and which of its positions the sampled logits come from (prefill rows)."""

    slot: int
    tokens: tuple[int, ...]
    start: int
    sample: bool


@dataclass(frozen=True, slots=True)
class Packing:
    """What one execution's inputs looked like (for tests and traces)."""

    query_lengths: tuple[int, ...]  # per active row, in lane order
    offsets: tuple[int, ...]  # packed token offsets: prefix sums of query_lengths (rows + 1)
    slots: tuple[int, ...]  # per physical row; padding rows hold the scratch slot
    sample_mask: tuple[bool, ...]  # per physical row

    @property
    def packed_tokens(self) -> int:
        return self.offsets[-1]


def graph_length(shape: GraphShape) -> int:
    """Query positions per row: the prefill chunk, 1 for decode, W for speculative rounds."""
    if shape.kind.is_prefill or shape.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE):
        return shape.token_capacity
    raise ValueError(f"TorchCore prepares no {shape.kind.value} graphs")


class PreparedGraph:
    """Static buffers tokens/positions [B, L], slots [B], logits_at [B] for one shape.

    Host staging tensors are filled per execution and copied into the device buffers that the
    forward (or the captured CUDA graph) reads; on the CPU they are the same tensors.
    """

    def __init__(self, shape: GraphShape, scratch_slot: int, device: torch.device | str = "cpu"):
        self.shape = shape
        self.batch, self.length = shape.batch_capacity, graph_length(shape)
        self.scratch_slot = scratch_slot
        self.device = torch.device(device)
        # Prefill rows sample one position (their last real token); the others need every row
        # position's logits (speculative verification, a scored prefill's prompt scores) or have one
        # position (decode).
        self.logits_at_used = shape.kind is GraphKind.PREFILL
        B, L = self.batch, self.length
        self.host = {
            "tokens": torch.full((B, L), PAD_TOKEN, dtype=torch.long),
            "positions": torch.arange(L).repeat(B, 1),
            "slots": torch.full((B,), scratch_slot, dtype=torch.long),
            "logits_at": torch.zeros(B, dtype=torch.long),
        }
        if self.device.type == "cpu":
            self.buffers = self.host
        else:
            self.host = {k: v.pin_memory() for k, v in self.host.items()}
            self.buffers = {k: v.to(self.device) for k, v in self.host.items()}
        # On CUDA, one captured graph per key window (capture_windows), each with its output tensor.
        self.captures: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._kv_window: int | None = None
        # The last pack's active rows, trimmed query length, and the full grid's top position + 1.
        self._used = (B, L, L)

    def pack(self, rows: Sequence[RowWork]) -> Packing:
        """Fill the static inputs for `rows` (lane order); the rest of the batch is padding."""
        B, L = self.batch, self.length
        if len(rows) > B:
            raise ValueError(f"{len(rows)} rows do not fit batch capacity {B}")
        h = self.host
        h["tokens"].fill_(PAD_TOKEN)
        h["positions"].copy_(torch.arange(L).expand(B, L))  # padding rows: scratch positions 0..L-1
        h["slots"].fill_(self.scratch_slot)
        h["logits_at"].zero_()
        lengths = []
        for b, row in enumerate(rows):
            n = len(row.tokens)
            if not 1 <= n <= L:
                raise ValueError(f"row {b} has {n} query tokens; the graph has {L} per row")
            h["tokens"][b, :n] = torch.tensor(row.tokens, dtype=torch.long)
            # Real positions start..start+n-1, then the padded tail continues past them.
            h["positions"][b] = torch.arange(row.start, row.start + L)
            h["slots"][b] = row.slot
            h["logits_at"][b] = n - 1
            lengths.append(n)
        if self.buffers is not self.host:
            for k, v in self.host.items():
                self.buffers[k].copy_(v, non_blocking=True)
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        mask = tuple(b < len(rows) and rows[b].sample for b in range(B))
        n = min(L, -(-max(lengths, default=1) // QUERY_QUANTUM) * QUERY_QUANTUM)
        self._used = (max(1, len(rows)), n, max((row.start + L for row in rows), default=L))
        return Packing(tuple(lengths), tuple(offsets), tuple(h["slots"].tolist()), mask)

    def forward(self, model, cache) -> torch.Tensor:
        """Logits for the packed inputs: [R, 1, V] for prefill (at logits_at), else [R, n, V]. A captured
        graph runs its whole shape (R = B, n = L); an eager one only the rows and positions that
        hold work (see `active`)."""
        if self.captures:
            # The smallest captured window that holds every row's positions (the padded tail too).
            window = next(w for w in self.captures if w >= self._used[2])  # keys ascend (capture)
            graph, out = self.captures[window]
            graph.replay()
            return out
        b = self.buffers
        rows, n = self.active
        # The key window the full grid would attend over (its padded tail included): the same
        # attention shapes, so the same bits, as an untrimmed forward.
        window = self._kv_window or min(-(-self._used[2] // KV_WINDOW_QUANTUM) * KV_WINDOW_QUANTUM,
                                        cache.max_context)
        return model(b["tokens"][:rows, :n], b["positions"][:rows, :n], b["slots"][:rows], cache,
                     kv_window=window, logits_at=b["logits_at"][:rows] if self.logits_at_used else None)

    @property
    def active(self) -> tuple[int, int]:
        """(rows, query positions) an eager forward runs: the active rows, and their longest query
        rounded up to a multiple of QUERY_QUANTUM (at most L).

        Why: on the CPU nothing needs the static shape, and padding costs as much as real work.
        The last chunk of a short chat prompt (often a few tokens after a checkpoint restore)
        filled a 64-token prefill row with up to 63 padding tokens, and padding rows ran whole
        rows of the model. Trimming them changes no output: rows and positions are computed on
        their own (queries attend only to positions <= their own, padding writes only the
        scratch slot or positions past a row's real tokens), the fp32 linear layers give a row
        the same bits at any row count, and the key window stays the full grid's. The rounding
        keeps SDPA's CPU kernel off query blocks of 1-3 folded rows, whose bits differed from
        the full grid's (tests/engine/test_torch_core_packing.py checks every length of a
        64-token chunk). A captured CUDA graph keeps the full shape: it replays what it captured.
        """
        if self.captures:
            return self.batch, self.length
        return self._used[0], self._used[1]

    def capture(self, model, cache) -> bool:
        """Capture this shape's forward as CUDA graphs over the static buffers, one per key window of
        capture_windows(cache.max_context); a replay runs the smallest that covers its rows. Warm-up
        and capture run padding rows only (the scratch slot), so they mutate no request state.
        Returns False (eager replay stays in use) when the model's forward cannot be captured, e.g.
        because it synchronizes with the host."""
        if self.device.type != "cuda":
            return False
        self.pack(())
        # The capture records the whole shape (every row, every position), not the trimmed one
        # an eager forward of padding would run: a replay must compute every row it may be given.
        self._used = (self.batch, self.length, self.length)
        captures = {}
        # One memory pool for this shape's windows, largest first so the smaller ones reuse its
        # blocks; replays never overlap and each output is read before the next replay.
        pool = torch.cuda.graph_pool_handle()
        try:
            for window in sorted(capture_windows(cache.max_context, self.length), reverse=True):
                self._kv_window = window
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up: allocator pools and kernel selection
                        self.forward(model, cache)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self.forward(model, cache)
                captures[window] = (graph, out)
        except Exception as exc:  # pragma: no cover - needs a GPU
            log.warning("CUDA graph capture of %s failed (%s); running it eagerly",
                        self.shape.label(), exc)
            return False
        finally:
            self._kv_window = None
        self.captures = dict(sorted(captures.items()))  # ascending windows: forward takes the first that fits
        return True


def capture_windows(max_context: int, length: int) -> list[int]:
    """Key windows a CUDA graph is captured for: 256, 512, 1024, ... below max_context, then
    max_context itself. Why: a captured graph attends over its whole window, and on an H200 a
    SmolLM2 decode step took 4.6 ms at a 512-token window and 16.8 ms at 4,160 (fp32
    attention with a mask), so short contexts should not pay for the longest one. A window
    below the graph's own length could never hold a row (positions run start .. start + L - 1),
    and one above three quarters of max_context saves too little to be worth its capture."""
    windows, w = [], 256
    while 4 * w <= 3 * max_context:
        if w >= length:
            windows.append(w)
        w *= 2
    return windows + [max_context]


class DeviceTimer:
    """The execution's device interval: perf_counter_ns on the CPU, CUDA events on a GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:  # pragma: no cover - needs a GPU
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.end_event = torch.cuda.Event(enable_timing=True)
            self.start_event.record()
        else:
            self.start_ns = time.perf_counter_ns()

    def stop(self) -> int:
        if self.cuda:  # pragma: no cover - needs a GPU
            self.end_event.record()
            self.end_event.synchronize()
            return max(1, int(self.start_event.elapsed_time(self.end_event) * 1e6))
        return max(1, time.perf_counter_ns() - self.start_ns)

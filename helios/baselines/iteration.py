"""One engine iteration under a token budget: the shared rule of the vLLM and Sarathi-Serve baselines.

Both engines build an iteration's batch once, when it starts: the running decodes (one token each)
and the prefill chunks that fit the budget they leave, chosen together, then run it as ONE varlen
forward over the real packed tokens. Nothing that arrives while it runs can join it, and the next
iteration's budget starts from zero. vLLM V1: `Scheduler.schedule()` in vllm/v1/core/sched/scheduler.py
returns one `SchedulerOutput` per step; Sarathi-Serve: `SarathiScheduler._schedule()` in
sarathi/core/scheduler/sarathi_scheduler.py returns one batch per iteration.
"""

from __future__ import annotations

import numpy as np

from helios.baselines.common import BaselineScheduler, Rows, smallest_prefill
from helios.config import PolicyConfig, SchedulerConfig
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler.plan import NO_SLOT, ScheduledPlan
from helios.scheduler.requests import PREFILL


class IterationScheduler(BaselineScheduler):
    """An iteration's decodes and prefill chunks, chosen together at its start, within `token_budget`.

    How the fixed batch runs depends on the engine:
    - `packed=True` (an engine that runs varlen forwards, SimCore): one PACKED forward over the real
      tokens when the iteration has prompt chunks; a decode-only iteration replays the smallest
      captured decode graph, as both engines pad decode-only batches to their CUDA-graph sizes.
      Prompt chunks are limited only by the budget and `max_running`, never by prepared shapes.
    - `packed=False` (an engine with prepared graphs only, the torch core): the same batch runs as
      its decode graph, then one prefill graph of the chunks chosen at the start, each chunk cut to
      what the catalog's prefill shapes hold.
    """

    default_token_budget = 2048
    blocked_admission_ends_scan = True  # a waiting request that cannot start ends the prefill scan

    def __init__(self, catalog: Catalog, policy: PolicyConfig | None = None,
                 config: SchedulerConfig | None = None, *, token_budget: int | None = None,
                 packed: bool = False, **kwargs):
        super().__init__(catalog, policy, config, **kwargs)
        budget = self.default_token_budget if token_budget is None else token_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ConfigError("token_budget", f"must be a positive integer, got {budget!r}")
        if not isinstance(packed, bool):
            raise ConfigError("packed", f"must be a bool, got {packed!r}")
        self.token_budget = budget
        self.packed = packed
        self.iteration = 0  # iterations started so far
        # Prepared-graph mode: the prefill chunks, as (handle, tokens), chosen with the decode graph
        # now being planned (`_proposed`) and with the one committed (`_pending`), which runs next.
        # Handles, not table rows: a row freed meanwhile may hold another request.
        self._proposed: list[tuple[int, int]] | None = None
        self._pending: list[tuple[int, int]] | None = None
        self._iteration_tokens = 0

    @property
    def packed_shape(self) -> GraphShape:
        """The identity (and cost entry) of this engine's packed forwards: its sequence and token limits."""
        return GraphShape(GraphKind.PACKED, self.max_running, max(self.token_budget, self.max_running))

    def iteration_decodes(self, decodes: list[int]) -> list[int]:
        """The decode rows of one iteration (all of them, unless the policy says otherwise)."""
        return decodes

    def _select(self) -> tuple[GraphShape, Rows] | None:
        self._proposed = None
        if self._pending is not None:
            rows = [(r, n) for h, n in self._pending if (r := self._unchanged(h, n)) is not None]
            if rows:  # the started iteration's prefill half, exactly as chosen at its start
                return self.fcfs_shape(rows), rows
            self._pending = None
        decodes = self.iteration_decodes(self.running_decodes())
        left = self.token_budget - len(decodes)
        if self.packed:
            chunks = self.packed_prefill(left) if left > 0 else []
            if chunks:
                return self.packed_shape, [(r, 0) for r in decodes] + chunks
            return self.decode_rows(decodes)
        chunk = self.fcfs_prefill(left) if left > 0 else None
        if not decodes:
            return chunk
        handles = self.requests.handle
        self._proposed = [(int(handles[r]), n) for r, n in chunk[1]] if chunk is not None else None
        return self.decode_rows(decodes)

    def _unchanged(self, handle: int, tokens: int) -> int | None:
        """The table row of a chosen chunk's request, unless it was cancelled or served meanwhile."""
        t = self.requests
        r = t.row(handle)
        if r is None or t.phase[r] != PREFILL or t.queued_prompt[r] != 0 or self.prompt_left(r) < tokens:
            return None
        return r

    def fcfs_shape(self, rows: Rows) -> GraphShape:
        return smallest_prefill(self.shapes.prefill_of(self.prefill_kind(rows[0][0])), len(rows),
                                max(n for _, n in rows))

    def packed_prefill(self, budget: int) -> Rows:
        """Prompt chunks in arrival order within `budget` tokens, for a packed forward.

        Partially prefilled resident requests first, then waiting ones, each min(prompt left, budget
        left); the first waiting request that cannot get a slot, its pages or a `max_running` place
        stops the scan (head-of-line blocking, as in both engines). With `blocked_admission_ends_scan`
        False (a baseline that orders residents and waiting requests together) it ends admission only:
        residents later in the order still get their chunks.
        """
        rows: Rows = []
        left, slots, pages = budget, self.resources.free_slots, self.resources.free_pages
        running, slot, admitting = self.resident_count(), self.requests.slot, True
        for r in self.prefill_candidates():
            if left <= 0:
                break
            if slot[r] == NO_SLOT:
                need = self.extent_pages(r)
                if not admitting or slots == 0 or need > pages or running >= self.max_running:
                    if self.blocked_admission_ends_scan:
                        break
                    admitting = False  # no later waiting request overtakes the blocked one
                    continue
                slots, pages, running = slots - 1, pages - need, running + 1
            tokens = min(self.prompt_left(r), left)
            rows.append((r, tokens))
            left -= tokens
        return rows

    def _on_commit(self, plan: ScheduledPlan) -> dict:
        lanes = plan.lanes
        tokens = int(np.maximum(lanes.prompt_tokens, lanes.output_rows).sum())
        if plan.shape.kind.is_prefill and self._pending is not None:
            self._iteration_tokens += tokens  # the second graph of a started iteration
            self._pending = None
        else:
            self.iteration += 1
            self._iteration_tokens = tokens
            self._pending = self._proposed if plan.shape.kind is GraphKind.DECODE else None
        self._proposed = None
        return {"iteration": self.iteration, "iteration_tokens": self._iteration_tokens,
                "budget": self.token_budget}

"""Shared machinery of the baseline schedulers.

Every baseline subclasses the Helios `Scheduler` and replaces only the *selection*: which graph
runs next and which lanes it serves. Admission, cancellation, commit checks, resource
acquisition (slots and the full page extent, through `ResourcePool`), completion validation
(`InvalidCompletion`, nothing changed), cost learning, `stats`, `traces` and the two-frame
`queue` are inherited unchanged, so a baseline is a drop-in replacement wherever a
`Scheduler` is used.

Graph mapping shared by all baselines (our catalog has separate prefill and decode graphs):
- a decode step serving n requests runs the smallest captured decode bucket B >= n;
- a prefill step serving rows with t_i prompt tokens runs the prefill graph (B, C) of least
  padded capacity B*C with B >= rows and C >= max t_i; a row is cut to the largest capacity
  any shape with enough rows offers, and a row that no shape can join ends the cohort.
The token budgets of the papers count logical tokens, never padding.

Baselines that model a synchronous engine (vLLM, Sarathi-Serve, VTC/S-LoRA) keep one frame
in flight: `plan()` returns None while the queue is not empty, and every plan carries
`requires_feedback=True`.
"""

from __future__ import annotations

import numpy as np

from helios.config import PolicyConfig, SchedulerConfig, StudyConfig, preset
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler.core import Scheduler
from helios.scheduler.lanes import ordinary_lanes, requires_feedback as feedback_rule
from helios.scheduler.cost import CostState
from helios.scheduler.plan import NO_SLOT, ScheduledPlan, SelectionReason
from helios.scheduler.requests import DECODE, PREFILL

Rows = list[tuple[int, int]]  # (request table row, prompt tokens); 0 prompt tokens = a decode row


def smallest_decode(shapes, n: int) -> GraphShape | None:
    fitting = [s for s in shapes if s.batch_capacity >= n]
    return min(fitting, key=lambda s: s.batch_capacity) if fitting else None


def prefill_cap(shapes, rows: int) -> int:
    """Largest per-row prompt capacity among prefill shapes with at least `rows` rows (0: none)."""
    return max((s.token_capacity for s in shapes if s.batch_capacity >= rows), default=0)


def smallest_prefill(shapes, rows: int, tokens: int) -> GraphShape | None:
    """The least padded prefill shape with B >= rows and C >= tokens."""
    fitting = [s for s in shapes if s.batch_capacity >= rows and s.token_capacity >= tokens]
    if not fitting:
        return None
    return min(fitting, key=lambda s: (s.target_capacity, s.token_capacity, s.batch_capacity))


def fit_rows(shapes, wants: list[int]) -> tuple[GraphShape, list[int]] | None:
    """A shape for rows that all want to advance: the smallest one covering every row, else the
    widest chunk that still has enough rows; rows beyond the largest batch are dropped."""
    n = len(wants)
    while n and prefill_cap(shapes, n) == 0:
        n -= 1
    if n == 0:
        return None
    wants = wants[:n]
    shape = smallest_prefill(shapes, n, max(wants))
    if shape is None:
        shape = smallest_prefill(shapes, n, prefill_cap(shapes, n))
    return shape, [min(w, shape.token_capacity) for w in wants]


class BaselineScheduler(Scheduler):
    """A `Scheduler` whose selection is `_select()`: a (shape, rows) choice. Lanes, the feedback
    rule and everything after selection are Helios's (`helios.scheduler.lanes`)."""

    name = "baseline"
    synchronous = True
    mixed_graphs = False  # Helios's mixed catalog is never imposed on a baseline
    plans_state_operations = False  # no snapshot or restore: prompts are prefilled in full

    def __init__(self, catalog: Catalog, policy: PolicyConfig | None = None,
                 config: SchedulerConfig | None = None, **kwargs):
        if policy is None:
            # Without a given policy, the coefficients and switches the baselines have always run
            # with (what PolicyConfig() was before issue 45): the spec's table, f and g unscaled.
            policy, kwargs = preset("spec"), {"study": StudyConfig(fairness_time_scale=False), **kwargs}
        super().__init__(catalog, policy, config, **kwargs)
        if not self.shapes.decode or not self.shapes.prefill:
            raise ConfigError("catalog", f"the {self.name} baseline needs decode and prefill graphs")
        # vLLM's max_num_seqs, S-LoRA's running_max_req_size: every resident request must fit
        # one decode graph, so a decode step can always serve all of them.
        self.max_running = min(self.resources.total_slots, self.config.selection_slots,
                               max(s.batch_capacity for s in self.shapes.decode))

    # ---- the selection hook ----------------------------------------------------------
    def _select(self) -> tuple[GraphShape, Rows] | None:
        raise NotImplementedError

    def _on_commit(self, plan: ScheduledPlan) -> dict:
        """Bookkeeping after a successful commit; returns extra fields for the plan trace."""
        return {}

    def plan(self) -> ScheduledPlan | None:
        if self.synchronous and len(self.queue):
            return None
        if not self.queue.accepts_more(self.now_ns):
            return None
        choice = self._select()
        return None if choice is None else self._build_plan(*choice)

    def commit(self, plan: ScheduledPlan, fence) -> None:
        super().commit(plan, fence)  # validates everything before it changes anything
        extra = self._on_commit(plan)
        lanes = plan.lanes
        extra.setdefault("scheduler", self.name)
        extra.setdefault("tokens", sum(np.maximum(lanes.prompt_tokens, lanes.output_rows).tolist()))
        extra.setdefault("prompt_tokens", sum(lanes.prompt_tokens.tolist()))
        self.traces[-1].extra.update(extra)

    # ---- request views: table rows in arrival order (handles grow with admission) -----
    def _rows(self, mask_of) -> list[int]:
        t = self.requests
        rows = t.live_rows()
        return rows[mask_of(t, rows)].tolist()

    def running_decodes(self) -> list[int]:
        limit = self.config.max_context
        return self._rows(lambda t, r: (t.phase[r] == DECODE) & (t.output_left(r) > 0)
                          & (t.context_tokens(r) < limit))

    def resident_prefills(self) -> list[int]:
        return self._rows(lambda t, r: (t.phase[r] == PREFILL) & (t.slot[r] != NO_SLOT)
                          & (t.prompt_left(r) > 0) & (t.queued_prompt[r] == 0))

    def waiting(self) -> list[int]:
        return self._rows(lambda t, r: (t.phase[r] == PREFILL) & (t.slot[r] == NO_SLOT)
                          & (t.queued_prompt[r] == 0))

    def prefill_candidates(self) -> list[int]:
        """The rows a prefill scan visits, in order: resident partial prefills, then waiting requests
        (arrival order here; a priority or deadline baseline reorders them)."""
        return self.resident_prefills() + self.waiting()

    def resident_count(self) -> int:
        t = self.requests
        return int((t.occupied & (t.slot != NO_SLOT)).sum())

    def prefill_kind(self, row: int) -> GraphKind:
        return GraphKind.SCORED_PREFILL if self.requests.score_prompt[row] else GraphKind.PREFILL

    def prompt_left(self, row: int) -> int:
        t = self.requests
        return int(t.prompt_tokens[row] - t.prompt_done[row] - t.queued_prompt[row])

    def extent_pages(self, row: int) -> int:
        return self.resources.extent_pages(self.requests.specs[row])

    # ---- cohorts ---------------------------------------------------------------------
    def decode_rows(self, decodes: list[int]) -> tuple[GraphShape, Rows] | None:
        if not decodes:
            return None
        cap = max(s.batch_capacity for s in self.shapes.decode)
        rows = decodes[:cap]
        return smallest_decode(self.shapes.decode, len(rows)), [(r, 0) for r in rows]

    def fcfs_prefill(self, budget: int) -> tuple[GraphShape, Rows] | None:
        """Chunked prefill in arrival order within `budget` prompt tokens.

        Partially prefilled resident requests come first, then waiting ones; the first request
        that cannot get a slot, pages or a row stops the scan (head-of-line blocking, as in
        vLLM and Sarathi-Serve), so a later arrival never starts before an earlier one.
        """
        rows: Rows = []
        left, slots, pages = budget, self.resources.free_slots, self.resources.free_pages
        running, kind = self.resident_count(), None
        t = self.requests
        for r in self.prefill_candidates():
            if left <= 0:
                break
            k = self.prefill_kind(r)
            if kind is not None and k is not kind:
                break
            shapes = self.shapes.prefill_of(k)
            cap = prefill_cap(shapes, len(rows) + 1)
            if cap == 0 or cap < max((n for _, n in rows), default=1):
                break
            if t.slot[r] == NO_SLOT:
                need = self.extent_pages(r)
                if slots == 0 or need > pages or running >= self.max_running:
                    break
                slots, pages, running = slots - 1, pages - need, running + 1
            tokens = min(self.prompt_left(r), left, cap)
            rows.append((r, tokens))
            left -= tokens
            kind = k
        if not rows:
            return None
        shape = smallest_prefill(self.shapes.prefill_of(kind), len(rows), max(n for _, n in rows))
        return shape, rows

    # ---- plan construction: Helios's lanes and feedback rule ---------------------------
    def _build_plan(self, shape: GraphShape, rows: Rows, score: float = 0.0,
                    requires_feedback: bool | None = None) -> ScheduledPlan:
        now = self.now_ns
        est = self.costs.estimate_ns(shape)
        state = self.costs.state(shape, now)
        lanes = ordinary_lanes(self.requests, shape, [r for r, _ in rows], [n for _, n in rows])
        if requires_feedback is None:
            requires_feedback = self.synchronous or feedback_rule(shape, state, lanes)
        reason = SelectionReason.DISCOVERY if est is None else SelectionReason.ORDINARY
        return ScheduledPlan(shape, lanes, est, score, 0.0, reason, requires_feedback,
                             state is CostState.STALE, now, self.queue.expected_end_ns(now),
                             self.queue.fences())

"""The spec's "direct" scheduler: Helios selection for decode rounds only, FCFS prefill.

Source: the scheduling spec (shared/spec/scheduling-runtime-design.md, first paragraph): the
diagnostic `ignition debug-serve --direct` path "reproduces the selection specified here only
for decode rounds, and it estimates graph costs with a 7/8 moving average that reverts to
unmeasured after 30 seconds"; the duration estimates (median of nine, stale-but-ranked
entries), funded refresh and acceptance learning are Helios alone. The design brief (4.2)
makes it a baseline. There is no public code; this module follows the spec's sentence.

- Costs: `MovingAverageCost`. The first valid sample sets a graph's estimate; later ones give
  new = 7/8 old + 1/8 sample. After 30 s without a valid observation the entry is unmeasured
  again (indeterminate, never "stale"), and the next sample sets it afresh.
- Decode rounds: Helios's decode selection unchanged (every captured batch capacity competes
  with its top-B lanes by value per time, indeterminate candidates first, the same tie-breaks,
  prices, age credit and shared scale), but over the moving-average costs. A measured decode
  round may occupy the second frame, as in Helios.
- Prefill: FCFS chunked prefill (arrival order, head-of-line blocking, `prefill_budget`
  prompt tokens per graph, padded to the smallest fitting capacity), with an empty window.
  Prefill is not priced, so it cannot compete by value: a prefill graph runs when there is
  no decoder, and otherwise alternates with decode rounds (one prefill graph after each
  decode round while prompt work waits).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helios.baselines.common import BaselineScheduler
from helios.config import PolicyConfig, SchedulerConfig
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler.cost import CostState
from helios.scheduler.plan import ScheduledPlan
from helios.scheduler.policy import best, decode_candidates
from helios.scheduler.requests import DECODE
from helios.scheduler.selection import cost_lookup, current_view, plan_from

TTL_NS = 30_000_000_000
KEEP = 7 / 8  # new = KEEP * old + (1 - KEEP) * sample


@dataclass(slots=True)
class _Average:
    estimate_ns: float
    last_valid_ns: int


class MovingAverageCost:
    """Graph costs as a 7/8 moving average that reverts to unmeasured after `ttl_ns`.

    Offers the `CostTable` interface the Helios scheduler core uses (observe, lookup, state,
    estimate_ns, observation_age_ns, measured); `estimate_ns` without a time uses
    the latest time passed to `advance_to` or `observe`.
    """

    def __init__(self, ttl_ns: int = TTL_NS, keep: float = KEEP):
        if ttl_ns <= 0 or not 0 <= keep < 1:
            raise ConfigError("moving_average", "needs ttl_ns > 0 and 0 <= keep < 1")
        self.ttl_ns = ttl_ns
        self.keep = keep
        self.now_ns = 0
        self._entries: dict[GraphShape, _Average] = {}

    def advance_to(self, now_ns: int) -> None:
        self.now_ns = max(self.now_ns, now_ns)

    def _valid(self, shape: GraphShape, now_ns: int | None) -> _Average | None:
        e = self._entries.get(shape)
        now = self.now_ns if now_ns is None else now_ns
        return e if e is not None and now - e.last_valid_ns <= self.ttl_ns else None

    def observe(self, shape: GraphShape, sample_ns: int | None, now_ns: int) -> bool:
        """Fold one device sample in; a missing or nonpositive sample changes nothing."""
        if sample_ns is None or sample_ns <= 0:
            return False
        self.advance_to(now_ns)
        e = self._valid(shape, now_ns)
        if e is None:  # first sample, or first after reverting to unmeasured
            self._entries[shape] = _Average(float(sample_ns), now_ns)
            return True
        e.estimate_ns = self.keep * e.estimate_ns + (1 - self.keep) * sample_ns
        e.last_valid_ns = now_ns
        return True

    def estimate_ns(self, shape: GraphShape, now_ns: int | None = None) -> int | None:
        e = self._valid(shape, now_ns)
        return None if e is None else max(1, int(round(e.estimate_ns)))

    def lookup(self, shape: GraphShape, now_ns: int) -> tuple[int | None, CostState]:
        est = self.estimate_ns(shape, now_ns)
        return est, CostState.UNKNOWN if est is None else CostState.FRESH

    def state(self, shape: GraphShape, now_ns: int | None = None) -> CostState:
        return CostState.UNKNOWN if self._valid(shape, now_ns) is None else CostState.FRESH

    def observation_age_ns(self, shape: GraphShape, now_ns: int) -> int | None:
        e = self._valid(shape, now_ns)
        return None if e is None else now_ns - e.last_valid_ns

    def measured(self) -> dict[GraphShape, int]:
        return {s: est for s in self._entries if (est := self.estimate_ns(s)) is not None}


class DirectScheduler(BaselineScheduler):
    name = "direct"
    synchronous = False  # measured decode rounds may queue in the second frame

    def __init__(self, catalog: Catalog, policy: PolicyConfig | None = None,
                 config: SchedulerConfig | None = None, *, prefill_budget: int = 2048,
                 costs: MovingAverageCost | None = None):
        super().__init__(catalog, policy, config, costs=costs or MovingAverageCost())
        if isinstance(prefill_budget, bool) or not isinstance(prefill_budget, int) or prefill_budget < 1:
            raise ConfigError("prefill_budget", f"must be a positive integer, got {prefill_budget!r}")
        self.prefill_budget = prefill_budget
        self._last_decode = False  # the last committed graph was a decode round

    def advance_to(self, now_ns: int) -> None:
        super().advance_to(now_ns)
        self.costs.advance_to(now_ns)

    def plan(self) -> ScheduledPlan | None:
        now = self.now_ns
        if not self.queue.accepts_more(now):
            return None
        decoders = np.count_nonzero(self.requests.phase == DECODE) > 0
        chunk = self.fcfs_prefill(self.prefill_budget) if self._last_decode or not decoders else None
        if chunk is not None:
            # Prefill needs an empty window: wait for the queued rounds to drain.
            return None if len(self.queue) else self._build_plan(*chunk, requires_feedback=True)
        decode = self._decode_round(now)
        if decode is None and not len(self.queue):
            chunk = self.fcfs_prefill(self.prefill_budget)  # no runnable decoder after all
            return None if chunk is None else self._build_plan(*chunk, requires_feedback=True)
        return decode

    def _decode_round(self, now: int) -> ScheduledPlan | None:
        """Helios's decode selection (policy.decode_candidates over the planning view)."""
        view = current_view(self.selection, now)
        if view is None:
            return None
        winner = best(decode_candidates(self.memo, self.shapes.decode, cost_lookup(self.costs, now), view.decode, view.waiting))
        return plan_from(self.selection, winner, view, now, self.marks.stamp)

    def _on_commit(self, plan: ScheduledPlan) -> dict:
        self._last_decode = plan.shape.kind is GraphKind.DECODE
        return {"cost_state": self.costs.state(plan.shape, self.now_ns).value}

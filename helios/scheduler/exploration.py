"""Funded exploration ledgers (spec: "Funded timing refresh", "Funded acceptance learning").

Ordinary completions earn credit into two separate ledgers: timing refresh at 0.002/0.998 of their
credited duration and acceptance learning at 0.01/0.99 of their raw execution time, each capped at
5 ms. Full credit funds one episode (one execution); the episode pays its actual duration when it
completes, which can leave debt. Another episode of the same ledger waits for full credit after the
previous one closes. Idle discards positive credit and keeps debt. Hence for ordinary duration O,
episode durations P and the current or last episode's duration D: P <= rate * O + D.

Credit is held as an integer in units of 1/den ns, so the funding thresholds are exact:
5 ms / (2/998) = 2,495 ms and 5 ms / (1/99) = 495 ms of ordinary execution.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.config import SpeculationMode
from helios.graphs import GraphShape
from helios.scheduler.cost import CostState
from helios.scheduler.learning import acceptance_probe
from helios.scheduler.plan import Fence, SelectionReason

CAP_NS = 5_000_000
# After a funded probe search finds nothing, skip the search for this many completed frames: the
# search roughly doubles a speculative decision's cost, and little changes from frame to frame.
PROBE_SEARCH_BACKOFF = 8


class Ledger:
    """One exploration ledger: earns num/den of ordinary time up to CAP_NS, funds one episode at a time."""

    def __init__(self, num: int, den: int, cap_ns: int = CAP_NS):
        self.num, self.den, self.cap_ns = num, den, cap_ns
        self._full = cap_ns * den  # full credit, in units
        self._units = 0  # credit * den, in ns: integer arithmetic keeps the thresholds exact
        self.episode: Fence | None = None  # the open episode's fence
        self.paid_ns = 0  # every episode's payment, in total
        self.episodes = 0  # closed episodes

    @property
    def rate(self) -> float:
        return self.num / self.den

    @property
    def credit_ns(self) -> float:
        return self._units / self.den

    def funded(self) -> bool:
        """Full credit and no episode open: one episode may start."""
        return self.episode is None and self._units >= self._full

    def earn(self, ns: int) -> None:
        self._units = min(self._units + self.num * int(ns), self._full)

    def open(self, fence: Fence) -> None:
        self.episode = fence

    def close(self, fence: Fence, paid_ns: int) -> None:
        """The episode completed: it pays its whole actual duration, possibly into debt."""
        if self.episode == fence:
            self.episode = None
        self._units -= int(paid_ns) * self.den
        self.paid_ns += int(paid_ns)
        self.episodes += 1

    def idle(self) -> None:
        if self._units > 0:
            self._units = 0  # positive credit is discarded; debt is kept


@dataclass(frozen=True, slots=True)
class Credits:
    """Each ledger's credit when a plan was committed (ns; negative is debt)."""

    timing_refresh_ns: float
    acceptance_learning_ns: float


class Exploration:
    """The two ledgers, and the last attempted dispatch of each graph (timing-refresh ordering)."""

    def __init__(self, funded: bool = True):
        # Unfunded: ledgers that never earn, so no episode ever starts.
        self.refresh = Ledger(2 if funded else 0, 998)
        self.learning = Ledger(1 if funded else 0, 99)
        self.attempts: dict[GraphShape, int] = {}
        self._probe_backoff = 0  # completed frames before the next probe search

    def credits(self) -> Credits:
        return Credits(self.refresh.credit_ns, self.learning.credit_ns)

    def credit_units(self) -> tuple[int, int]:
        """Each ledger's credit in its own units (credit_ns * den): what commit keeps for the plan
        trace, which divides only when read (cheaper than `credits()` at every decision)."""
        return self.refresh._units, self.learning._units

    def ledger(self, reason: SelectionReason) -> Ledger | None:
        if reason is SelectionReason.TIMING_REFRESH:
            return self.refresh
        if reason is SelectionReason.ACCEPTANCE_LEARNING:
            return self.learning
        return None

    def choose(self, sched, candidates, winner, view, costs, device: bool):
        """The candidate to run and its execution class (None: ordinary or discovery, by its
        duration): a funded timing refresh, else a funded acceptance probe (adaptive speculation
        only, and never while a refresh episode is open), else the ordinary winner."""
        chosen = self.refresh_choice(candidates, winner, sched.costs.last_valid_ns)
        if chosen is not None:
            return chosen, SelectionReason.TIMING_REFRESH
        if (sched.config.speculation is SpeculationMode.ADAPTIVE and winner is not None and not self._probe_backoff
                and self.learning.funded() and self.refresh.episode is None):
            chosen = acceptance_probe(sched, view, costs, winner, device)
            if chosen is not None:
                return chosen, SelectionReason.ACCEPTANCE_LEARNING
            self._probe_backoff = PROBE_SEARCH_BACKOFF
        return winner, None

    def refresh_choice(self, candidates, winner, last_valid):
        """The stale alternative a funded refresh runs instead of the measured winner, or None.

        Alternatives are ordered by the later of their last valid observation and their last
        attempted dispatch (oldest first), then by the ordinary ranking. A stale winner is not
        displaced: it refreshes its cost through ordinary service, without spending credit.
        """
        if winner is None or winner.cost_state is not CostState.FRESH or not self.refresh.funded():
            return None
        best, best_key = None, None
        for c in candidates:
            if c.cost_state is not CostState.STALE:
                continue
            seen = max(last_valid(c.shape) or 0, self.attempts.get(c.shape, 0))
            if best is None or seen < best_key or (seen == best_key and c.key > best.key):
                best, best_key = c, seen
        return best

    def committed(self, shape: GraphShape, reason: SelectionReason, fence: Fence, now_ns: int) -> None:
        # Attempts advance only on committed execution, never on planning.
        self.attempts[shape] = now_ns
        if reason is not SelectionReason.ORDINARY:  # the usual case opens no episode
            ledger = self.ledger(reason)
            if ledger is not None:
                ledger.open(fence)

    def completed(self, reason: SelectionReason, fence: Fence, raw_ns: int | None, valid: bool,
                  estimate_ns: int | None) -> None:
        """`raw_ns`: the frame's measured interval (for an isolated frame, the larger of its device
        interval and wall time); `valid`: it had a positive device interval."""
        if self._probe_backoff:
            self._probe_backoff -= 1
        if reason is SelectionReason.ORDINARY:
            if valid and raw_ns:
                self.refresh.earn(raw_ns)
                self.learning.earn(raw_ns)
            return
        ledger = self.ledger(reason)
        if ledger is not None:
            # Invalid timing leaves the estimate stale but still pays: wall time when there was one,
            # else the frame's estimate, so an episode is never free.
            ledger.close(fence, raw_ns or estimate_ns or 0)

    def idle(self) -> None:
        self.refresh.idle()
        self.learning.idle()

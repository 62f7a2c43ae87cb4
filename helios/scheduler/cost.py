"""Duration estimates per physical graph (the spec's "Duration estimates")."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from helios.graphs import GraphShape

WINDOW = 9  # median of the last nine replay observations


class CostState(Enum):
    UNKNOWN = "unknown"  # zero: indeterminate
    FRESH = "fresh"
    STALE = "stale"  # measured cost still ranks, but dispatch needs an empty queue


@dataclass(slots=True)
class CostEntry:
    estimate_ns: int = 0
    samples: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    last_valid_ns: int | None = None


def median(values) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    # Even counts average the middle pair.
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


class CostTable:
    """Learned graph costs. Descriptor values are ignored: every entry starts at zero."""

    def __init__(self, ttl_ns: int):
        self.ttl_ns = ttl_ns
        self._entries: dict[GraphShape, CostEntry] = {}
        # The same shape objects are looked up at every decision: an identity-keyed cache skips
        # rehashing them (the cached shape is kept alive, so its id cannot be reused).
        self._by_id: dict[int, tuple[GraphShape, CostEntry]] = {}
        # Bumped whenever an estimate changes: what is derived from the estimates alone (the
        # phase normalizers, the measured decode costs) is cached against it. Estimates do not
        # depend on time (staleness is a separate state), so nothing else invalidates them.
        self.version = 0

    def _get(self, shape: GraphShape) -> CostEntry | None:
        hit = self._by_id.get(id(shape))
        if hit is not None and hit[0] is shape:
            return hit[1]
        e = self._entries.get(shape)
        if e is not None:
            self._by_id[id(shape)] = (shape, e)
        return e

    def entry(self, shape: GraphShape) -> CostEntry:
        e = self._get(shape)
        if e is None:
            e = self._entries[shape] = CostEntry()
        return e

    def state(self, shape: GraphShape, now_ns: int) -> CostState:
        e = self._get(shape)
        if e is None or e.estimate_ns <= 0:
            return CostState.UNKNOWN
        if now_ns - e.last_valid_ns > self.ttl_ns:
            return CostState.STALE
        return CostState.FRESH

    def lookup(self, shape: GraphShape, now_ns: int) -> tuple[int | None, CostState]:
        """`estimate_ns` and `state` in one lookup (every candidate asks for both)."""
        e = self._get(shape)
        if e is None or e.estimate_ns <= 0:
            return None, CostState.UNKNOWN
        return e.estimate_ns, CostState.STALE if now_ns - e.last_valid_ns > self.ttl_ns else CostState.FRESH

    def lookup_ms_at(self, now_ns: int):
        """`shape -> (estimate in ms or None, state)` at `now_ns`: `lookup` for every candidate of
        one decision, with the identity cache inlined (a decision asks for every loaded capacity)."""
        by_id, ttl, get = self._by_id, self.ttl_ns, self._get
        unknown, stale, fresh = (None, CostState.UNKNOWN), CostState.STALE, CostState.FRESH

        def lookup(shape: GraphShape):
            hit = by_id.get(id(shape))
            e = hit[1] if hit is not None and hit[0] is shape else get(shape)
            if e is None or e.estimate_ns <= 0:
                return unknown
            return e.estimate_ns / 1e6, stale if now_ns - e.last_valid_ns > ttl else fresh
        return lookup

    def estimate_ns(self, shape: GraphShape) -> int | None:
        """Measured estimate, kept for ranking even when stale; None when indeterminate."""
        e = self._get(shape)
        return e.estimate_ns if e is not None and e.estimate_ns > 0 else None

    def estimates_ns(self, shapes) -> list[int | None]:
        """`estimate_ns` of each shape, with the identity cache inlined: the derived values
        (selection.derived) read every loaded shape again whenever the version moves."""
        by_id, get, out = self._by_id, self._get, []
        for shape in shapes:
            hit = by_id.get(id(shape))
            e = hit[1] if hit is not None and hit[0] is shape else get(shape)
            out.append(e.estimate_ns if e is not None and e.estimate_ns > 0 else None)
        return out

    def last_valid_ns(self, shape: GraphShape) -> int | None:
        e = self._get(shape)
        return None if e is None else e.last_valid_ns

    def observation_age_ns(self, shape: GraphShape, now_ns: int) -> int | None:
        e = self._get(shape)
        return None if e is None or e.last_valid_ns is None else now_ns - e.last_valid_ns

    def observe(self, shape: GraphShape, sample_ns: int | None, now_ns: int) -> bool:
        """Record one device observation; a missing or nonpositive sample changes nothing."""
        if sample_ns is None or sample_ns <= 0:
            return False
        e = self.entry(shape)
        if e.estimate_ns <= 0 or now_ns - e.last_valid_ns > self.ttl_ns:  # unknown or stale (`state`)
            # First observation, or first after staleness, replaces the estimate directly.
            e.samples.clear()
        samples, sample = e.samples, int(sample_ns)
        evicted = samples[0] if len(samples) == WINDOW else None
        samples.append(sample)
        # A sample equal to the one it evicts leaves the window's values, so its median and the
        # estimate (always the median of the window), as they were: no sort (steady durations).
        if evicted != sample:
            estimate = max(1, int(round(median(samples))))
            if estimate != e.estimate_ns:
                e.estimate_ns = estimate
                self.version += 1
        e.last_valid_ns = now_ns
        return True

    def measured(self) -> dict[GraphShape, int]:
        return {s: e.estimate_ns for s, e in self._entries.items() if e.estimate_ns > 0}


def cost_lookup(costs, now: int):
    """shape -> (estimate in ms or None, CostState) at `now`: one closure per decision (a
    baseline's table offers `lookup` only)."""
    if isinstance(costs, CostTable):
        return costs.lookup_ms_at(now)

    def lookup(shape):
        t, state = costs.lookup(shape, now)
        return (None if t is None else t / 1e6), state
    return lookup

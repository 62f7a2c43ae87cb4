"""The decision log: a bounded ring of the scheduler's last decisions, formatted only when read.

The step loop records each committed plan with references to what the scheduler already built to
choose it (`SchedulerProtocol.selection_detail`: the planning view and the evaluated candidates).
Recording appends one tuple to a deque; nothing is copied, sorted or converted on the hot path.
Reading (`since`, `drain`) turns entries into plain dicts (helios.runtime.decision_format) and
keeps the dicts, so each decision is formatted once however often it is read.

Thread use: the runtime thread records (under the runtime's lock); HTTP threads read. A deque's
append and `list(deque)` are each atomic under the GIL, and a recorded entry is never changed, so
readers take no lock: the worst a reader sees is a ring one decision older than the writer's.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple
from helios.runtime.decision_format import TOP_ALTERNATIVES, TOP_PRICES, describe

# 256 by default: each entry keeps the decision's view and candidates alive (about a dozen
# GC-tracked objects), and a longer ring makes the collector's passes measurably longer
# (bench/decision_log.py). A dashboard polling once a second needs the last second's decisions.
DEFAULT_DECISIONS = 256
DETAIL_TTL_NS = 10_000_000_000  # alternatives and prices are kept this long after a read


def service_class(obj) -> str | None:
    """A request's service class (its RequestSpec's or SamplingParams' `service_class`), or None."""
    value = getattr(obj, "service_class", None)
    return None if value is None else str(value)


class Decided(NamedTuple):
    """The fields of a committed plan that a decision shows (the plan itself is not kept)."""

    shape: object
    lanes: object
    estimated_duration_ns: int | None
    score: float
    log_scale: float
    reason: object
    private_state: bool
    anchor: bool


class DecisionLog:
    """The last `maxlen` decisions. `clock_origin_ns`: the scheduler time shown as t = 0 (the
    server's start; 0 on a simulator's virtual clock). `epoch_ns`: the wall-clock time at that
    origin (Unix ns), or None where time is virtual. `always_detail`: keep every decision's
    selection detail (alternatives, prices); otherwise only while someone reads the log (a read
    in the last DETAIL_TTL_NS of scheduler time), since holding each decision's view and
    candidates for a while makes the garbage collector's passes longer (bench/decision_log.py)."""

    def __init__(self, maxlen: int = DEFAULT_DECISIONS, clock_origin_ns: int = 0, epoch_ns: int | None = None,
                 top_prices: int = TOP_PRICES, top_alternatives: int = TOP_ALTERNATIVES,
                 always_detail: bool = False):
        if maxlen < 1:
            raise ValueError(f"a decision log holds at least one decision, got {maxlen}")
        self.maxlen = maxlen
        self.top_prices = top_prices  # prices shown per group (the simulator keeps them all)
        self.top_alternatives = top_alternatives
        self.always_detail = always_detail
        self.origin_ns = clock_origin_ns
        self.epoch_ns = epoch_ns
        # (fence, now_ns, the Decided fields..., detail): one flat tuple, the fewest objects kept alive.
        self._raw: deque = deque(maxlen=maxlen)
        self._measured: deque = deque(maxlen=maxlen)  # (fence, measured ns)
        self._formatted: dict[int, dict] = {}  # fence -> dict, for fences still in the ring
        self._names: dict[int, tuple] = {}  # handle -> (request id, class)
        self.recorded = 0  # decisions recorded since the start (the ring holds the last maxlen)
        self._reads = self._reads_seen = 0
        self._detail_until = -1

    # ---- the hot path: references only ---------------------------------------------------------
    def record(self, plan, fence: int, now_ns: int, detail) -> None:
        """One committed decision: the plan's fields and its selection detail (or None), by reference."""
        if detail is not None and not self.always_detail:
            if self._reads != self._reads_seen:  # someone read since the last decision
                self._reads_seen = self._reads
                self._detail_until = now_ns + DETAIL_TTL_NS
            if now_ns > self._detail_until:
                detail = None
        self._raw.append((fence, now_ns, plan.shape, plan.lanes, plan.estimated_duration_ns, plan.score,
                          plan.log_scale, plan.reason, plan.private_state, plan.anchor, detail))
        self.recorded += 1

    def measured(self, fence: int, ns: int | None) -> None:
        """The measured duration of a completed frame (None: no valid timing)."""
        self._measured.append((fence, ns))

    def name(self, handle: int, request_id: str | None, service_class: str | None = None) -> None:
        """What a reader calls a request (its API id and service class), once at admission. The
        names are kept for the last few thousand requests, past their end, so the ring's older
        decisions still show them."""
        names = self._names
        names[handle] = (request_id, service_class)
        if len(names) > 4 * self.maxlen + 4096:  # dicts keep insertion order: the oldest go first
            for old in list(names)[: len(names) // 2]:
                del names[old]

    # ---- reading: format on demand ------------------------------------------------------------
    @property
    def last(self) -> int:
        """The newest recorded decision's sequence number (its fence), 0 before the first."""
        raw = self._raw
        return raw[-1][0] if raw else 0

    def since(self, seq: int = 0, limit: int | None = None) -> list[dict]:
        """Formatted decisions with a sequence number above `seq`, oldest first (at most the last
        `limit` of them)."""
        self._reads += 1
        entries = [e for e in list(self._raw) if e[0] > seq]
        if limit is not None:
            entries = entries[-limit:] if limit > 0 else []
        return self._format(entries)

    @property
    def pending(self) -> int:
        """Decisions in the ring (recorded, not drained)."""
        return len(self._raw)

    def drain(self, keep: int = 0) -> list[dict]:
        """The decisions in the ring but its newest `keep`, formatted, removed from the ring (the
        simulator writes a whole run this way, keeping the frames still in flight, whose measured
        durations are yet to come; a server reads with `since`)."""
        raw = self._raw
        entries = [raw.popleft() for _ in range(max(0, len(raw) - keep))]
        out = self._format(entries)
        for d in out:
            self._formatted.pop(d["seq"], None)
        return out

    def _format(self, entries: list) -> list[dict]:
        measured = dict(self._measured)
        cache, out = self._formatted, []
        for fence, now_ns, *fields, detail in entries:
            d = cache.get(fence)
            if d is None:
                d = cache[fence] = describe(fence, self._seconds(now_ns), Decided(*fields), detail, self._names,
                                            self.top_prices, self.top_alternatives)
            ns = measured.get(fence)
            if ns is not None and d["measured_ms"] is None:
                d["measured_ms"] = ns / 1e6
            out.append(d)
        if len(cache) > self.maxlen:  # forget the fences that left the ring
            oldest = self._raw[0][0] if self._raw else 0
            for fence in [f for f in cache if f < oldest]:
                del cache[fence]
        return out

    def _seconds(self, now_ns: int) -> float:
        return (now_ns - self.origin_ns) / 1e9

    def wall_time(self, t: float) -> float | None:
        """Unix seconds of a decision's `t` (None on a virtual clock)."""
        return None if self.epoch_ns is None else self.epoch_ns / 1e9 + t


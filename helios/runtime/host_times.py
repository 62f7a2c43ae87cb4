"""Host time the runtime spends around the engine, as fixed-bucket histograms for /metrics:
the scheduler's decision for each dispatched frame (plan and commit) and the completion of each
frame (the scheduler's complete, detokenizing and publishing its bursts). The spec asks that a
decision cost far less than the shortest graph it schedules; these show it on a live server."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Upper bounds in ns: 10 us to 100 ms, about three per decade (graphs last ~1 ms to ~1 s).
HOST_TIME_BOUNDS_NS = (10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
                       10_000_000, 25_000_000, 50_000_000, 100_000_000)


@dataclass(slots=True)
class HostTimes:
    """Counts per bucket (the last one unbounded) and the sum, in ns."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(HOST_TIME_BOUNDS_NS) + 1))
    total_ns: int = 0

    def observe(self, ns: int) -> None:
        ns = max(0, int(ns))
        self.counts[bisect_left(HOST_TIME_BOUNDS_NS, ns)] += 1  # bucket i holds bounds[i-1] < ns <= bounds[i]
        self.total_ns += ns

    @property
    def count(self) -> int:
        return sum(self.counts)

    def copy(self) -> HostTimes:
        return HostTimes(list(self.counts), self.total_ns)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets in seconds: (le, observations <= le), ending with +Inf."""
        out, running = [], 0
        for bound, n in zip(HOST_TIME_BOUNDS_NS + (None,), self.counts):
            running += n
            out.append(("+Inf" if bound is None else repr(bound / 1e9), running))
        return out

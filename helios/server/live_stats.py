"""Recent request latencies for the dashboard: TTFT and output-gap percentiles over a sliding window
of finished requests, overall and per service class (when requests carry one).

Fed by the runtime's finish hook (cheap: a few appends); percentiles are computed when read.
The same samples feed /metrics' histograms, so the two agree on what a TTFT and a gap are.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from helios.runtime.decisions import service_class
from helios.runtime.stream import RequestStream

WINDOW_S = 60.0
MAX_REQUESTS = 4096  # the window also holds at most this many finished requests
PERCENTILES = (50, 90, 99)


def percentiles(values_ms) -> dict | None:
    if not len(values_ms):
        return None
    p = np.percentile(np.asarray(values_ms, dtype=np.float64), PERCENTILES)
    return {f"p{q}": float(v) for q, v in zip(PERCENTILES, p)}


class LiveStats:
    """Finished requests of the last `window_s` seconds of the runtime clock."""

    def __init__(self, window_s: float = WINDOW_S, max_requests: int = MAX_REQUESTS):
        self.window_ns = int(window_s * 1e9)
        # (finished ns, class, TTFT ms or None, gaps ms array, output tokens)
        self._done: deque = deque(maxlen=max_requests)
        self._lock = threading.Lock()

    def observe(self, stream: RequestStream) -> None:
        m = stream.metrics
        ttft = None if m.ttft_ns is None else m.ttft_ns / 1e6
        gaps = np.asarray(m.gaps_ns, dtype=np.float64) / 1e6
        with self._lock:
            self._done.append((m.finished_ns or m.submitted_ns, service_class(stream.params), ttft, gaps,
                               stream.usage.completion_tokens))

    def summary(self, now_ns: int) -> dict:
        """{"window_s", "requests", "ttft_ms", "gap_ms", "classes"}: percentiles over the window
        ("classes" is empty unless some request carried a class)."""
        with self._lock:
            recent = [r for r in self._done if r[0] >= now_ns - self.window_ns]
        by_class: dict[str, list] = {}
        for r in recent:
            if r[1] is not None:
                by_class.setdefault(r[1], []).append(r)
        return {"window_s": self.window_ns / 1e9, **_figures(recent),
                "classes": {name: _figures(rows) for name, rows in sorted(by_class.items())}}


def _figures(rows: list) -> dict:
    ttft = [r[2] for r in rows if r[2] is not None]
    gaps = np.concatenate([r[3] for r in rows]) if rows else np.zeros(0)
    return {"requests": len(rows), "output_tokens": sum(r[4] for r in rows),
            "ttft_ms": percentiles(ttft), "gap_ms": percentiles(gaps)}

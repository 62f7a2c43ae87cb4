"""Serving metrics of a finished simulation, SLO attainment and the goodput sweep (docs/simulator.md).

Everything here reads only `RequestLog`s (what clients saw), so any scheduler is measured the same way.
Times in the results are milliseconds, rates per second; percentiles use numpy's linear interpolation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from helios.sim.loop import RequestLog

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class SLO:
    """Per-request service-level objectives, DistServe-style: a request attains its SLO when its TTFT is
    at most `ttft_ms` and the `gap_quantile` quantile of its own inter-delivery gaps is at most `gap_ms`."""

    ttft_ms: float
    gap_ms: float
    gap_quantile: float = 0.99
    target: float = 0.9  # goodput: the fraction of requests that must attain the SLO


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """The headline numbers of one run; `jain` is None when fewer than two clients were ever backlogged."""

    requests: int
    finished: int
    makespan_s: float
    offered_rate: float  # requests per second of arrival window
    output_tok_s: float
    total_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    gap_p50_ms: float
    gap_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    jain: float | None
    slo_attainment: float
    prefill_saved: float = 0.0  # prompt tokens a prefix-cache hit skipped, over all prompt tokens

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    a = np.asarray(values, dtype=np.float64)
    return float(np.percentile(a, q)) if a.size else math.nan


def _logs(source) -> list[RequestLog]:
    logs = getattr(source, "logs", source)  # a Simulation, a mapping of logs, or the logs themselves
    return list(logs.values()) if isinstance(logs, Mapping) else list(logs)


def ttft_ms(log: RequestLog) -> float | None:
    return None if not log.publications else (log.publications[0][0] - log.arrival_ns) / NS_PER_MS


def request_gaps_ms(log: RequestLog) -> np.ndarray:
    """Times between consecutive publications of one request (one fewer than its publications)."""
    t = np.fromiter((p[0] for p in log.publications), dtype=np.int64, count=len(log.publications))
    return np.diff(t) / NS_PER_MS


def e2e_ms(log: RequestLog) -> float | None:
    return None if log.finished_ns is None else (log.finished_ns - log.arrival_ns) / NS_PER_MS


def meets_slo(log: RequestLog, slo: SLO) -> bool:
    """Finished, published, TTFT within the SLO, and its gap quantile within the SLO (vacuous below 2
    publications: a one-token answer has no gaps)."""
    first = ttft_ms(log)
    if first is None or log.finish is None or first > slo.ttft_ms:
        return False
    gaps = request_gaps_ms(log)
    return gaps.size == 0 or float(np.quantile(gaps, slo.gap_quantile)) <= slo.gap_ms


def slo_attainment(source, slo: SLO) -> float:
    """Fraction of all requests (finished or not) that meet the SLO; NaN for no requests."""
    logs = _logs(source)
    return sum(meets_slo(log, slo) for log in logs) / len(logs) if logs else math.nan


def jain_index(shares: Iterable[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 for equal shares, 1/n when one takes all."""
    x = np.asarray(list(shares), dtype=np.float64)
    if x.size == 0:
        return math.nan
    sq = float(np.dot(x, x))
    return 1.0 if sq == 0 else float(x.sum() ** 2 / (x.size * sq))


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def backlogged_jain(source, output_weight: float = 1.0, end_ns: int | None = None) -> float | None:
    """Jain's index over backlogged clients of each one's service rate while it had a backlog.

    A client is backlogged while one of its requests waits for its first token (from arrival to its first
    publication, or to `end_ns` if it never gets one): it then wants more service than it gets, whereas a
    decoding request cannot take more than one token per step. Client c's share is x_c = (prompt tokens
    completed + `output_weight` x output tokens published, all its requests, inside its backlogged
    intervals) / (total length of those intervals). Clients never backlogged are left out; None when fewer
    than two were backlogged. Without the backlog condition the index would measure how much each client
    asks for, not how the scheduler shares a contended device.
    """
    logs = _logs(source)
    if not logs:
        return None
    end = end_ns if end_ns is not None else max(_last_ns(log) for log in logs)
    waiting: dict[str, list] = {}
    for log in logs:
        first = log.publications[0][0] if log.publications else end
        if first > log.arrival_ns:
            waiting.setdefault(log.client, []).append((log.arrival_ns, first))
    if len(waiting) < 2:
        return None
    spans = {c: _merged(v) for c, v in waiting.items()}
    served = dict.fromkeys(spans, 0.0)
    for log in logs:
        if log.client not in spans:
            continue
        starts = np.array([a for a, _ in spans[log.client]])
        stops = np.array([b for _, b in spans[log.client]])
        for events, weight in ((log.prefills, 1.0), (log.publications, output_weight)):
            for t, n in events:
                # The service that ends a wait (last prompt chunk, first token) lands exactly on its end.
                k = int(np.searchsorted(starts, t, side="left")) - 1
                if k >= 0 and t <= stops[k]:
                    served[log.client] += n * weight
    return jain_index(served[c] / sum(b - a for a, b in spans[c]) for c in spans)


def _last_ns(log: RequestLog) -> int:
    times = [log.arrival_ns] + [t for t, _ in log.publications] + [t for t, _ in log.prefills]
    return max(times + ([log.finished_ns] if log.finished_ns is not None else []))


def compute_metrics(source, slo: SLO, *, arrival_window_ns: int | None = None) -> RunMetrics:
    """All headline metrics of one run. Throughput is over the makespan: first arrival to last event.

    `arrival_window_ns` (the length of the window requests arrived in) gives the offered rate; without it
    the span from first to last arrival is used.
    """
    logs = _logs(source)
    if not logs:
        nan = math.nan
        return RunMetrics(0, 0, 0.0, 0.0, 0.0, 0.0, nan, nan, nan, nan, nan, nan, None, nan)
    start = min(log.arrival_ns for log in logs)
    end = max(_last_ns(log) for log in logs)
    makespan_s = max(end - start, 1) / NS_PER_S
    out_tokens = sum(log.output_tokens for log in logs)
    prompt_tokens = sum(n for log in logs for _, n in log.prefills)
    ttfts = [v for log in logs if (v := ttft_ms(log)) is not None]
    gaps = np.concatenate([request_gaps_ms(log) for log in logs])
    e2es = [v for log in logs if (v := e2e_ms(log)) is not None]
    span = arrival_window_ns if arrival_window_ns else max(log.arrival_ns for log in logs) - start
    return RunMetrics(
        requests=len(logs), finished=sum(log.finish is not None for log in logs), makespan_s=makespan_s,
        offered_rate=len(logs) / (span / NS_PER_S) if span > 0 else math.inf,
        output_tok_s=out_tokens / makespan_s, total_tok_s=(out_tokens + prompt_tokens) / makespan_s,
        ttft_p50_ms=percentile(ttfts, 50), ttft_p99_ms=percentile(ttfts, 99),
        gap_p50_ms=percentile(gaps, 50), gap_p99_ms=percentile(gaps, 99),
        e2e_p50_ms=percentile(e2es, 50), e2e_p99_ms=percentile(e2es, 99),
        jain=backlogged_jain(logs, end_ns=end), slo_attainment=slo_attainment(logs, slo),
        prefill_saved=sum(log.cached_tokens for log in logs) / max(sum(log.prompt_tokens for log in logs), 1))


@dataclass(frozen=True, slots=True)
class GoodputResult:
    """`goodput` in requests/s (0 when even the lowest scale fails); `status` says whether the answer is
    bracketed by a failing rate ("bracketed"), only a lower bound ("at-least") or below the grid ("below")."""

    goodput: float
    scale: float | None
    status: str
    points: tuple[tuple[float, float, float], ...]  # (rate_scale, offered rate, attainment), in run order


def goodput_sweep(run: Callable[[float], RunMetrics], scales: Sequence[float], *, target: float = 0.9,
                  refine: int = 2, extend_down: int = 2, resolution: float | None = None) -> GoodputResult:
    """The highest request rate at which at least `target` of the requests meet both SLOs.

    `run(scale)` runs the workload at rate knob `scale` (any knob the offered rate grows with) and returns
    its metrics. The grid `scales` is tried in increasing order and stops at its first failing point
    (attainment falls with load, and higher loads need not be run). If even the first point fails, the
    scale is halved up to `extend_down` times looking for a passing one: low rates are the slowest to
    simulate (small batches mean many steps), so the grid need not start there. Then `refine` bisection
    steps at geometric midpoints narrow the gap between the last passing and the first failing scale;
    with `resolution` they stop as soon as failing / passing <= 1 + resolution (`refine` caps them).
    Goodput is the offered rate of the highest passing run.
    """
    points: list[tuple[float, float, float]] = []

    def attempt(scale: float) -> bool:
        m = run(scale)
        points.append((scale, m.offered_rate, m.slo_attainment))
        return m.slo_attainment >= target

    lo = hi = None
    for scale in sorted(scales):
        if attempt(scale):
            lo = scale
        else:
            hi = scale
            break
    for _ in range(extend_down if lo is None and hi is not None else 0):
        scale = hi / 2
        if attempt(scale):
            lo = scale
            break
        hi = scale
    if lo is None:
        return GoodputResult(0.0, None, "below", tuple(points))
    if hi is None:
        return GoodputResult(_rate(points, lo), lo, "at-least", tuple(points))
    for _ in range(refine):
        if resolution is not None and hi <= lo * (1.0 + resolution):
            break
        mid = math.sqrt(lo * hi)
        if attempt(mid):
            lo = mid
        else:
            hi = mid
    return GoodputResult(_rate(points, lo), lo, "bracketed", tuple(points))


def _rate(points, scale: float) -> float:
    return next(rate for s, rate, _ in points if s == scale)

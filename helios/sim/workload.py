"""The simulator's workloads: a trace by name or file, its window, its arrival rate (docs/simulator.md)."""

from __future__ import annotations

import functools
import math
import os
from typing import Sequence

from helios.errors import ConfigError
from helios.sim.metrics import NS_PER_S
from helios.sim.traces import TraceRequest, load_azure_conv, load_mooncake, multi_client, trace_format

TRACES = ("azure", "mooncake", "multi")


MOONCAKE_TICK_NS = 3 * NS_PER_S  # the Mooncake trace stamps arrivals on a 3-second tick


def trace_source(trace: str) -> tuple[str, str | None]:
    """A trace argument as (format, file): a built-in name ("azure", "mooncake", "multi": file None),
    "azure:PATH" / "mooncake:PATH" (format named), or a PATH (format detected from the file)."""
    if trace in TRACES:
        return trace, None
    fmt, sep, rest = trace.partition(":")
    if sep and fmt in ("azure", "mooncake"):
        return fmt, rest
    if os.path.isfile(trace):
        return trace_format(trace), trace
    raise ConfigError("trace", f"unknown trace {trace!r}: choose from {', '.join(TRACES)}, or give a trace "
                      "file (Azure CSV or Mooncake JSONL), optionally as azure:PATH or mooncake:PATH")


def trace_label(trace: str) -> str:
    """A short name for tables and file names: the built-in name, or the file's stem."""
    fmt, path = trace_source(trace)
    return fmt if path is None else os.path.splitext(os.path.basename(path))[0]


@functools.lru_cache(maxsize=16)
def _load(trace: str, window_s: float | None, seed: int, max_context: int) -> tuple[TraceRequest, ...]:
    fmt, path = trace_source(trace)
    if fmt == "multi":
        return tuple(multi_client(duration_s=window_s or 60.0, seed=seed, max_context=max_context))
    if fmt == "azure":
        return tuple(load_azure_conv(path, duration_s=window_s, max_context=max_context))
    # Mooncake's arrivals are stamped on a 3-second tick: spread them over it.
    return tuple(spread_ticks(load_mooncake(path, duration_s=window_s, max_context=max_context), MOONCAKE_TICK_NS))


def window_for(trace: str, requests: int, *, seed: int = 0, max_context: int = 8192) -> float:
    """The shortest window (s of trace time) holding at least `requests` requests: the whole trace
    when it has fewer. `multi` is generated, so its window is `requests` over its nominal rate."""
    fmt, _ = trace_source(trace)
    if fmt == "multi":
        probe = _load(trace, 60.0, seed, max_context)
        return math.ceil(requests / (len(probe) / 60.0))
    everything = _load(trace, None, seed, max_context)
    if len(everything) <= requests:
        return math.ceil(everything[-1].arrival_ns / NS_PER_S) + 1.0
    # Strictly after the requests-th arrival (a window is half-open).
    return math.floor(everything[requests - 1].arrival_ns / NS_PER_S) + 1.0


def load_workload(trace: str, window_s: float, *, seed: int = 0, max_context: int = 8192) -> list[TraceRequest]:
    """The first `window_s` seconds of a trace at its own rate (rate_scale 1). "multi" is the ShareGPT
    fairness mix of `traces.multi_client` (its arrivals depend on `seed`). Mooncake's arrivals are spread
    over their 3-second tick (`spread_ticks`)."""
    return list(_load(trace, float(window_s), int(seed), int(max_context)))


def whole_trace(trace: str, *, max_context: int = 8192) -> tuple[TraceRequest, ...]:
    """Every request of a trace file or built-in trace (azure, mooncake) at its own rate, cached."""
    return _load(trace, None, 0, int(max_context))


def spread_ticks(requests: Sequence[TraceRequest], tick_ns: int) -> list[TraceRequest]:
    """Spread requests that share one timestamp evenly over the time to the next stamp (at most
    `tick_ns`), keeping their order: the stamp is a sampling tick, and replaying ~10 long prompts at
    the same nanosecond would turn every tick into a synthetic burst that no scheduler can serve."""
    out: list[TraceRequest] = []
    i = 0
    while i < len(requests):
        t = requests[i].arrival_ns
        j = i
        while j < len(requests) and requests[j].arrival_ns == t:
            j += 1
        span = min(tick_ns, requests[j].arrival_ns - t) if j < len(requests) else tick_ns
        for k, r in enumerate(requests[i:j]):
            out.append(TraceRequest(t + span * k // (j - i), r.prompt_tokens, r.output_tokens, r.client,
                                    r.prefix_blocks))
        i = j
    return out


# `multi` has short prompts and lenient SLOs: at the loads that bring the real traces to their SLO limits it
# is nowhere near contention, and fairness only shows under contention. Its loads are tripled.
LOAD_FACTOR = {"multi": 3.0}


def loads_of(trace: str, values) -> tuple[float, ...]:
    """The nominal loads a trace runs at: `values` times its load factor."""
    return tuple(round(v * LOAD_FACTOR.get(trace, 1.0), 6) for v in values)


def rescale(requests: Sequence[TraceRequest], scale: float) -> list[TraceRequest]:
    """The same requests arriving `scale` times as fast (arrival times divided by scale)."""
    if scale <= 0:
        raise ConfigError("rate_scale", f"must be positive, got {scale}")
    return [TraceRequest(int(round(r.arrival_ns / scale)), r.prompt_tokens, r.output_tokens, r.client,
                         r.prefix_blocks) for r in requests]

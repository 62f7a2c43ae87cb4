"""Startup warm-up: measure every prepared graph in steady state and seed the scheduler's costs.

Why not one run per graph: a graph's first run pays one-off costs (oneDNN kernel selection,
first-touch page faults in the KV cache and activations), and one sample taken while another
process holds the cores can be 20x the steady value. The scheduler then believes a batch of 4
costs as much as 20 batches of 1, runs every decode at B=1, and nothing corrects that estimate
as long as the graph keeps losing. So:

- every graph runs `discard` times unmeasured first;
- then `rounds` measured rounds visit all graphs, each round in a rotated order. A burst of
  contention therefore lands on different graphs in different rounds instead of on all samples
  of one graph, and the cost table's median (of nine) drops it. Rounds stop starting after
  `budget_s`, so a heavily loaded machine still starts in bounded time;
- decode graphs run at a representative KV position (`context`), since attention reads the
  window up to each row's position.

All samples go to the scheduler through `seed_costs`, the protocol's one way in.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Mapping

from helios.errors import ConfigError
from helios.graphs import GraphShape


@dataclass(frozen=True, slots=True)
class WarmupConfig:
    """How the warm-up measures: unmeasured runs per graph, measured rounds, decode KV position."""

    discard: int = 1
    rounds: int = 3
    context: int = 256
    # No new measured round starts past this many seconds (at least one always runs): on a
    # machine that other processes keep busy, startup stays bounded with fewer samples.
    budget_s: float = 20.0

    def __post_init__(self) -> None:
        if self.discard < 0 or self.rounds < 1 or self.context < 0 or self.budget_s < 0:
            raise ConfigError("warmup", f"need discard >= 0, rounds >= 1, context >= 0, budget_s >= 0; "
                                        f"got {self}")


@dataclass(frozen=True, slots=True)
class WarmupReport:
    """What the warm-up measured: every sample per graph (ns), and its wall time."""

    samples: Mapping[GraphShape, tuple[int, ...]]
    elapsed_s: float

    def medians_ns(self) -> dict[GraphShape, int]:
        return {shape: int(statistics.median(v)) for shape, v in self.samples.items()}

    def describe(self) -> str:
        parts = ", ".join(f"{shape.label()} {ns / 1e6:.0f} ms" for shape, ns in self.medians_ns().items())
        return f"warm-up {self.elapsed_s:.1f} s: {parts}"


def measure(core, config: WarmupConfig = WarmupConfig()) -> WarmupReport:
    """Time every prepared graph of `core` (anything with `catalog` and `time_graph`)."""
    start = time.perf_counter()
    shapes = list(core.catalog)
    for shape in shapes:
        for _ in range(config.discard):
            core.time_graph(shape, _context(shape, config))
    samples: dict[GraphShape, list[int]] = {shape: [] for shape in shapes}
    for r in range(config.rounds):
        if r and time.perf_counter() - start > config.budget_s:
            break
        k = r % len(shapes)
        for shape in shapes[k:] + shapes[:k]:
            samples[shape].append(core.time_graph(shape, _context(shape, config)))
    return WarmupReport({s: tuple(v) for s, v in samples.items()}, time.perf_counter() - start)


def warm_up(scheduler, core, config: WarmupConfig = WarmupConfig()) -> WarmupReport:
    """Measure `core`'s graphs and seed `scheduler` with every sample, on the monotonic clock
    (the runtime's)."""
    report = measure(core, config)
    scheduler.seed_costs(report.samples, time.monotonic_ns())
    return report


def _context(shape: GraphShape, config: WarmupConfig) -> int:
    # Prefill chunks mostly start a prompt; decode and speculative rows sit deep in one.
    return 0 if shape.kind.is_prefill else config.context

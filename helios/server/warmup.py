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
  `budget_s` (then only graphs without a sample run once more), and a first run longer than
  `keep_first_ns` counts as a sample, so a heavily loaded machine starts about as fast as with
  one run per graph;
- decode graphs run at a representative KV position (`context`), since attention reads the
  window up to each row's position.

All samples go to the scheduler through `seed_costs`, the protocol's one way in.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from helios.errors import ConfigError
from helios.graphs import GraphShape

Progress = Callable[[str, int, int], None]  # (stage, graphs done in this pass, graphs in this pass)


@dataclass(frozen=True, slots=True)
class WarmupConfig:
    """How the warm-up measures: unmeasured runs per graph, measured rounds, decode KV position."""

    discard: int = 1
    rounds: int = 3
    context: int = 256
    # No new measured round starts past this many seconds (at least one always runs): on a
    # machine that other processes keep busy, startup stays bounded with fewer samples.
    budget_s: float = 20.0
    # A discarded first run this long counts as a sample: first-run costs (kernel selection, page
    # faults) are tens of ms, so it is near steady state, and a loaded machine skips a rerun.
    keep_first_ns: int = 1_000_000_000

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
        return "\n".join(self.describe_lines())

    def describe_lines(self) -> list[str]:
        """A summary line, then each graph kind's median costs, wrapped (one line per graph kind
        instead of one line of hundreds of characters)."""
        from helios.server.startup import wrap

        by_kind: dict[str, list[str]] = {}
        for shape, ns in self.medians_ns().items():
            by_kind.setdefault(shape.kind.value, []).append(f"{shape.label().split('[', 1)[-1].rstrip(']')} "
                                                            f"{ns / 1e6:.0f} ms")
        lines = [f"warm-up {self.elapsed_s:.1f} s: {len(self.samples)} graphs timed (median ms per run)"]
        for kind, items in by_kind.items():
            lines += wrap(kind, items)
        return lines


def measure(core, config: WarmupConfig = WarmupConfig(), progress: Progress | None = None) -> WarmupReport:
    """Time every prepared graph of `core` (anything with `catalog` and `time_graph`).
    `progress(stage, k, n)` is called after each run: k of the pass's n graphs are done."""
    start = time.perf_counter()
    shapes = list(core.catalog)
    samples: dict[GraphShape, list[int]] = {shape: [] for shape in shapes}
    report = progress or (lambda stage, k, n: None)
    for _ in range(config.discard):
        for i, shape in enumerate(shapes):
            ns = core.time_graph(shape, _context(shape, config))
            if ns > config.keep_first_ns:  # one-off costs are small next to a run this long
                samples[shape].append(ns)
            report("first runs", i + 1, len(shapes))
    for r in range(config.rounds):
        k = r % len(shapes)
        order = shapes[k:] + shapes[:k]
        if time.perf_counter() - start > config.budget_s:
            order = [s for s in order if not samples[s]]  # past the budget: one sample each
            if not order:
                break
        for i, shape in enumerate(order):
            samples[shape].append(core.time_graph(shape, _context(shape, config)))
            report(f"round {r + 1}/{config.rounds}", i + 1, len(order))
    return WarmupReport({s: tuple(v) for s, v in samples.items()}, time.perf_counter() - start)


def warm_up(scheduler, core, config: WarmupConfig = WarmupConfig(),
            progress: Progress | None = None) -> WarmupReport:
    """Measure `core`'s graphs and seed `scheduler` with every sample, on the monotonic clock
    (the runtime's)."""
    report = measure(core, config, progress)
    scheduler.seed_costs(report.samples, time.monotonic_ns())
    return report


def _context(shape: GraphShape, config: WarmupConfig) -> int:
    # Prefill chunks mostly start a prompt; decode and speculative rows sit deep in one.
    return 0 if shape.kind.is_prefill else config.context

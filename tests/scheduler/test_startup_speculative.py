"""Speculative startup traces (spec: "Verification"): 5 and 16 requests with zero, three and
seven accepted drafts, each with an untrained and a preseeded acceptance history.

Measured synthetic catalog: prefill B x 64 tokens as in test_startup.py; speculative programs
(B, D = W - 1, W, P) for B in 1..16 and W in 1..8 under R = 128 (ragged P = R where B x W > R),
costing 8 ms + 0.05 ms per target row. First outputs within 100 ms, later gaps below 150 ms,
and after a hundred more rounds every stream has progressed with a spread of at most one
eight-token burst.
"""

import numpy as np
import pytest

from helios.config import SchedulerConfig, SpeculationMode, preset, study_preset
from helios.engine.sim_core import SimCore
from helios.graphs import Catalog
from helios.prepare import speculative_shapes
from helios.scheduler import RequestSpec, Scheduler
from helios.sim.loop import Arrival, Simulation

from conftest import MS, FixedCosts, prefill


class Scripted:
    """Exactly `k` drafts survive each round: conditional rates 1 for d <= k, then 0."""

    def __init__(self, k):
        self.k = k

    def conditional(self, key, depth):
        return np.array([1.0 if d < self.k else 0.0 for d in range(depth)])


def catalog_table():
    table = {prefill(64, b): {1: 6.0, 2: 7.5, 4: 10.5, 8: 16.0, 16: 27.0}[b] for b in (1, 2, 4, 8, 16)}
    for s in speculative_shapes(16, range(1, 9), 128):
        table[s] = 8.0 + 0.05 * s.target_capacity
    return table


@pytest.mark.parametrize("n", [5, 16])
@pytest.mark.parametrize("accepted", [0, 3, 7])
@pytest.mark.parametrize("preseeded", [False, True])
@pytest.mark.parametrize("policy", ["table", "balanced"])  # the spec's table and the balanced preset
def test_speculative_startup_trace(n, accepted, preseeded, policy):
    table = catalog_table()
    name = "spec" if policy == "table" else "balanced"
    s = Scheduler(Catalog(table), preset(name), study=study_preset(name),
                  config=SchedulerConfig(kv_pages=1 << 16, speculation=SpeculationMode.ADAPTIVE))
    for shape, ms in table.items():
        s.costs.observe(shape, int(ms * 1e6), 0)
    if preseeded:
        s.seed_acceptance([1.0 if d < accepted else 0.0 for d in range(8)])
    core = SimCore(Catalog(table), FixedCosts(table), seed=n, acceptance=Scripted(accepted), confidence_noise=0.0)
    sim = Simulation(s, core)
    sim.add(Arrival(0, RequestSpec(64, 100_000)) for _ in range(n))
    sim.run(until_ns=400 * MS)
    logs = list(sim.logs.values())
    assert all(log.publications[0][0] - log.arrival_ns <= 100 * MS for log in logs)
    sim.run(max_steps=len(sim.steps) + 100)
    for log in logs:
        times = [t for t, _ in log.publications]
        assert max(b - a for a, b in zip(times, times[1:])) < 150 * MS
    counts = [log.output_tokens for log in logs]
    assert min(counts) > 0 and max(counts) - min(counts) <= 8
    if accepted == 7 and preseeded:
        # With certain acceptance the scheduler verifies wide rounds.
        wide = [st for st in sim.steps[-50:] if "W=8" in st.label]
        assert wide

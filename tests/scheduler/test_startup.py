"""Startup traces without speculation (spec: "Verification", five- and sixteen-request traces).

The measured synthetic catalog (ms), shaped like a ~7B model on one modern GPU:
    decode  B=1..64: 8.0, 8.3, 8.8, 9.6, 11.0, 13.5, 18.0
    prefill B x C=64: 1:6.0  2:7.5  4:10.5  8:16.0  16:27.0;  C=256 at B=1: 11.0;  C=1024: 30.0
Each 64-token prompt must deliver its first output within 100 ms, later gaps stay below
150 ms, and another hundred rounds give every stream progress with a spread of at most one
burst (one token without speculation).
"""

from dataclasses import replace

import pytest

from helios.config import PromptRateLaw, SchedulerConfig, preset, study_preset
from helios.engine.sim_core import SimCore
from helios.graphs import Catalog
from helios.scheduler import RequestSpec
from helios.sim.loop import Arrival, Simulation

from conftest import MS, FixedCosts, decode, make, prefill, preset_configs

STARTUP_CATALOG = {
    decode(1): 8.0, decode(2): 8.3, decode(4): 8.8, decode(8): 9.6, decode(16): 11.0,
    decode(32): 13.5, decode(64): 18.0,
    prefill(64): 6.0, prefill(64, 2): 7.5, prefill(64, 4): 10.5, prefill(64, 8): 16.0,
    prefill(64, 16): 27.0, prefill(256): 11.0, prefill(1024): 30.0,
}


@pytest.mark.parametrize("n", [5, 16])
@pytest.mark.parametrize("noise", [0.0, 0.05])
# The spec's table, the balanced preset, and the preset with the OUTPUT_EWMA option.
@pytest.mark.parametrize("policy", ["table", "balanced", "output_ewma"])
def test_startup_trace_first_output_gaps_and_progress_spread(n, noise, policy):
    costs = FixedCosts(STARTUP_CATALOG)
    policy = {"table": preset_configs("spec"), "balanced": preset_configs("balanced"),
              "output_ewma": (preset("balanced"), replace(study_preset("balanced"),
                                                          prompt_rate_law=PromptRateLaw.OUTPUT_EWMA))}[policy]
    s = make(STARTUP_CATALOG, config=SchedulerConfig(kv_pages=1 << 16), policy=policy)
    core = SimCore(Catalog(STARTUP_CATALOG), costs, seed=n, noise=noise)
    sim = Simulation(s, core)
    sim.add(Arrival(0, RequestSpec(64, 10_000)) for _ in range(n))
    sim.run(until_ns=400 * MS)
    logs = sim.logs.values()
    assert all(log.publications and log.publications[0][0] - log.arrival_ns <= 100 * MS for log in logs)

    start_round = len(sim.steps)
    sim.run(max_steps=start_round + 100)
    for log in logs:
        times = [t for t, _ in log.publications]
        assert max(b - a for a, b in zip(times, times[1:])) < 150 * MS
    counts = [log.output_tokens for log in logs]
    assert min(counts) > 0
    assert max(counts) - min(counts) <= 1  # one burst of one token

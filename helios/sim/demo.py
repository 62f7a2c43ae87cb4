"""`flare sim --demo`: a short SimCore run that prints one line per executed graph."""

from __future__ import annotations

import numpy as np

from helios.config import SchedulerConfig
from helios.engine.sim_core import SimCore
from helios.prepare import Capacities, build_catalog
from helios.scheduler import RequestSpec, Scheduler
from helios.sim.synthetic_cost import SyntheticCostModel
from helios.sim.loop import Arrival, Simulation, StepLog


def _line(step: StepLog) -> str:
    est = "unknown" if step.estimated_ns is None else f"{step.estimated_ns / 1e6:7.2f} ms"
    handles = ",".join(str(h) for h in step.handles[:8]) + ("…" if len(step.handles) > 8 else "")
    return (f"{step.start_ns / 1e6:9.2f} ms  {step.label:<24} est {est:>10}  "
            f"measured {step.measured_ns / 1e6:7.2f} ms  rate {step.value_rate:10.4g}  cohort [{handles}]")


def run_demo(requests: int = 8, seed: int = 0, steps: int = 40, mixed_prefill: bool = False,
             mixed_prompt_rows: int = 1) -> Simulation:
    catalog = build_catalog(Capacities(16, (64, 256, 1024), max_prefill_tokens=1024, mixed_prefill=mixed_prefill,
                                       mixed_prompt_rows=mixed_prompt_rows))
    scheduler = Scheduler(catalog, config=SchedulerConfig(request_slots=16, kv_pages=1 << 14))
    core = SimCore(catalog, SyntheticCostModel.realistic_small(), seed=seed, noise=0.05)
    rng = np.random.default_rng(seed)
    t, arrivals = 0, []
    for _ in range(requests):
        t += int(rng.exponential(8e6))  # about one arrival per 8 ms
        arrivals.append(Arrival(t, RequestSpec(int(rng.integers(32, 900)), int(rng.integers(8, 48)))))
    print(f"{'start':>12}  {'graph':<24} {'estimate':>14}  {'measured':>17}  {'value rate':>15}  cohort")
    sim = Simulation(scheduler, core, on_step=lambda s: print(_line(s)))
    sim.add(arrivals)
    sim.run(max_steps=steps)
    done = sum(1 for log in sim.logs.values() if log.finish is not None)
    print(f"{len(sim.steps)} graphs, {done}/{len(sim.logs)} requests finished, "
          f"virtual time {sim.now_ns / 1e6:.1f} ms")
    return sim

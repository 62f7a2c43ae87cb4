"""SimCore demonstrations of funded exploration (bench/adaptive_speculation.py prints one line each).

drift       one request on speculative programs of widths 2, 4 and 6 (B=1), host allocation. The best width's graph
            runs 30% slower for a while, then recovers. Ordinary service notices the slowdown and
            selection moves away; only a funded timing refresh can notice the recovery of a graph
            that is no longer selected, and selection follows it back.
acceptance  requests whose acceptance is zero for their first rounds, then high, on a scheduler whose
            population prior says drafts never survive. Selection stays at width one, where rounds
            supply no acceptance observations; funded acceptance probes notice the change and
            deeper speculation returns. Two things are held still so that nothing else can bring
            depth back: graph durations do not depend on context, and the prior is zero, not 0.5^d.
            Otherwise (measured after the issue-10/12 merge) width one's cost, measured at ever
            longer contexts, overtakes wider programs' estimates taken at 64-token contexts and
            fresh for 30 s, and the early zero observations stop just below break-even (~0.03 per
            depth), so cost drift or noise tips ordinary selection into a wider round, whose
            observations then widen it further: the counterfactual recovered without any probe.

`funded=False` runs the same workload with ledgers that never earn (SchedulerConfig.funded_exploration):
the counterfactual in which the first estimate lasts for the rest of the run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from helios.config import AcceptanceEstimate, SchedulerConfig, SpeculationMode, StudyConfig, preset
from helios.engine.sim_core import SimCore
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import speculative_shapes
from helios.scheduler import RequestSpec, Scheduler
from helios.sim.acceptance import AcceptanceModel
from helios.sim.synthetic_cost import SyntheticCostModel
from helios.sim.loop import Arrival, Simulation
from helios.sim.shifts import DriftingCostModel, PhasedAcceptance

SECOND = 1_000_000_000

# The table's coefficients (tau = 100 ms, f and g unscaled) with priced stalls and the deferred
# step: the policy these demonstrations were measured under.
TABLE_STUDY = StudyConfig(fairness_time_scale=False)


@dataclass(frozen=True)
class DemoResult:
    tokens_per_s: float  # over the run's final window
    executions: dict  # execution class -> count
    final_widths: Counter  # speculative width W -> rounds executed in the measured window
    sim: Simulation


def _catalog(widths, max_batch):
    return Catalog(speculative_shapes(max_batch, widths, 256) + [GraphShape(GraphKind.PREFILL, b, 64)
                                                                 for b in (1, 2, 4) if b <= max_batch])


def _window(sim: Simulation, start_ns: int, end_ns: int):
    tokens = sum(n for log in sim.logs.values() for t, n in log.publications if start_ns <= t < end_ns)
    widths = Counter(int(st.label.split("W=")[1].split(",")[0]) for st in sim.steps
                     if start_ns <= st.start_ns < end_ns and st.label.startswith("speculative"))
    return tokens / ((end_ns - start_ns) / 1e9), widths


def _result(sim, start_ns, end_ns) -> DemoResult:
    rate, shapes = _window(sim, start_ns, end_ns)
    return DemoResult(rate, sim.scheduler.snapshot().executions, shapes, sim)


def drift(funded: bool = True, seed: int = 1, slow=(1 * SECOND, 4 * SECOND), end_ns: int = 9 * SECOND,
          width: int = 6) -> DemoResult:
    """The width-`width` program is 30% slower while device time is within `slow`."""
    cat = _catalog((2, 4, 6), 1)
    base = SyntheticCostModel.realistic_small()
    model = DriftingCostModel(base, lambda s: s.token_capacity == width, 1.3, *slow)
    # Host allocation with every width competing, and no acceptance probes: timing refresh alone.
    # The spec's acceptance estimate keeps W=6's value clearly below its drifted cost: with the
    # CONDITIONAL estimate (closer to this curve's true deep acceptance) W=6 against W=4 becomes a
    # knife-edge that the KV term's cost lag tips both ways, and the demonstration would measure
    # that instead of the refresh.
    s = Scheduler(cat, replace(preset("spec"), estimate_ttl_ns=SECOND),
                  SchedulerConfig(speculation=SpeculationMode.FIXED, funded_exploration=funded),
                  study=replace(TABLE_STUDY, acceptance_estimate=AcceptanceEstimate.SPEC))
    s.seed_costs({shape: [base.duration_ns(shape, [64])] for shape in cat}, 0)
    core = SimCore(cat, model, seed=seed, noise=0.02, acceptance=AcceptanceModel(seed=seed, spread=0.0))
    sim = Simulation(s, core)
    sim.add([Arrival(0, RequestSpec(64, 1 << 20))])
    sim.run(until_ns=end_ns)
    return _result(sim, end_ns - 2 * SECOND, end_ns)


def acceptance(funded: bool = True, seed: int = 1, concurrency: int = 4, switch_rounds: int = 300,
               end_ns: int = 7 * SECOND) -> DemoResult:
    """Acceptance zero for each request's first `switch_rounds` rounds, then 0.9 per position."""
    cat = _catalog(range(1, 9), 4)
    # No KV term: a duration that grows with context would let width one's fresh estimate overtake
    # the wider programs' estimates from 64-token contexts (see the module docstring).
    model = replace(SyntheticCostModel.realistic_small(), c_kv=0)
    config = SchedulerConfig(speculation=SpeculationMode.ADAPTIVE, funded_exploration=funded)
    s = Scheduler(cat, preset("spec"), config, study=TABLE_STUDY)
    s.seed_costs({shape: [model.duration_ns(shape, [64])] for shape in cat}, 0)
    # A population prior preseeded at zero (learned on traffic whose drafts never survived): every
    # wider round is worth exactly width one's value, so only a probe's observation can change that.
    s.seed_acceptance([0.0] * config.draft_capacity)
    phased = PhasedAcceptance(AcceptanceModel([0.0] * 8, spread=0.0), AcceptanceModel([0.9] * 8, spread=0.0),
                              switch_rounds)
    core = SimCore(cat, model, seed=seed, noise=0.02, acceptance=phased)
    sim = Simulation(s, core)
    sim.add(Arrival(0, RequestSpec(64, 1 << 20)) for _ in range(concurrency))
    sim.run(until_ns=end_ns)
    # Each request switches after about 2 s (300 rounds at width one): measure from 2.5 s on.
    return _result(sim, 5 * SECOND // 2, end_ns)

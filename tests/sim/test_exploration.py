"""Funded exploration in SimCore: the aggregate ledger bounds over random workloads, and the two
demonstrations (a graph whose duration drifts, acceptance that changes mid-stream)."""

from fractions import Fraction

from hypothesis import event, given, settings, strategies as st

from helios.config import PolicyConfig, SchedulerConfig, SpeculationMode
from helios.engine.sim_core import SimCore, SimFaults
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import speculative_shapes
from helios.scheduler import RequestSpec, Scheduler, SelectionReason
from helios.sim import exploration_demo
from helios.sim.acceptance import AcceptanceModel
from helios.sim.synthetic_cost import SyntheticCostModel
from helios.sim.loop import Arrival, Simulation
from helios.sim.shifts import DriftingCostModel

MS = 1_000_000
CATALOG = Catalog(speculative_shapes(4, range(1, 5), 16) + [GraphShape(GraphKind.PREFILL, b, 64) for b in (1, 2, 4)])
WORKLOAD = st.fixed_dictionaries(dict(
    requests=st.lists(st.tuples(st.integers(0, 400), st.integers(20, 600)), min_size=1, max_size=4),
    ttl_ms=st.integers(10, 300), head_start_ms=st.integers(0, 4000), noise=st.floats(0.0, 0.1), missing=st.floats(0.0, 0.2),
    factor=st.floats(0.6, 1.6), drift_ms=st.integers(0, 2000), seed=st.integers(0, 10_000),
    mode=st.sampled_from([SpeculationMode.ADAPTIVE, SpeculationMode.FIXED])))


def run_workload(w):
    base = SyntheticCostModel.realistic_small()
    model = DriftingCostModel(base, lambda s: s.token_capacity % 2 == 0, w["factor"], w["drift_ms"] * MS)
    s = Scheduler(CATALOG, PolicyConfig(estimate_ttl_ns=w["ttl_ms"] * MS),
                  SchedulerConfig(speculation=w["mode"], draft_capacity=3))
    s.seed_costs({shape: [base.duration_ns(shape, [64])] for shape in CATALOG}, 0)
    # Credit as if this much ordinary execution had already run (counted into O below).
    s.exploration.refresh.earn(w["head_start_ms"] * MS)
    s.exploration.learning.earn(w["head_start_ms"] * MS)
    core = SimCore(CATALOG, model, seed=w["seed"], noise=w["noise"], faults=SimFaults(missing_timing=w["missing"]),
                   acceptance=AcceptanceModel(seed=w["seed"]), draft_capacity=3)
    sim = Simulation(s, core)
    sim.add(Arrival(at * MS, RequestSpec(64, out)) for at, out in w["requests"])
    sim.run()
    return sim


def last_episode_ns(sim, reason) -> int:
    fences = [t.fence for t in sim.scheduler.traces if t.reason is reason]
    if not fences:
        return 0
    return next(st.measured_ns for st in sim.steps if st.fence == fences[-1])


@settings(max_examples=50, deadline=None)
@given(w=WORKLOAD)
def test_episode_time_stays_within_each_ledgers_share_of_ordinary_time_plus_one_episode(w):
    """P <= 0.002/0.998 * O + D and P <= 0.01/0.99 * O + D, from the executions' own records."""
    sim = run_workload(w)
    s = sim.scheduler
    ns = {r: s.stats.nanoseconds[r] for r in SelectionReason}
    ordinary = ns[SelectionReason.ORDINARY] + w["head_start_ms"] * MS
    for reason, rate in ((SelectionReason.TIMING_REFRESH, Fraction(2, 998)),
                         (SelectionReason.ACCEPTANCE_LEARNING, Fraction(1, 99))):
        episodes = s.stats.executions[reason]
        event(f"{reason.value} episodes: {'none' if not episodes else '1' if episodes == 1 else 'several'}")
        assert ns[reason] <= rate * ordinary + last_episode_ns(sim, reason)
        # Each ledger is charged exactly its own class's executions, never the same one twice; it pays
        # at least their recorded time (a queued frame without timing pays its estimate).
        ledger = s.exploration.ledger(reason)
        assert ledger.episodes == episodes and ledger.paid_ns >= ns[reason]
    assert sum(s.exploration.ledger(r).episodes for r in SelectionReason if s.exploration.ledger(r)) == \
        sum(s.stats.executions[r] for r in (SelectionReason.TIMING_REFRESH, SelectionReason.ACCEPTANCE_LEARNING))
    if w["mode"] is SpeculationMode.FIXED:
        assert s.stats.executions[SelectionReason.ACCEPTANCE_LEARNING] == 0  # fixed width never probes


def test_drift_refresh_notices_the_recovered_graph_and_selection_follows():
    funded = exploration_demo.drift(funded=True)
    unfunded = exploration_demo.drift(funded=False)
    six, four = (max(r.final_widths, key=r.final_widths.get) for r in (funded, unfunded))
    assert funded.executions["timing_refresh"] >= 1 and unfunded.executions["timing_refresh"] == 0
    assert (six, four) == (6, 4)  # the never-measured-again outcome keeps the slower choice
    assert funded.tokens_per_s > 1.1 * unfunded.tokens_per_s


def test_acceptance_learning_recovers_deeper_speculation_after_acceptance_turns_high():
    funded = exploration_demo.acceptance(funded=True)
    unfunded = exploration_demo.acceptance(funded=False)
    assert funded.executions["acceptance_learning"] >= 1
    # Depth comes back through a probe: the first wider round is an acceptance-learning execution.
    first_wide = next(t for t in funded.sim.scheduler.traces
                      if t.shape.kind is GraphKind.SPECULATIVE and t.shape.token_capacity > 1)
    assert first_wide.reason is SelectionReason.ACCEPTANCE_LEARNING
    width = sum(w * n for w, n in funded.final_widths.items()) / sum(funded.final_widths.values())
    assert width >= 6
    # Without probes, width-one rounds supply no acceptance observations: width one all along.
    assert set(unfunded.final_widths) == {1}
    assert all(t.shape.token_capacity == 1 for t in unfunded.sim.scheduler.traces
               if t.shape.kind is GraphKind.SPECULATIVE)
    assert funded.tokens_per_s > 2 * unfunded.tokens_per_s

"""SimCore's paired acceptance: a request's draft at output position i is decided by the same
uniform draw whatever width the round has, so differently scheduled runs share their luck."""

from hypothesis import given, settings, strategies as st

from helios.engine.sim_core import SimCore
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler import Lane, ScheduledPlan, SelectionReason
from helios.sim.acceptance import AcceptanceModel
from helios.sim.synthetic_cost import SyntheticCostModel

SHAPES = [GraphShape(GraphKind.SPECULATIVE, 1, w, w - 1, w) for w in range(1, 9)]


def round_plan(width, emitted):
    lane = Lane(0, 0, 0, 0, 64, 0, 64 + emitted, width, 1.0, 1.0, 0.0)
    return ScheduledPlan(SHAPES[width - 1], (lane,), 1, 0.0, 0.0, SelectionReason.ORDINARY, False, False, 0, 0, ())


def accepted_run(seed, widths, paired=True):
    core = SimCore(Catalog(SHAPES), SyntheticCostModel(), seed=seed, acceptance=AcceptanceModel(seed=seed),
                   paired_acceptance=paired)
    core.attach(0)
    out, emitted = [], 0
    for fence, w in enumerate(widths):
        n = len(core.execute(round_plan(w, emitted), fence).records[0].tokens)
        out.append(n)
        emitted += n
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 1000), first=st.integers(1, 8), second=st.integers(1, 8))
def test_a_narrower_round_accepts_the_same_prefix_truncated_to_its_width(seed, first, second):
    wide, narrow = max(first, second), min(first, second)
    (a,), (b,) = accepted_run(seed, [wide]), accepted_run(seed, [narrow])
    assert b == min(a, narrow)  # the same draws decide positions 1..narrow-1


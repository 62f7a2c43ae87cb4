"""Duration estimates (spec: "Duration estimates")."""

from helios.graphs import GraphKind, GraphShape
from helios.scheduler.cost import CostState, CostTable
from helios.scheduler.plan import ExecutionTiming

S = GraphShape(GraphKind.DECODE, 8)
TTL = 30_000_000_000


def test_zero_means_indeterminate_even_for_descriptors_with_a_value():
    t = CostTable(TTL)
    assert t.state(S, 0) is CostState.UNKNOWN and t.estimate_ns(S) is None
    t.observe(S, 0, 0)
    assert t.estimate_ns(S) is None


def test_first_positive_observation_sets_the_estimate():
    t = CostTable(TTL)
    t.observe(S, 1234, 5)
    assert t.estimate_ns(S) == 1234 and t.state(S, 5) is CostState.FRESH


def test_median_of_last_nine_and_middle_pair_for_even_counts():
    t = CostTable(TTL)
    for v in (10, 40):
        t.observe(S, v, 0)
    assert t.estimate_ns(S) == 25  # even count: mean of the middle pair
    for v in (30, 20):
        t.observe(S, v, 0)
    assert t.estimate_ns(S) == 25  # [10, 20, 30, 40] -> (20+30)/2
    for v in (1000,) * 5 + (1, 2, 3, 4, 5):
        t.observe(S, v, 0)
    # Only the last nine count: [1000 x4, 1, 2, 3, 4, 5] -> median 5.
    assert t.estimate_ns(S) == 5


def test_stale_after_ttl_keeps_cost_and_first_observation_replaces_it():
    t = CostTable(TTL)
    for v in (100, 100, 100):
        t.observe(S, v, 0)
    assert t.state(S, TTL) is CostState.FRESH
    assert t.state(S, TTL + 1) is CostState.STALE
    assert t.estimate_ns(S) == 100  # time alone never makes a measured graph unknown
    t.observe(S, 500, TTL + 1)
    assert t.estimate_ns(S) == 500 and t.state(S, TTL + 1) is CostState.FRESH


def test_missing_or_zero_interval_changes_nothing_and_refreshes_nothing():
    t = CostTable(TTL)
    t.observe(S, 100, 0)
    for sample in (None, 0, -5):
        assert not t.observe(S, sample, TTL + 10)
    assert t.estimate_ns(S) == 100 and t.state(S, TTL + 10) is CostState.STALE


def test_raw_observation_is_max_positive_rank_interval_minus_readiness():
    timing = ExecutionTiming((900, None, 1000, 0), readiness_delay_ns=150)
    assert timing.device_interval_ns() == 1000
    assert timing.cost_sample_ns() == 850
    assert ExecutionTiming((None, 0)).cost_sample_ns() is None
    assert ExecutionTiming((100,), readiness_delay_ns=100).cost_sample_ns() is None


def test_active_row_count_is_not_part_of_the_identity():
    a = GraphShape(GraphKind.DECODE, 8)
    assert a == GraphShape(GraphKind.DECODE, 8, 1, 0, 8, 0)
    assert GraphShape(GraphKind.PREFILL, 2, 64).target_capacity == 128

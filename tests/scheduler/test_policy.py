"""The spec's policy scenarios for ordinary work ("Verification": policy_tests)."""

import math

import pytest

from helios.config import SchedulerConfig
from helios.graphs import GraphKind
from helios.scheduler.cost import CostState

from conftest import MS, shift_log_x, Driver, FixedCosts, decode, make, prefill, spec
from conftest import table_policy

# A measured synthetic catalog shaped like a ~7B model on one modern GPU.
CATALOG = {
    decode(1): 8.0, decode(2): 8.3, decode(4): 8.8, decode(8): 9.6, decode(16): 11.0,
    prefill(64): 6.0, prefill(256): 11.0, prefill(1024): 30.0, prefill(4096): 110.0,
    prefill(64, 2): 7.5, prefill(64, 4): 10.5, prefill(64, 8): 16.0, prefill(64, 16): 27.0,
    prefill(256, 2): 18.0, prefill(256, 4): 32.0,
}


def drive(table=CATALOG, **kw):
    s = make(table, **kw)
    return s, Driver(s, FixedCosts(table))


def test_one_long_prefill_takes_the_fully_occupied_largest_graph():
    s, d = drive()
    s.admit(spec(prompt=4096), 0)
    p = s.plan()
    assert p.shape == prefill(4096) and p.lanes[0].prompt_tokens == 4096
    assert p.lanes[0].output_rows == 1  # the finishing chunk earns at most one output token


def test_two_long_prefills_each_take_whole_large_graphs():
    s, d = drive()
    a, b = s.admit(spec(prompt=4096), 0), s.admit(spec(prompt=4096), 0)
    plans = d.run(2)
    assert [p.shape for p in plans] == [prefill(4096)] * 2
    assert {p.handles[0] for p in plans} == {a, b}


def test_sixteen_long_prefills_all_reach_first_output_without_tiny_chunks():
    s, d = drive()
    handles = [s.admit(spec(prompt=1024, out=4), 0) for _ in range(16)]
    d.run(200)
    assert set(d.published) == set(handles)
    prefills = [p for p, _, _ in d.history if p.shape.kind.is_prefill]
    # Fully occupied graphs only: 16 x 1024 tokens in 16 graphs of 1024 tokens, no padding.
    assert all(p.padding() == 0 for p in prefills)
    assert sum(p.shape.target_capacity for p in prefills) == 16 * 1024 and len(prefills) == 16


def test_fitting_tail_uses_the_fitting_graph_not_padding():
    s, d = drive()
    h = s.admit(spec(prompt=4096 + 64), 0)
    first = d.run_one()
    assert first.shape == prefill(4096)
    tail = s.plan()
    assert tail.shape == prefill(64) and tail.lanes[0].prompt_tokens == 64


def test_padded_tail_earns_only_the_tokens_it_consumes():
    s, d = drive()
    s.admit(spec(prompt=4096 + 100), 0)
    d.run_one()
    tail = s.plan()
    # 100 tokens left: C=256 consumes 100 (padded), C=64 consumes 64, and a lone row packed into
    # B x 64 takes what the packing rule allows (at most sqrt(B) x 64); all compete.
    work = tail.lanes[0].prompt_tokens
    if tail.shape.batch_capacity == 1:
        assert work == min(100, tail.shape.token_capacity)
    else:
        # The lone row's work w is bounded by w <= B x C and w^2 <= B x C^2: floor(sqrt(B) x 64).
        assert work == min(100, math.isqrt(tail.shape.batch_capacity * 64 * 64))
    assert tail.padding() == tail.shape.target_capacity - work


def test_padded_shape_serving_the_same_cohort_is_pruned_even_if_measured_faster():
    table = dict(CATALOG)
    table[decode(16)] = 5.0  # noise made the padded graph look faster
    s, d = drive(table)
    for _ in range(3):
        s.admit(spec(prompt=64), 0)
    d.run(3)
    p = s.plan()
    assert p.shape.kind is GraphKind.DECODE and p.shape.batch_capacity == 4


@pytest.mark.parametrize("t4, expected", [(8.4, 4), (30.0, 2)])
def test_batch_four_serving_three_competes_with_batch_two_serving_two(t4, expected):
    table = {decode(2): 8.0, decode(4): t4, prefill(64, 4): 10.0}
    s, d = drive(table)
    for _ in range(3):
        s.admit(spec(prompt=64), 0)
    d.run_one()
    assert s.plan().shape == decode(expected)


def test_heterogeneous_cohort_takes_the_highest_lane_values():
    table = {decode(1): 8.0, prefill(64, 4): 10.0}
    s, d = drive(table)
    hs = [s.admit(spec(prompt=64, out=100), 0) for _ in range(3)]
    d.run_one()
    shift_log_x(s, hs[1], -5)  # starved for a while: far higher price
    assert s.plan().handles == (hs[1],)


def test_long_decode_pair_progresses_together():
    s, d = drive()
    a, b = s.admit(spec(prompt=64, out=500), 0), s.admit(spec(prompt=64, out=500), 0)
    d.run(300)
    counts = {h: s.requests[h].output_done for h in (a, b)}
    assert abs(counts[a] - counts[b]) <= 1 and min(counts.values()) > 250
    decodes = [p for p, _, _ in d.history if p.shape.kind is GraphKind.DECODE]
    assert all(p.shape == decode(2) for p in decodes)


def test_prefill_decode_contention_smaller_prefill_near_the_knee():
    def chosen(age_price, decoders):
        s, d = drive(policy=table_policy(decode_age_price=age_price))
        for _ in range(decoders):
            s.admit(spec(prompt=64, out=1000), 0)
        d.run(8)
        s.admit(spec(prompt=4096), s.now_ns)
        for _ in range(200):
            p = s.plan()
            if p.shape.kind.is_prefill:
                return p.shape.token_capacity
            d.run_one()
        return None

    alone = chosen(0.1, 0)
    assert alone == 4096
    # With many waiting streams and a steep age price, a shorter prefill imposes less waiting.
    assert chosen(50.0, 16) < alone


def test_graph_expiry_and_recovery():
    ttl = 1_000 * MS
    s, d = drive(policy=table_policy(estimate_ttl_ns=ttl))
    s.admit(spec(prompt=64, out=1000), 0)
    d.run(3)
    s.advance_to(s.now_ns + 2 * ttl)
    p = s.plan()
    assert s.costs.state(p.shape, s.now_ns) is CostState.STALE
    assert p.estimated_duration_ns is not None  # the measured cost still ranks
    assert p.requires_feedback and p.stale_cost
    d.run_one()
    assert s.costs.state(p.shape, s.now_ns) is CostState.FRESH
    assert not s.plan().requires_feedback


def test_output_gap_raises_delivery_value_but_serves_everyone():
    s, d = drive()
    hs = [s.admit(spec(prompt=64, out=400), 0) for _ in range(5)]
    d.run(100)
    gaps = []
    for h in hs:
        times = d.published[h]
        gaps += [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 150 * MS
    assert min(s.requests[h].output_done for h in hs) > 50


def test_unknown_duration_wins_over_measured_and_ranks_by_value():
    table = dict(CATALOG)
    s = make(table, unmeasured={decode(16)})
    for _ in range(12):
        s.admit(spec(prompt=64), 0)
    d = Driver(s, FixedCosts(table))
    d.run(2)
    p = s.plan()
    assert p.estimated_duration_ns is None and p.shape == decode(16)
    assert p.requires_feedback


def test_lone_cold_request_tries_its_largest_useful_prefill():
    s = make(CATALOG, measured=False)
    s.admit(spec(prompt=3000), 0)
    p = s.plan()
    assert p.shape == prefill(4096) and p.lanes[0].prompt_tokens == 3000


def test_prefill_exploration_excludes_larger_unmeasured_graph_reaching_same_endpoint():
    s = make(CATALOG, measured=False)
    s.admit(spec(prompt=3000, endpoints=(200,)), 0)
    p = s.plan()
    # C=256 reaches the message endpoint at 200, so the unmeasured 1024/4096 graphs are excluded.
    assert p.shape == prefill(256)


def test_measured_larger_graph_remains_eligible_past_an_endpoint():
    s = make(CATALOG)
    s.admit(spec(prompt=4096, endpoints=(200,)), 0)
    assert s.plan().shape == prefill(4096)


def test_selection_is_bounded_to_64_request_slots():
    table = {decode(64): 20.0, prefill(64, 64): 60.0, decode(1): 8.0, prefill(64): 6.0}
    s = make(table, config=SchedulerConfig(request_slots=64, kv_pages=100_000))
    for _ in range(80):
        s.admit(spec(prompt=64, out=8), 0)
    p = s.plan()
    assert len(p.lanes) <= 64


def test_equal_values_prefer_shorter_known_time_then_more_requests():
    table = {decode(2): 8.0, decode(4): 8.0, prefill(64, 4): 10.0}
    s, d = drive(table)
    for _ in range(2):
        s.admit(spec(prompt=64), 0)
    d.run_one()
    assert s.plan().shape == decode(2)  # same cohort: the padded B=4 is pruned

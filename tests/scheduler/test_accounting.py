"""Service accounting and publication (spec: "Service accounting and publication")."""

import math

import numpy as np

import pytest

from helios.scheduler import ExecutionTiming

from conftest import MS, shift_log_x, Driver, FixedCosts, decode, make, prefill, records_for, spec
from conftest import configs

TABLE = {decode(1): 10.0, decode(2): 10.0, decode(4): 10.0, prefill(64): 5.0, prefill(64, 4): 5.0}
TAU = 100.0


# These tests check which interval counts, in physical tokens; tests/scheduler/test_normalizers.py
# checks the phase normalization itself.
PHYSICAL = configs(phase_normalized=False)


def two_decoders():
    s = make(TABLE, config=None, policy=PHYSICAL)
    a, b = s.admit(spec(out=100), 0), s.admit(spec(out=100), 0)
    d = Driver(s, FixedCosts(TABLE))
    d.run_one()
    return s, a, b


def test_unselected_participants_get_zero_service_over_the_interval():
    table = {decode(1): 10.0, prefill(64, 4): 5.0}
    s = make(table)
    a, b = s.admit(spec(out=100), 0), s.admit(spec(out=100), 0)
    Driver(s, FixedCosts(table)).run_one()
    shift_log_x(s, b, -3)  # b has the higher price: the batch-one graph takes b
    p = s.plan()
    assert p.handles == (b,)
    before = s.request_row(a).log_x
    s.commit(p, 10)
    s.advance_to(s.now_ns + 10 * MS)
    s.complete(10, records_for(p), ExecutionTiming((10 * MS,)))
    assert s.request_row(a).log_x == pytest.approx(before - 10.0 / TAU)


def test_requests_admitted_after_dispatch_are_not_participants():
    s, a, b = two_decoders()
    p = s.plan()
    s.commit(p, 10)
    late = s.admit(spec(), s.now_ns)
    before = s.request_row(late).log_x
    s.advance_to(s.now_ns + 10 * MS)
    s.complete(10, records_for(p), ExecutionTiming((10 * MS,)))
    assert s.request_row(late).log_x == before


def test_isolated_frame_interval_is_the_larger_of_device_and_wall_time():
    s, a, b = two_decoders()
    p = s.plan()
    s.commit(p, 10)
    before = s.request_row(a).log_x
    s.advance_to(s.now_ns + 30 * MS)
    s.complete(10, records_for(p), ExecutionTiming((10 * MS,), wall_ns=30 * MS))
    d = 30.0
    expected = float(np.logaddexp(before - d / TAU, math.log(-math.expm1(-d / TAU) / d)))
    assert s.request_row(a).log_x == pytest.approx(expected)


def test_queued_frame_interval_is_the_device_interval_only():
    s, a, b = two_decoders()
    p1 = s.plan()
    s.commit(p1, 10)
    p2 = s.plan()
    s.commit(p2, 11)
    s.advance_to(s.now_ns + 10 * MS)
    s.complete(10, records_for(p1), ExecutionTiming((10 * MS,), wall_ns=10 * MS))
    before = s.request_row(a).log_x
    s.advance_to(s.now_ns + 40 * MS)
    s.complete(11, records_for(p2), ExecutionTiming((10 * MS,), wall_ns=40 * MS))
    d = 10.0
    expected = float(np.logaddexp(before - d / TAU, math.log(-math.expm1(-d / TAU) / d)))
    assert s.request_row(a).log_x == pytest.approx(expected)


def test_missing_device_interval_leaves_service_and_cost_unchanged():
    s, a, b = two_decoders()
    p = s.plan()
    before = (s.request_row(a).log_x, s.costs.estimate_ns(p.shape))
    s.commit(p, 10)
    s.complete(10, records_for(p), ExecutionTiming((None, 0)))
    assert (s.request_row(a).log_x, s.costs.estimate_ns(p.shape)) == before


def test_delivery_counts_at_publication_once_per_burst():
    s, a, b = two_decoders()
    for h in (a, b):
        s.published_output(h, 1)
    z0 = s.request_row(a).log_z
    p = s.plan()
    s.commit(p, 10)
    s.advance_to(s.now_ns + 10 * MS)
    s.complete(10, records_for(p), ExecutionTiming((10 * MS,)))
    # Completion records zero deliveries...
    assert s.request_row(a).log_z == pytest.approx(z0 - 10 / TAU)
    s.published_output(a, 10)
    after = s.request_row(a).log_z
    # ...publication replaces it with exactly one, and repeating it changes nothing.
    expected = float(np.logaddexp(z0 - 0.1, math.log(-math.expm1(-0.1) / 10)))
    assert after == pytest.approx(expected)
    s.published_output(a, 10)
    assert s.request_row(a).log_z == after


def test_first_burst_initializes_a_missing_delivery_history():
    s = make(TABLE)
    h = s.admit(spec(), 0)
    p = s.plan()
    s.commit(p, 1)
    s.advance_to(5 * MS)
    s.complete(1, records_for(p), ExecutionTiming((5 * MS,)))
    assert s.request_row(h).log_z is None
    s.published_output(h, 1)
    assert s.request_row(h).log_z == pytest.approx(-math.log(5.0))  # one delivery over 5 ms


def test_output_age_runs_from_host_publication_time():
    s, a, b = two_decoders()
    s.advance_to(s.now_ns + 3 * MS)
    s.published_output(a, 1)
    assert s.request_row(a).last_publication_ns == s.now_ns


def test_a_cancelled_handle_cannot_charge_a_request_reusing_its_slot():
    from helios.config import SchedulerConfig
    s = make(TABLE, config=SchedulerConfig(request_slots=1))
    a = s.admit(spec(), 0)
    p = s.plan()
    s.commit(p, 1)
    s.cancel(a, 0)
    s.advance_to(5 * MS)
    s.complete(1, records_for(p)[:1], ExecutionTiming((5 * MS,)))
    assert s.resources.free_slots == 1
    b = s.admit(spec(), s.now_ns)
    p2 = s.plan()
    assert p2.handles == (b,)
    s.commit(p2, 2)
    assert s.requests[b].slot == 0 and a not in s.requests

"""Funded timing refresh and the stale-dispatch rule (spec: "Funded timing refresh", "Duration estimates")."""

from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from helios.errors import StalePlan
from helios.scheduler import ExecutionTiming, SelectionReason
from helios.scheduler.exploration import CAP_NS, Ledger

from conftest import MS, Driver, decode, make, prefill, records_for, spec, step
from conftest import table_policy

REFRESH = SelectionReason.TIMING_REFRESH
SECOND = 1_000 * MS


def ttl_policy(ttl_ns=SECOND):
    return table_policy(estimate_ttl_ns=ttl_ns)


# ---- the ledger itself -----------------------------------------------------------------------

def test_first_refresh_needs_exactly_2495_ms_of_credited_ordinary_execution():
    ledger = Ledger(2, 998)
    ledger.earn(2_495 * MS - 1)
    assert not ledger.funded()
    ledger.earn(1)
    assert ledger.funded() and ledger.credit_ns == CAP_NS
    ledger.earn(10 * SECOND)
    assert ledger.credit_ns == CAP_NS  # capped at 5 ms


def test_idle_discards_positive_credit_and_keeps_debt():
    ledger = Ledger(1, 99)
    ledger.earn(300 * MS)
    ledger.idle()
    assert ledger.credit_ns == 0
    ledger.earn(495 * MS)
    ledger.open(7)
    ledger.close(7, 9 * MS)
    assert ledger.credit_ns == pytest.approx(-4 * MS)
    ledger.idle()
    assert ledger.credit_ns == pytest.approx(-4 * MS)


def test_another_episode_waits_for_the_open_one_and_then_for_full_credit():
    ledger = Ledger(2, 998)
    ledger.earn(2_495 * MS)
    ledger.open(1)
    assert not ledger.funded()  # one episode at a time, whatever the credit
    ledger.close(1, 2 * MS)
    assert not ledger.funded()  # 3 ms left: another episode needs full credit again
    ledger.earn(2 * MS * 499)
    assert ledger.funded()


EVENTS = st.lists(st.one_of(st.tuples(st.just("ordinary"), st.integers(1, 400 * MS)),
                            st.tuples(st.just("episode"), st.integers(1, 60 * MS)),
                            st.tuples(st.just("idle"), st.just(0))), max_size=400)


@pytest.mark.parametrize("num,den", [(2, 998), (1, 99)])
@settings(max_examples=300, deadline=None)
@given(events=EVENTS)
def test_ledger_bound_episode_time_within_the_rate_of_ordinary_time_plus_one_episode(num, den, events):
    """P <= num/den * O + D for every event sequence, where D is the last episode's duration."""
    ledger, ordinary, paid, last = Ledger(num, den), 0, 0, 0
    for kind, ns in events:
        if kind == "ordinary":
            ledger.earn(ns)
            ordinary += ns
        elif kind == "episode" and ledger.funded():
            ledger.open(0)
            ledger.close(0, ns)
            paid, last = paid + ns, ns
        elif kind == "idle":
            ledger.idle()
        assert paid <= Fraction(num, den) * ordinary + last


# ---- refresh in the scheduler ----------------------------------------------------------------

def two_stream_scheduler(step_ms=5.0, **kw):
    """Two streams: decode B=2 (both) is the measured winner, B=1 the alternative that goes stale."""
    table = {decode(1): step_ms, decode(2): step_ms, prefill(64, 2): step_ms}
    s = make(table, policy=ttl_policy(), **kw)
    for _ in range(2):
        s.admit(spec(64, 100_000), 0)
    return s


def test_the_first_refresh_comes_after_exactly_2495_ms_of_ordinary_execution():
    s = two_stream_scheduler(5.0)
    d = Driver(s)
    ordinary = 0
    while True:
        plan = s.plan()
        if plan.reason is REFRESH:
            break
        assert plan.reason is SelectionReason.ORDINARY
        d.fence += 1
        step(s, plan, d.fence, 5.0)
        ordinary += 1
    # 499 ordinary 5 ms frames fund it, not 498: 5 ms / (0.002 / 0.998) = 2,495 ms.
    assert ordinary == 499
    assert plan.shape == decode(1) and plan.requires_feedback and plan.stale_cost


def test_refresh_pays_its_duration_and_the_stale_estimate_is_replaced():
    s = two_stream_scheduler(5.0)
    d = Driver(s)
    while (plan := s.plan()).reason is not REFRESH:
        d.run_one()
    s.commit(plan, 10_000)
    assert s.traces[-1].reason is REFRESH and s.traces[-1].refresh_credit_ns == CAP_NS
    assert s.plan() is None  # a stale dispatch needs completion feedback: nothing queues behind it
    s.advance_to(s.now_ns + 8 * MS)
    s.complete(10_000, records_for(plan), ExecutionTiming((8 * MS,), wall_ns=8 * MS))
    assert s.costs.estimate_ns(decode(1)) == 8 * MS  # first valid observation of a stale entry
    assert s.exploration.refresh.credit_ns == pytest.approx(CAP_NS - 8 * MS)
    snap = s.snapshot()
    assert snap.executions["timing_refresh"] == 1 and snap.nanoseconds["timing_refresh"] == 8 * MS
    # The next ordinary winner is the fresh B=2 again: a refresh displaces it only with full credit.
    assert s.plan().reason is SelectionReason.ORDINARY


def test_alternatives_refresh_oldest_first_and_invalid_timing_still_pays_and_advances_the_attempt():
    table = {decode(1): 50.0, decode(2): 50.0, decode(4): 50.0, prefill(64, 4): 50.0}
    s = make(table, policy=ttl_policy())
    s.seed_costs({decode(2): [50 * MS]}, 100 * MS)  # B=2 observed later than B=1
    for _ in range(3):
        s.admit(spec(64, 100_000), 100 * MS)
    d = Driver(s)
    while (plan := s.plan()).reason is not REFRESH:
        d.run_one()
    assert plan.shape == decode(1)  # the oldest observation first
    assert s.plan().shape == decode(1)  # planning alone attempts nothing
    s.commit(plan, 10_000)
    s.advance_to(s.now_ns + 30 * MS)
    s.complete(10_000, records_for(plan), ExecutionTiming((None,), wall_ns=30 * MS))
    assert s.costs.state(decode(1), s.now_ns).value == "stale"  # invalid timing refreshes nothing
    assert s.exploration.refresh.credit_ns == pytest.approx(CAP_NS - 30 * MS)  # its wall time pays
    while (plan := s.plan()).reason is not REFRESH:
        d.run_one()
    # B=1's committed attempt is now later than B=2's last observation.
    assert plan.shape == decode(2)


def test_a_stale_winner_runs_as_ordinary_service_without_spending_credit():
    s = make({decode(1): 5.0, prefill(64): 5.0}, policy=ttl_policy())
    s.admit(spec(64, 100_000), 0)
    d = Driver(s)
    d.run(2)
    s.advance_to(s.now_ns + 2 * SECOND)  # idle time: the only decode graph goes stale
    s.exploration.refresh.earn(10 * SECOND)
    plan = s.plan()
    assert plan.reason is SelectionReason.ORDINARY and plan.stale_cost and plan.requires_feedback
    d.run_one()
    assert s.exploration.refresh.credit_ns == CAP_NS


def test_idle_scheduler_discards_positive_credit():
    s = make({decode(1): 5.0, prefill(64): 5.0})
    s.admit(spec(64, 200), 0)
    Driver(s).run(1000)
    assert s.exploration.refresh.credit_ns == 0 and s.exploration.learning.credit_ns == 0


# ---- the stale-dispatch rule at commit ---------------------------------------------------------

def test_a_plan_saved_across_the_ttl_commits_only_alone_and_then_needs_feedback():
    s = make({decode(1): 5.0, prefill(64): 5.0}, policy=ttl_policy())
    s.admit(spec(64, 1000), 0)
    d = Driver(s)
    d.run(3)
    saved = s.plan()
    assert not saved.requires_feedback and not saved.stale_cost
    s.advance_to(saved.planned_ns + 2 * SECOND)  # the saved plan outlives the freshness interval
    s.commit(saved, 100)
    frame = s.queue.head()
    assert frame.plan.requires_feedback and frame.plan.stale_cost
    assert s.plan() is None  # nothing queues behind a stale dispatch


def test_a_plan_that_went_stale_cannot_join_a_nonempty_queue():
    # A 3 ms freshness interval expires inside the queued 5 ms frame, before it overruns.
    s = make({decode(1): 5.0, prefill(64): 5.0}, policy=ttl_policy(3 * MS))
    s.admit(spec(64, 1000), 0)
    Driver(s).run(3)
    first = s.plan()
    s.commit(first, 100)
    second = s.plan()
    assert second is not None and not second.requires_feedback
    s.advance_to(s.now_ns + 4 * MS)
    assert s.queue.accepts_more(s.now_ns)
    with pytest.raises(StalePlan, match="went stale"):
        s.commit(second, 101)

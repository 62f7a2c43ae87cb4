"""Planning and the execution queue (spec: "Planning and the execution queue")."""

import pytest

from helios.errors import InvalidCompletion, QueueFull, StalePlan
from helios.graphs import GraphKind
from helios.scheduler import ExecutionTiming

from conftest import MS, shift_log_x, Driver, FixedCosts, decode, make, prefill, records_for, spec
from conftest import table_policy

TABLE = {decode(1): 8.0, decode(2): 8.5, decode(4): 9.0, prefill(64): 6.0, prefill(64, 4): 9.0,
         prefill(1024): 30.0}


def decoding(n=2, table=TABLE, **kw):
    s = make(table, **kw)
    hs = [s.admit(spec(prompt=64, out=500), 0) for _ in range(n)]
    d = Driver(s, FixedCosts(table))
    while (p := s.plan()) is not None and p.shape.kind.is_prefill:
        d.run_one()
    return s, hs, d


def test_two_frames_and_only_decode_occupies_both():
    s, hs, _ = decoding()
    p1 = s.plan()
    s.commit(p1, 100)
    p2 = s.plan()
    assert p2 is not None and p2.shape.kind is GraphKind.DECODE
    assert p2.start_ns == s.now_ns + p1.estimated_duration_ns  # planned at the queue's expected end
    s.commit(p2, 101)
    assert s.plan() is None  # both frame slots are taken


def test_prefill_drains_the_window():
    s = make(TABLE)
    s.admit(spec(prompt=64), 0)
    s.commit(s.plan(), 1)
    s.admit(spec(prompt=64), 0)
    assert s.plan() is None  # nothing may queue behind a prefill


def test_feedback_dependent_winner_is_not_displaced_by_queueable_work():
    s, hs, _ = decoding()
    s.commit(s.plan(), 100)
    s.admit(spec(prompt=1000), s.now_ns)
    shift_log_x(s, max(s.requests), -10)  # a long-waiting, high-priced prompt
    # The prefill wins but needs an empty window; decode is submit-ready yet must not go first.
    assert s.plan() is None
    s.advance_to(s.now_ns + 9 * MS)
    p = s.queue.head().plan
    s.complete(100, records_for(p), ExecutionTiming((9 * MS,)))
    assert s.plan().shape.kind.is_prefill


def test_unknown_cost_requires_an_empty_queue_and_feedback():
    table = dict(TABLE)
    s, hs, d = decoding(3, table, unmeasured={decode(4)})
    p = s.plan()
    assert p.shape == decode(4) and p.requires_feedback
    s.commit(p, 100)
    assert s.plan() is None


def test_host_feedback_requests_cannot_join_a_queued_frame():
    s = make(TABLE)
    s.admit(spec(prompt=64, out=100, host_feedback=True), 0)
    d = Driver(s, FixedCosts(TABLE))
    d.run_one()
    s.commit(s.plan(), 100)
    assert s.plan() is None  # its next step needs the host to see this frame's output


def test_overrun_suspends_queueing_until_completion():
    s, hs, _ = decoding()
    p = s.plan()
    s.commit(p, 100)
    s.advance_to(s.now_ns + p.estimated_duration_ns + 1)
    assert s.plan() is None
    s.complete(100, records_for(p), ExecutionTiming((p.estimated_duration_ns + 1,)))
    assert s.plan() is not None


def test_no_millisecond_cap_on_a_frame_or_the_queue():
    table = {decode(2): 5000.0, prefill(64, 4): 9.0}
    s, hs, _ = decoding(table=table)
    s.commit(s.plan(), 100)
    assert s.plan() is not None


def test_commit_rechecks_freshness():
    ttl = 100 * MS
    table = {decode(2): 500.0, prefill(64, 4): 9.0}  # the queue has not overrun at expiry
    s, hs, _ = decoding(table=table, policy=table_policy(estimate_ttl_ns=ttl))
    s.commit(s.plan(), 100)
    p2 = s.plan()
    assert not p2.requires_feedback
    s.advance_to(ttl + 1)
    with pytest.raises(StalePlan, match="stale"):
        s.commit(p2, 101)


def test_commit_rejects_plans_made_against_another_queue():
    s, hs, _ = decoding()
    p1 = s.plan()
    s.commit(p1, 100)
    with pytest.raises(StalePlan):
        s.commit(p1, 101)


def test_projection_uses_the_queued_expected_delivery_for_age():
    s, hs, _ = decoding()
    p1 = s.plan()
    s.commit(p1, 100)
    p2 = s.plan()
    # Lanes of the appended frame see the queued token in their context, and their age
    # restarts at the queued frame's expected delivery (the planning start time).
    assert p2.start_ns == p1.planned_ns + p1.estimated_duration_ns
    assert all(l.context_tokens == s.requests[l.handle].prompt_done + s.requests[l.handle].output_done + 1
               for l in p2.lanes)


def test_completion_out_of_order_or_unknown_is_rejected():
    s, hs, _ = decoding()
    p1 = s.plan()
    s.commit(p1, 100)
    p2 = s.plan()
    s.commit(p2, 101)
    with pytest.raises(InvalidCompletion, match="out of order"):
        s.complete(101, records_for(p2), ExecutionTiming((MS,)))
    with pytest.raises(InvalidCompletion, match="not in flight"):
        s.complete(7, records_for(p1), ExecutionTiming((MS,)))


def test_commit_refuses_feedback_plans_behind_queued_work():
    s, hs, _ = decoding()
    s.commit(s.plan(), 100)
    s.admit(spec(prompt=64), s.now_ns)
    # Build a prefill plan as if the queue were empty, then try to commit it behind the decode.
    saved = s.queue.frames.popleft()
    plan_empty = s.plan()
    s.queue.frames.appendleft(saved)
    assert plan_empty.shape.kind.is_prefill
    with pytest.raises((QueueFull, StalePlan)):
        s.commit(plan_empty, 101)

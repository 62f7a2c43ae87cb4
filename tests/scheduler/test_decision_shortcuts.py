"""The decision's shortcuts against the general paths they skip, on the same inputs: commit's
planner-resolved rows (ScheduledPlan.resolved), the publication of a completion's bursts by their
cached rows and its flush by the accounted pending values, the table's cached live rows, and the
cost window's median kept when a sample repeats the evicted one. Each shortcut must leave exactly
the state the general path leaves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helios.errors import StalePlan
from helios.scheduler import ExecutionTiming
from helios.scheduler.requests import DONE
from helios.scheduler.selection import current_view

from conftest import MS, decode, make, prefill, records_for, spec, step

TABLE = {decode(1): 1.0, decode(2): 1.1, decode(4): 1.3, decode(8): 1.6, prefill(64): 2.0, prefill(64, 4): 3.0}
COLUMNS = ("handle", "epoch", "version", "slot", "prompt_done", "output_done", "queued_prompt", "queued_output",
           "inflight", "last_served_seq", "last_publication_ns", "has_publication", "has_pending", "pending_fence",
           "pending_delta_ms", "pending_log_z", "log_x", "log_z", "phase")


def _run(shortcuts: bool, decisions: int = 40, cancel_at: int | None = None):
    """Admissions with different lengths (some finish mid-run), plan/commit/complete/publish on a
    virtual clock. Without `shortcuts`, every plan loses its resolved rows and every publication
    names its handles as a tuple, which takes the general lookup."""
    s = make(TABLE)
    for i in range(6):
        s.admit(spec(prompt=40 + 10 * i, out=3 + 4 * i), 0)
    fence, outs, taken = 0, [], [0, 0, 0]  # commits, publications and flushes that took the shortcut
    for k in range(decisions):
        if cancel_at is not None and k == cancel_at:
            s.cancel(2, s.now_ns)
        if k % 7 == 3:
            s.admit(spec(prompt=50, out=5 + k % 3), s.now_ns)
        plan = s.plan()
        if plan is None:
            break
        if not shortcuts:
            plan = dataclasses.replace(plan, resolved=None)
        fence += 1
        taken[0] += plan.resolved is not None and plan.resolved[1] == s._stamp
        s.commit(plan, fence)
        dur = plan.estimated_duration_ns or MS
        s.advance_to(s.now_ns + dur)
        out = s.complete(fence, records_for(plan), ExecutionTiming((dur,), wall_ns=dur))
        visible = [g.handle for g in out if g.tokens]
        if visible:
            s.published_outputs(visible if shortcuts else tuple(visible), fence)
            reported = s.publications.reported  # empty when every handle had retired
            taken[1] += bool(reported) and type(reported[-1][0]) is np.ndarray
            batch = s.requests.pending_batch  # the flush reuses the accounted pending values
            taken[2] += bool(reported) and batch is not None and reported[-1][0] is batch[0]
        outs.append([tuple(g) for g in out])
    assert (min(taken) > 0) if shortcuts else taken == [0, 0, 0]
    return s, outs


def _state(s):
    s.publications.flush()
    t = s.requests
    return {name: getattr(t, name).copy() for name in COLUMNS}, dict(t.index), [
        (tr.fence, tr.shape, tr.handles, tr.estimated_duration_ns, tr.score) for tr in s.traces]


@pytest.mark.parametrize("cancel_at", [None, 5])
def test_shortcuts_leave_the_state_of_the_general_paths(cancel_at):
    fast, fast_out = _run(True, cancel_at=cancel_at)
    slow, slow_out = _run(False, cancel_at=cancel_at)
    assert fast_out == slow_out
    (fc, fi, ft), (sc, si, st) = _state(fast), _state(slow)
    assert fi == si and ft == st
    for name in COLUMNS:
        np.testing.assert_array_equal(fc[name], sc[name], err_msg=name)


def test_commit_shortcut_used_only_while_the_table_is_unchanged():
    s = make(TABLE)
    for _ in range(3):
        s.admit(spec(prompt=64, out=8), 0)
    plan = s.plan()
    assert plan.resolved is not None and plan.resolved[1] == s._stamp
    s.cancel(plan.lanes.handle[0], 0)  # moves the stamp: commit looks the rows up and finds the change
    with pytest.raises(StalePlan):
        s.commit(plan, 1)


def test_a_plan_with_replaced_lanes_is_checked_in_full():
    s = make(TABLE)
    for _ in range(2):
        s.admit(spec(prompt=64, out=8), 0)
    plan = s.plan()
    other = dataclasses.replace(plan, lanes=list(plan.lanes))  # new lane columns: resolved no longer applies
    assert other.resolved is not None and other.resolved[2] is not other.lanes
    s.commit(other, 1)
    assert s.queue.head().rows.tolist() == [s.requests.index[h] for h in plan.handles]


def test_publication_shortcut_needs_the_completions_exact_bursts():
    s = make(TABLE)
    for _ in range(3):
        s.admit(spec(prompt=64, out=8), 0)
    plan = s.plan()
    s.commit(plan, 1)
    s.advance_to(plan.estimated_duration_ns)
    out = s.complete(1, records_for(plan), ExecutionTiming((plan.estimated_duration_ns,)))
    handles = [g.handle for g in out]
    assert s._bursts is not None and s._bursts[2] == handles
    s.published_outputs(handles[:1], 1)  # a subset takes the lookup
    assert type(s.publications.reported[-1][0]) is list
    s.published_outputs(handles, 1)
    assert type(s.publications.reported[-1][0]) is np.ndarray
    s.admit(spec(), s.now_ns)  # any table change retires the cached rows
    s.published_outputs(handles, 1)
    assert type(s.publications.reported[-1][0]) is list


def test_live_rows_cache_follows_every_phase_change():
    s = make(TABLE)

    def check():
        t = s.requests
        rows = (t.phase != DONE).nonzero()[0]
        expected = rows[np.argsort(t.handle[rows], kind="stable")]
        live = t.live_rows()
        assert live.tolist() == expected.tolist() and not live.flags.writeable
        assert t.live_count() == len(expected)

    for i in range(4):
        s.admit(spec(prompt=64, out=2 + i), 0)
        check()
    fence = 0
    while (plan := s.plan()) is not None:
        fence += 1
        s.commit(plan, fence)
        dur = plan.estimated_duration_ns
        s.advance_to(s.now_ns + dur)
        s.complete(fence, records_for(plan), ExecutionTiming((dur,)))
        check()
        if fence == 3:
            s.cancel(1, s.now_ns)
            check()
            s.admit(spec(prompt=32, out=3), s.now_ns)
            check()


def test_cost_estimate_is_the_median_of_the_window_when_a_sample_repeats_the_evicted_one():
    import random

    from helios.scheduler.cost import WINDOW, CostTable, median

    rng = random.Random(3)
    table, shape, window, changes = CostTable(ttl_ns=1 << 60), decode(4), [], 0
    for i in range(600):
        sample = rng.choice([100, 120, 130, 150, 1000]) if i % 50 < 40 else 120  # runs of repeats too
        before = table.estimate_ns(shape)
        table.observe(shape, sample, i)
        window = (window + [sample])[-WINDOW:]
        assert table.estimate_ns(shape) == max(1, int(round(median(window))))
        changes += table.estimate_ns(shape) != before
    assert table.version == changes


def test_decode_lanes_from_the_views_cursors_equal_the_tables():
    from helios.scheduler.lanes import decode_lanes

    s = make(TABLE)
    for i in range(5):
        s.admit(spec(prompt=40 + 8 * i, out=50), 0)
    fence = 0
    while (view := current_view(s.selection, s.now_ns)) is None or view.decode_cursor is None or len(view.decode_rows) < 5:
        fence += 1
        step(s, s.plan(), fence)
    members = np.arange(len(view.decode_rows))[::-1]
    rows = view.decode_rows[members]
    values = view.decode.base[members]
    assert decode_lanes(s.requests, rows, values) == decode_lanes(
        s.requests, rows, values, view.decode_cursor[members], view.decode_produced[members])


def test_a_pickled_or_copied_plan_leaves_its_resolved_rows_behind():
    import copy
    import pickle

    s = make(TABLE)
    for _ in range(3):
        s.admit(spec(prompt=64, out=8), 0)
    plan = s.plan()
    assert plan.resolved is not None and plan.resolved[0] is s.requests
    for other in (pickle.loads(pickle.dumps(plan)), copy.copy(plan), copy.deepcopy(plan)):
        assert other == plan and other.resolved is None and other.lanes == plan.lanes
    s.commit(pickle.loads(pickle.dumps(plan)), 1)  # checked in full, and valid
    assert s.queue.head().rows.tolist() == plan.resolved[3].tolist()

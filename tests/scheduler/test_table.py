"""The request table, plans as lane columns, deferred publication, and catalogs without prefill."""

import numpy as np
import pytest

from helios.config import SchedulerConfig
from helios.errors import HeliosError, InvalidRequest
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler import ExecutionTiming, Lane, ScheduledPlan, Scheduler, SelectionReason
from helios.scheduler.plan import NO_SLOT, PlanLanes
from helios.scheduler.policy import Budget, LanePool
from helios.scheduler.memo import Memo
from helios.scheduler.prefill import prefill_candidates
from helios.scheduler.requests import RequestTable

from conftest import MS, shift_log_x, Driver, FixedCosts, decode, make, prefill, records_for, spec, step

TABLE = {decode(1): 10.0, decode(2): 10.0, decode(4): 10.0, prefill(64): 5.0, prefill(64, 4): 6.0}


def test_rows_are_reused_through_the_free_list_and_handles_never_are():
    s = make(TABLE, config=SchedulerConfig(request_slots=4, kv_pages=512))
    a, b = s.admit(spec(), 0), s.admit(spec(), 0)
    row_a = s.requests.row(a)
    s.cancel(a, 0)  # nothing in flight: retired at once, its row freed
    assert a not in s.requests and not s.is_live(a)
    c = s.admit(spec(prompt=100, out=7), 0)
    assert c not in (a, b) and s.requests.row(c) == row_a
    r = s.request_row(c)  # every column starts afresh on a reused row
    assert (r.epoch, r.version, r.prompt_done, r.output_done, r.slot, r.finish) == (0, 0, 0, 0, None, None)
    assert r.log_z is None and r.last_publication_ns is None and r.spec.max_output_tokens == 7


def test_the_table_grows_past_its_first_capacity_without_losing_rows():
    t = RequestTable(depth=4, capacity=2)
    for h in range(9):
        t.add(h, spec(prompt=10 + h), float(h))
    assert t.capacity >= 9 and len(t) == 9
    assert [t[h].spec.prompt_tokens for h in range(9)] == [10 + h for h in range(9)]
    assert t.log_x[[t.row(h) for h in range(9)]].tolist() == [float(h) for h in range(9)]
    assert t.speculation.forecast.means.shape == (t.capacity, 4)
    assert t.live_rows().tolist() == [t.row(h) for h in range(9)]  # admission order


def test_a_cancelled_participant_cannot_charge_a_later_request_reusing_its_row():
    """Spec: "A cancelled handle cannot charge a later request reusing its slot"."""
    table = {decode(1): 10.0, prefill(64, 4): 5.0}
    s = make(table, config=SchedulerConfig(request_slots=4, kv_pages=512))
    a, b = s.admit(spec(out=100), 0), s.admit(spec(out=100), 0)
    Driver(s, FixedCosts(table)).run_one()  # both prompts in one prefill
    shift_log_x(s, b, -3)  # b has the higher price: the batch-one graph takes b
    p = s.plan()
    s.commit(p, 10)
    assert p.handles == (b,)  # a is a participant of fence 10, not a lane
    row_a = s.requests.row(a)
    s.cancel(a, s.now_ns)  # nothing of a's in flight: retired at once
    c = s.admit(spec(out=100), s.now_ns)
    assert s.requests.row(c) == row_a  # the new request sits in a's old row
    before = s.request_row(c).log_x
    s.advance_to(s.now_ns + 10 * MS)
    s.complete(10, records_for(p), ExecutionTiming((10 * MS,)))
    assert s.request_row(c).log_x == before


def test_plan_lanes_are_read_only_columns_and_iterate_as_lanes():
    lanes = [Lane(7, 1, 3, None, 0, 64, 0, 1, 65.0, 0.0, 0.5),
             Lane(8, 0, 2, 5, 10, 0, 12, 1, 1.0, 1.0, 0.25, needs_feedback=True)]
    plan = ScheduledPlan(prefill(64, 4), lanes, 1, 0.0, 0.0, SelectionReason.ORDINARY, False, False, 0, 0, ())
    cols = plan.lanes
    assert isinstance(cols, PlanLanes) and len(cols) == 2
    assert cols.handle.tolist() == [7, 8] and cols.slot.tolist() == [NO_SLOT, 5]
    assert list(cols) == lanes and cols[0] == lanes[0] and cols[1].slot == 5
    assert plan.handles == (7, 8) and plan.padding() == 4 * 64 - 64 - 1
    with pytest.raises(ValueError):
        cols.prompt_tokens[0] = 3  # frozen plain data: the columns are read-only
    again = ScheduledPlan(prefill(64, 4), lanes, 1, 0.0, 0.0, SelectionReason.ORDINARY, False, False, 0, 0, ())
    assert again == plan
    with pytest.raises(HeliosError):
        PlanLanes(**{**{k: getattr(cols, k) for k in ("handle", "epoch", "version", "slot", "prompt_start",
                                                       "prompt_tokens", "context_tokens", "output_rows",
                                                       "expected_tokens", "expected_deliveries", "value",
                                                       "needs_feedback")},
                     "predicted_rows": np.ones(3, dtype=np.int64)})


def test_duplicate_and_late_publications_resolve_a_delivery_once():
    s = make(TABLE)
    a = s.admit(spec(out=50), 0)
    d = Driver(s, FixedCosts(TABLE))
    d.run(3)
    p = s.plan()
    fence = d.fence + 1
    step(s, p, fence, publish=False)
    s.published_output(a, fence)
    s.published_output(a, fence)  # reported twice: applied once
    once = s.request_row(a).log_z
    s.published_output(a, fence)  # late: resets age only
    assert s.request_row(a).log_z == once and s.request_row(a).last_publication_ns == s.now_ns
    with pytest.raises(InvalidRequest):
        s.published_output(a, "fence")


def test_a_catalog_without_prefill_graphs_is_legal_and_admission_says_why_it_cannot_serve():
    """Issue 9: no bare ValueError from a catalog without prefill graphs."""
    s = Scheduler(Catalog({decode(1): 5.0, decode(4): 6.0}), config=SchedulerConfig())
    assert s.plan() is None
    with pytest.raises(InvalidRequest, match="no prefill graph"):
        s.admit(spec(), 0)
    scored = GraphShape(GraphKind.SCORED_PREFILL, 1, 64)
    s2 = Scheduler(Catalog({decode(1): 5.0, scored: 5.0}), config=SchedulerConfig())
    s2.seed_costs({decode(1): [5 * MS], scored: [5 * MS]}, 0)
    h = s2.admit(spec(score_prompt=True), 0)  # scored prompts can still be served
    assert s2.plan().shape == scored and s2.is_live(h)
    pool = LanePool(np.array([1]), np.array([0]), np.array([NO_SLOT]), np.zeros(1), log_prefill=np.zeros(1),
                    first_token=np.zeros(1), prompt_left=np.array([5]), to_endpoint=np.array([5]),
                    resident=np.array([False]), pages=np.array([1]))
    assert prefill_candidates(Memo(), (), None, pool, 0.0, Budget(1, 1)) == []


def test_a_batch_of_publications_is_the_same_as_one_call_per_handle():
    """published_outputs(handles, fence) == published_output(h, fence) for each h, in order;
    an unknown handle raises before anything is recorded, a retired one is skipped."""
    from helios.errors import UnknownRequest
    from conftest import digest

    def run(batched: bool, mixed_times: bool):
        s = make(TABLE, config=SchedulerConfig(request_slots=4, kv_pages=512))
        hs = [s.admit(spec(out=20), 0) for _ in range(3)]
        d = Driver(s, FixedCosts(TABLE))
        d.run(4)
        p = s.plan()
        fence = d.fence + 1
        step(s, p, fence, publish=False)
        order = [hs[2], hs[0], hs[2], hs[1]]  # a repeat, out of admission order
        if batched:
            s.published_outputs(order[:2], fence)
            if mixed_times:
                s.advance_to(s.now_ns + MS)
            s.published_outputs(order[2:], fence)
        else:
            for i, h in enumerate(order):
                if mixed_times and i == 2:
                    s.advance_to(s.now_ns + MS)
                s.published_output(h, fence)
        s.request_row(hs[0])  # flushes
        return s, hs, fence

    for mixed_times in (False, True):
        one, _, _ = run(False, mixed_times)
        batch, hs, fence = run(True, mixed_times)
        assert digest(one) == digest(batch)
        # The last report of a row sets its publication time (the one-call path shares the flush,
        # so check the times themselves too).
        t1 = batch.now_ns
        t0 = t1 - MS if mixed_times else t1
        assert [batch.request_row(h).last_publication_ns for h in hs] == [t0, t1, t1]
    before = digest(batch)
    with pytest.raises(UnknownRequest):
        batch.published_outputs([hs[0], 999], fence)
    assert digest(batch) == before  # nothing of the batch was recorded
    with pytest.raises(InvalidRequest):
        batch.published_outputs([hs[0]], "fence")
    batch.cancel(hs[1], batch.now_ns)  # nothing in flight: retired at once
    batch.published_outputs([hs[1], hs[0]], fence)  # the retired handle is skipped
    assert batch.request_row(hs[0]).last_publication_ns == batch.now_ns

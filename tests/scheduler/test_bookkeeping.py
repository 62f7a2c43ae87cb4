"""Commit bookkeeping kept in a cheaper form: the lazily built plan traces."""

from helios.graphs import GraphKind, GraphShape
from helios.scheduler.plan import PlanTrace, SelectionReason
from helios.scheduler.tracelog import TraceLog

DECODE4 = GraphShape(GraphKind.DECODE, 4)


def test_a_trace_is_built_once_and_holds_the_committed_credit():
    log = TraceLog(3, 998, 99)
    for fence in range(1, 5):  # one more than the log keeps
        log.record((fence, DECODE4, [fence, 7], 10, None, SelectionReason.ORDINARY, 1.5, 0.0, fence, 998 * 3, 5))
    assert len(log) == 3 and log.maxlen == 3
    last = log[-1]
    assert isinstance(last, PlanTrace) and log[-1] is last  # the same object: `extra` updates persist
    assert last.handles == (4, 7) and last.refresh_credit_ns == 3.0 and last.learning_credit_ns == 5 / 99
    assert [t.fence for t in log] == [2, 3, 4] and list(log)[-1] is last
    assert [t.fence for t in reversed(log)] == [4, 3, 2]

"""Commit and completion bookkeeping kept in cheaper forms: the lazily built plan traces, the
id-keyed execution counters, and the cost window's unchanged-window shortcut."""

import pickle
import random

from helios.graphs import GraphKind, GraphShape
from helios.scheduler.completion import ExecutionStats
from helios.scheduler.cost import CostTable, median
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


class _Frame:
    def __init__(self, shape, reason):
        self.reason, self.plan = reason, type("P", (), {"shape": shape})()


def test_execution_counters_merge_equal_shapes_and_survive_pickling():
    s = ExecutionStats()
    s.record(_Frame(DECODE4, SelectionReason.ORDINARY), 10)
    s.record(_Frame(GraphShape(GraphKind.DECODE, 4), SelectionReason.TIMING_REFRESH), None)  # equal, not identical
    assert s.by_shape == {DECODE4: 2}
    assert s.executions[SelectionReason.ORDINARY] == 1 and s.nanoseconds[SelectionReason.ORDINARY] == 10
    assert s.executions[SelectionReason.TIMING_REFRESH] == 1 and s.nanoseconds[SelectionReason.TIMING_REFRESH] == 0
    copy = pickle.loads(pickle.dumps(s))
    shape = next(iter(copy.by_shape))  # the unpickled object: counted under its own id after rekeying
    copy.record(_Frame(shape, SelectionReason.ORDINARY), 5)
    assert copy.by_shape == {DECODE4: 3} and copy.nanoseconds[SelectionReason.ORDINARY] == 15


def test_the_estimate_is_always_the_window_median():
    # Many repeated values, so samples often replace an equal one (the shortcut) and often not.
    rng, table = random.Random(3), CostTable(ttl_ns=1000)
    now = 0
    for _ in range(2000):
        now += rng.choice((1, 1, 1, 1500))  # sometimes past the ttl: the window restarts
        table.observe(DECODE4, rng.choice((100, 100, 101, 250, 7)), now)
        samples = table.entry(DECODE4).samples
        assert table.estimate_ns(DECODE4) == max(1, int(round(median(samples))))

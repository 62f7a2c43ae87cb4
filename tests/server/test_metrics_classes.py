"""flare_scheduler_execution_nanoseconds_total and flare_scheduler_executions_total by execution
class, fed from executions the scheduler really completed (a funded timing refresh among them)."""

from helios.config import PolicyConfig
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.runtime.runtime import RuntimeStats
from helios.scheduler import CompletionRecord, ExecutionTiming, RequestSpec, Scheduler, SelectionReason
from helios.server.metrics import _RuntimeCollector

MS = 1_000_000


class _Runtime:
    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.core = None  # no checkpoint store: the collector reports none

    def snapshot(self):
        return self.scheduler.snapshot(), RuntimeStats()


def test_execution_classes_count_real_executions_including_a_timing_refresh():
    shapes = [GraphShape(GraphKind.DECODE, 1), GraphShape(GraphKind.DECODE, 2), GraphShape(GraphKind.PREFILL, 2, 64)]
    s = Scheduler(Catalog(shapes), PolicyConfig(estimate_ttl_ns=1_000 * MS))
    s.seed_costs({sh: [50 * MS] for sh in shapes}, 0)
    for _ in range(2):
        s.admit(RequestSpec(64, 10_000), 0)
    fence, refreshed = 0, False
    while not refreshed:
        plan = s.plan()
        fence += 1
        s.commit(plan, fence)
        s.advance_to(s.now_ns + 50 * MS)
        records = [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (3,) * l.output_rows) for l in plan.lanes]
        s.complete(fence, records, ExecutionTiming((50 * MS,), wall_ns=50 * MS))
        refreshed = plan.reason is SelectionReason.TIMING_REFRESH
    families = {f.name: {s.labels["class"]: s.value for s in f.samples if s.name.endswith("_total")}
                for f in _RuntimeCollector(_Runtime(s)).collect() if f.name.startswith("flare_scheduler_execution")}
    assert families["flare_scheduler_executions"] == {"ordinary": fence - 1, "discovery": 0, "timing_refresh": 1,
                                                      "acceptance_learning": 0}
    assert families["flare_scheduler_execution_nanoseconds"]["timing_refresh"] == 50 * MS
    assert families["flare_scheduler_execution_nanoseconds"]["ordinary"] == (fence - 1) * 50 * MS

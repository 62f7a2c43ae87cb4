"""vLLM V1's priority scheduling policy (`--scheduling-policy priority`).

Code: github.com/vllm-project/vllm, `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`) and
`vllm/v1/core/sched/request_queue.py` (`PriorityRequestQueue`). Everything of the FCFS baseline
(`vllm_fcfs.py`: one token budget per step, running requests first, chunked prefill, one packed forward)
holds; the policy changes three things:

- The waiting queue is a heap on (priority, arrival time): lower `priority` is more urgent, and within one
  priority requests start in arrival order (FCFS inside a class). A request's priority is its own
  (`RequestSpec.priority`, the API's `priority` field) or its class's tier.
- The queue head blocks the scan as in FCFS, so a lower-priority request never starts before a waiting
  higher-priority one.
- Preemption picks the victim with the largest (priority, arrival time): the least urgent, latest
  request. V1 preempts only when a RUNNING request cannot allocate KV blocks for its next tokens; a
  waiting request that cannot be allocated just waits. Here pages are reserved for a request's whole extent
  at its first chunk and the simulator's pool holds every slot at full context, as in the other baselines,
  so that allocation never fails and, as in vLLM V1 with that much memory, nothing is preempted
  (`preemption_victim` is the rule V1 would apply).

Running requests keep V1's order: the order in which they were first scheduled.
"""

from __future__ import annotations

from helios.baselines.vllm_fcfs import VllmFcfsScheduler
from helios.scheduler.plan import ScheduledPlan


def preemption_victim(running: list[tuple[int, int, int]]) -> int | None:
    """V1's victim among running requests given as (priority, arrival_ns, handle): the largest
    (priority, arrival) key, the least urgent and latest; None when nothing runs."""
    return max(running, key=lambda r: (r[0], r[1], r[2]))[2] if running else None


class VllmPriorityScheduler(VllmFcfsScheduler):
    name = "vllm-priority"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._scheduled: dict[int, int] = {}  # handle -> order of its first scheduled chunk (V1's running list)

    def prefill_candidates(self) -> list[int]:
        t = self.requests
        handles = t.handle
        # Resident partial prefills in the running list's order, then the waiting heap's order.
        resident = sorted(self.resident_prefills(), key=lambda r: self._scheduled.get(int(handles[r]), 0))
        waiting = sorted(self.waiting(), key=lambda r: (t.specs[r].effective_priority, int(handles[r])))
        return resident + waiting

    def _on_commit(self, plan: ScheduledPlan) -> dict:
        for lane in plan.lanes:
            self._scheduled.setdefault(lane.handle, len(self._scheduled))
        return super()._on_commit(plan)

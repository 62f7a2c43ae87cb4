"""The Core protocol: what every engine offers the runtime and the simulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from helios.graphs import Catalog, GraphShape
from helios.scheduler.plan import CompletionRecord, ExecutionTiming, Fence, RequestHandle, ScheduledPlan


@dataclass(frozen=True, slots=True)
class Execution:
    """A finished frame: one record per lane, the timing, and the true duration it took."""

    records: tuple[CompletionRecord, ...]
    timing: ExecutionTiming
    duration_ns: int
    confidence: object = None  # FP32 [2, slots, draft_capacity] sidecar of a device-allocated round
    survival: dict | None = None  # completion_speculative_survival rows by handle


def complete(scheduler, fence: Fence, result: Execution):
    """Hand a core's result to the scheduler through the matching completion call."""
    if result.confidence is not None and result.survival is not None:
        return scheduler.complete_packed_round_with_survival(fence, result.records, result.timing,
                                                             result.confidence, result.survival)
    if result.confidence is not None:
        return scheduler.complete_packed_round(fence, result.records, result.timing, result.confidence)
    if result.survival is not None:
        return scheduler.complete_with_survival(fence, result.records, result.timing, result.survival)
    return scheduler.complete(fence, result.records, result.timing)


@runtime_checkable
class CostModel(Protocol):
    def duration_ns(self, shape: GraphShape, context_lens: Sequence[int]) -> int: ...


class Core(Protocol):
    catalog: Catalog

    def attach(self, handle: RequestHandle, prompt: Sequence[int] | int, **options) -> None: ...

    def detach(self, handle: RequestHandle) -> None: ...

    def execute(self, plan: ScheduledPlan, fence: Fence) -> Execution: ...

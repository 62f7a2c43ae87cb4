"""The one surface every scheduler offers: Helios and every baseline implement it, and nothing
outside `helios.scheduler` reaches past it into a request table, resources or a cost table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

from helios.graphs import Catalog, GraphShape
from helios.scheduler.plan import ExecutionTiming, Fence, FinishReason, GeneratedToken, RequestHandle, ScheduledPlan
from helios.scheduler.request_spec import RequestSpec


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    """A consistent read-only copy of what metrics and callers may see, taken in one call."""

    now_ns: int
    running: int  # live requests holding a request slot
    waiting: int  # live requests without one
    free_slots: int
    total_slots: int
    free_pages: int
    total_pages: int
    queued_frames: int
    nanoseconds: Mapping[str, int]  # flare_scheduler_execution_nanoseconds_total by execution class
    executions: Mapping[str, int]  # flare_scheduler_executions_total by execution class
    by_shape: Mapping[GraphShape, int]  # completed executions per prepared graph
    estimates_ns: Mapping[GraphShape, int]  # current duration estimate of each measured graph
    speculative: Mapping[str, int]  # flare_speculative_* counters
    # The loaded proposal source's population acceptance prior: mean prefix survival by depth.
    acceptance_prior: tuple[float, ...] = ()

    @property
    def live(self) -> int:
        return self.running + self.waiting


@runtime_checkable
class SchedulerProtocol(Protocol):
    """The spec's API (admit/cancel/advance_to/plan/commit/complete*/published_output), plus what
    callers really need: liveness of a handle, a snapshot, and seeding costs from a warm-up."""

    catalog: Catalog

    def admit(self, request: RequestSpec, now_ns: int) -> RequestHandle: ...
    def cancel(self, handle: RequestHandle, now_ns: int,
               reason: FinishReason = FinishReason.CANCELLED) -> None: ...
    def advance_to(self, now_ns: int) -> None: ...
    def plan(self) -> ScheduledPlan | None: ...
    def commit(self, plan: ScheduledPlan, fence: Fence) -> None: ...
    def complete(self, fence: Fence, records: Sequence, timing: ExecutionTiming) -> list[GeneratedToken]: ...
    def complete_with_survival(self, fence: Fence, records: Sequence, timing: ExecutionTiming,
                               survival) -> list[GeneratedToken]: ...
    def complete_packed_round(self, fence: Fence, records: Sequence, timing: ExecutionTiming,
                              confidence) -> list[GeneratedToken]: ...
    def complete_packed_round_with_survival(self, fence: Fence, records: Sequence, timing: ExecutionTiming,
                                            confidence, survival) -> list[GeneratedToken]: ...
    def published_output(self, handle: RequestHandle, fence: Fence) -> None: ...
    def published_outputs(self, handles: Sequence[RequestHandle], fence: Fence) -> None:
        """published_output for each handle, in order, in one call (a frame's visible bursts)."""

    def is_live(self, handle: RequestHandle) -> bool:
        """True while the scheduler still holds the handle: admitted and not yet retired."""
    def snapshot(self) -> SchedulerSnapshot:
        """A consistent read-only copy of counters, resources and estimates."""
    def seed_costs(self, samples: Mapping[GraphShape, Iterable[int]], now_ns: int) -> None:
        """Feed warm-up device observations (ns) to the cost table, as completions would."""
    def seed_acceptance(self, survival) -> None:
        """Preseed the population acceptance prior (prefix survival by depth): the spec's
        preseeded acceptance history, e.g. one calibrated on earlier traffic."""
    @property
    def preempts(self) -> bool:
        """True when the automatic preemption policy can act (configured, and the scheduler
        plans snapshot and restore graphs); the step loop then calls `preempt_due` before planning."""
    def preempt_due(self, now_ns: int) -> list[RequestHandle]:
        """Preempt the resident decoders the automatic policy names at `now_ns`; their handles."""
    def selection_detail(self, plan: ScheduledPlan) -> tuple | None:
        """(view, candidates, chosen candidate) behind `plan`, as references (None: not known);
        the decision log formats them only when someone reads it."""
    def restores_checkpoints(self) -> bool:
        """True when admission may carry `cached_tokens` that the scheduler restores through a
        RESTORE graph before prefilling the rest (and terminal captures feed the store)."""

"""Request state and request resources (state slots and KV pages)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from helios.errors import ResourceExhausted
from helios.scheduler.plan import FinishReason, RequestHandle, RequestSpec
from helios.scheduler.service import ServiceHistory
from helios.scheduler.speculation import SpeculationState


class Phase(Enum):
    PREFILL = "prefill"  # prompt not fully consumed (resident or not)
    DECODE = "decode"  # prompt consumed: a delivery-bearing stream
    DONE = "done"  # finished or cancelled; resources held until the last fence


@dataclass(slots=True)
class Request:
    handle: RequestHandle
    spec: RequestSpec
    admitted_ns: int
    history: ServiceHistory
    epoch: int = 0
    version: int = 0  # bumps whenever committed or queued work changes
    slot: int | None = None
    pages: int = 0
    prompt_done: int = 0  # committed prompt cursor (cached tokens count as consumed)
    output_done: int = 0
    queued_prompt: int = 0  # in flight, not yet committed
    queued_output: int = 0
    inflight: list = field(default_factory=list)  # fences holding this request's resources
    finish: FinishReason | None = None
    cancelled: bool = False
    last_publication_ns: int | None = None
    last_served_seq: int = -1  # decision counter of the last service: less recent wins ties
    pending_delivery: tuple | None = None  # (fence, delta_ms, log_z before the interval)
    phase: Phase = Phase.PREFILL  # kept by update_phase(): read on every decision
    speculation: SpeculationState = field(default_factory=SpeculationState)

    def update_phase(self) -> None:
        if self.finish is not None or self.cancelled:
            self.phase = Phase.DONE
        else:
            self.phase = Phase.DECODE if self.prompt_done >= self.spec.prompt_tokens else Phase.PREFILL

    @property
    def prompt_left(self) -> int:
        """Uncommitted, unqueued prompt tokens."""
        return self.spec.prompt_tokens - self.prompt_done - self.queued_prompt

    @property
    def output_left(self) -> int:
        return self.spec.max_output_tokens - self.output_done - self.queued_output

    @property
    def context_tokens(self) -> int:
        return self.prompt_done + self.queued_prompt + self.output_done + self.queued_output

    def next_endpoint(self) -> int:
        """Next message endpoint or the prompt end, measured from the queued cursor."""
        cursor = self.prompt_done + self.queued_prompt
        for e in self.spec.endpoints:
            if e > cursor:
                return e
        return self.spec.prompt_tokens


class ResourcePool:
    """Slots and pages. A request holds one slot and its full page extent while resident."""

    def __init__(self, slots: int, pages: int, page_tokens: int, max_context: int, draft_tokens: int = 0):
        self.page_tokens = page_tokens
        self.draft_tokens = draft_tokens
        self.max_context = max_context
        self.total_pages = pages
        self.free_pages = pages
        self._free_slots = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.total_slots = slots

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def extent_pages(self, spec: RequestSpec) -> int:
        # The whole context extent plus declared draft storage, pinned while resident.
        tokens = min(spec.prompt_tokens + spec.max_output_tokens, self.max_context) + self.draft_tokens
        return -(-tokens // self.page_tokens)

    def acquire(self, request: Request) -> None:
        need = self.extent_pages(request.spec)
        if not self._free_slots or need > self.free_pages:
            raise ResourceExhausted(
                f"request {request.handle} needs a slot and {need} pages; "
                f"{len(self._free_slots)} slots and {self.free_pages} pages are free"
            )
        request.slot = self._free_slots.pop()
        request.pages = need
        self.free_pages -= need

    def release(self, request: Request) -> None:
        if request.slot is None:
            return
        self._free_slots.append(request.slot)
        self.free_pages += request.pages
        request.slot, request.pages = None, 0

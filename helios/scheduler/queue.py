"""The execution queue: two transport frames, expected finish times, projected service."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from helios.scheduler.plan import Fence, RequestHandle, ScheduledPlan, SelectionReason


@dataclass(slots=True)
class Frame:
    fence: Fence
    plan: ScheduledPlan
    reason: SelectionReason
    dispatched_ns: int
    expected_end_ns: int | None  # None while the duration is indeterminate
    isolated: bool  # nothing else was in flight at dispatch
    participants: tuple[tuple[RequestHandle, int], ...]  # resident runnable (handle, epoch)
    token_normalizer: float | None
    delivery_normalizer: float | None
    # Expected service frozen at submission: handle -> (tokens, deliveries).
    expected: dict

    @property
    def expected_ms(self) -> float | None:
        d = self.plan.estimated_duration_ns
        return None if d is None else d / 1e6


class ExecutionQueue:
    def __init__(self, frame_slots: int):
        self.frame_slots = frame_slots
        self.frames: deque[Frame] = deque()

    def __len__(self) -> int:
        return len(self.frames)

    def fences(self) -> tuple[Fence, ...]:
        return tuple(f.fence for f in self.frames)

    def head(self) -> Frame | None:
        return self.frames[0] if self.frames else None

    def expected_end_ns(self, now_ns: int) -> int:
        """Planning start time of an appended frame."""
        if not self.frames or self.frames[-1].expected_end_ns is None:
            return now_ns
        return max(now_ns, self.frames[-1].expected_end_ns)

    def accepts_more(self, now_ns: int) -> bool:
        """Room for another frame: a free slot, a queueable tail, and no overrun."""
        if not self.frames:
            return True
        if len(self.frames) >= self.frame_slots:
            return False
        if any(f.plan.requires_feedback for f in self.frames):
            return False
        head = self.frames[0]
        # An overrun suspends queueing until completion supplies feedback.
        return head.expected_end_ns is not None and now_ns <= head.expected_end_ns

    def push(self, frame: Frame) -> None:
        self.frames.append(frame)

    def pop(self) -> Frame:
        return self.frames.popleft()

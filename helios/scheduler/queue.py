"""The execution queue: two transport frames, expected finish times, projected service."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from helios.scheduler.plan import Fence, ScheduledPlan, SelectionReason
from helios.scheduler.service import PHYSICAL, Normalizers


@dataclass(slots=True)
class Frame:
    """A submitted plan. Expected service is the plan's lane columns, frozen at submission.

    Table rows stay valid while the frame is queued for its lanes (a request holding a fence
    is never retired); a participant's row may be reused, so it is checked by (handle, epoch).
    """

    fence: Fence
    plan: ScheduledPlan
    reason: SelectionReason
    dispatched_ns: int
    expected_end_ns: int | None  # None while the duration is indeterminate
    isolated: bool  # nothing else was in flight at dispatch
    rows: np.ndarray  # table row of each lane
    # Live requests at dispatch: row, handle and epoch. When the lanes are every live request,
    # participant_rows is `rows` itself (lane order) and the handles and epochs the lanes'.
    participant_rows: np.ndarray
    participant_handles: np.ndarray
    participant_epochs: np.ndarray
    # The token normalizers of the measured catalog at commit (spec, "Service accounting"): this
    # frame's service is counted in them, whatever is measured by the time it completes.
    normalizers: Normalizers = PHYSICAL
    # The table's turnover at commit when every lane was live (None: a snapshot's terminal
    # captures may be done): unchanged at completion, nothing of the frame finished or was rebound.
    turnover: int | None = None

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
        frames = self.frames
        return tuple(f.fence for f in frames) if frames else ()  # usually empty at a decision

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

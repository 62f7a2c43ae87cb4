"""Service accounting and publication (spec: "Service accounting and publication").

Everything that moves a request's token rate x and delivery rate z lives here: the measured
interval of a completed frame and the publication that resolves its delivery. Both use the
one EWMA of `service.ewma_log`, on the table's columns.
"""

from __future__ import annotations

import numpy as np

from helios.scheduler.plan import Fence
from helios.scheduler.queue import Frame
from helios.scheduler.requests import RequestTable
from helios.scheduler.service import ewma_log


def account_interval(table: RequestTable, frame: Frame, served_tokens: np.ndarray, served_outputs: np.ndarray,
                     delta_ms: float, tau_ms: float) -> None:
    """One measured interval of `delta_ms`: every participant of the frame (the live requests
    at its dispatch) gets the tokens its lanes consumed (zero when unserved) folded into x.

    A delivery is recorded as zero at completion; the publication of the frame's output then
    replaces it with one (`Publications`). `served_*` are lane-aligned with the frame.
    """
    t = table
    tokens = np.zeros(t.capacity)
    outputs = np.zeros(t.capacity, dtype=np.int64)
    tokens[frame.rows] = served_tokens
    outputs[frame.rows] = served_outputs
    rows = frame.participant_rows
    # A cancelled handle cannot charge anyone, even a later request reusing its row.
    rows = rows[t.occupied[rows] & (t.handle[rows] == frame.participant_handles)
                & (t.epoch[rows] == frame.participant_epochs)]
    t.log_x[rows] = ewma_log(t.log_x[rows], delta_ms, tokens[rows], tau_ms)
    produced = outputs[rows] > 0
    has_z = ~np.isnan(t.log_z[rows])
    with_z = rows[has_z]
    # Completion records zero deliveries; the interval stays pending until published.
    t.pending_log_z[with_z] = t.log_z[with_z]
    t.log_z[with_z] -= delta_ms / tau_ms
    t.has_pending[with_z] = produced[has_z]
    first = rows[~has_z & produced]  # a first burst: its delivery rate starts at publication
    t.pending_log_z[first] = np.nan
    t.has_pending[first] = True
    pending = rows[produced]
    t.pending_fence[pending] = frame.fence
    t.pending_delta_ms[pending] = delta_ms


class Publications:
    """Publications reported by the runtime, applied in one vectorized pass before the table is
    next read (`flush`): the scheduler flushes at the top of every call that reads or frees a
    row, so the result is the same as applying each publication when it was reported."""

    def __init__(self, table: RequestTable, tau_ms: float):
        self.table = table
        self.tau_ms = tau_ms
        self._rows: list[int] = []
        self._fences: list[Fence] = []
        self._times: list[int] = []

    def report(self, row: int, fence: Fence, now_ns: int) -> None:
        self._rows.append(row)
        self._fences.append(fence)
        self._times.append(now_ns)

    def flush(self) -> None:
        """Publication resets the output age; the publication of the frame a request's pending
        delivery came from replaces that interval's zero delivery with one. A late publication
        resets age but never rewinds later service."""
        if not self._rows:
            return
        t = self.table
        rows = np.array(self._rows, dtype=np.int64)
        fences = np.array(self._fences, dtype=np.int64)
        times = np.array(self._times, dtype=np.int64)
        self._rows, self._fences, self._times = [], [], []
        t.last_publication_ns[rows] = times  # nondecreasing: the last report of a row wins
        t.has_publication[rows] = True
        match = t.has_pending[rows] & (t.pending_fence[rows] == fences)
        rows = np.unique(rows[match])  # a pending delivery resolves once
        if not len(rows):
            return
        before = t.pending_log_z[rows]
        delta = t.pending_delta_ms[rows]
        first = np.isnan(before)
        # The first burst is one delivery over its frame; later ones fold one delivery in.
        with np.errstate(invalid="ignore"):
            t.log_z[rows] = np.where(first, -np.log(delta), ewma_log(before, delta, 1.0, self.tau_ms))
        t.has_pending[rows] = False

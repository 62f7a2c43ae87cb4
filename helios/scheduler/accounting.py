"""Service accounting and publication (spec: "Service accounting and publication").

Everything that moves a request's token rate x and delivery rate z lives here: the measured
interval of a completed frame and the publication that resolves its delivery. Both use the
one EWMA of `service.ewma_log`, on the table's columns.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from helios.scheduler.plan import Fence
from helios.scheduler.queue import Frame
from helios.scheduler.requests import RequestTable
from helios.scheduler.service import ewma_log, mean_rate_log
from helios.scheduler.utility import count_nonzero


def account_interval(table: RequestTable, frame: Frame, served_tokens, served_outputs: np.ndarray | None,
                     delta_ms: float, tau_ms: float, intact: bool = False, until_served: bool = False,
                     progress: np.ndarray | None = None, memo: dict | None = None) -> None:
    """One measured interval of `delta_ms`: every participant of the frame (the live requests
    at its dispatch) gets the service its lanes received (zero when unserved) folded into x.
    `served_tokens` is already normalized by the frame's commit-time reference rates
    (`Normalizers.normalized_service`): x is a share of the machine, not tokens/ms. It may be
    the float 1.0 when every lane was served one token (ewma_log's one-per-lane form), and
    `served_outputs` None when every lane produced output. Rows on the mean-rate law (a set
    `rate_window_ms`) follow `service.mean_rate_log` instead, with the lanes' first-token `progress`
    (lane-aligned, given whenever a row is on that law); with `until_served` a row leaves the law
    after its first served interval (PromptRateLaw.UNTIL_SERVED).

    A delivery is recorded as zero at completion; the publication of the frame's output then
    replaces it with one (`Publications`). `served_*` are lane-aligned with the frame. `intact`:
    the table's turnover has not moved since commit, so every participant is still valid.
    """
    t = table
    rows = frame.participant_rows
    # A cancelled handle cannot charge anyone, even a later request reusing its row.
    keep = None if intact else (t.occupied[rows] & (t.handle[rows] == frame.participant_handles)
                                & (t.epoch[rows] == frame.participant_epochs))
    whole = intact or count_nonzero(keep) == len(keep)
    if rows is frame.rows and whole:
        # Commit found the lanes to be every participant (the steady state): the served columns
        # are participant-aligned already, with no table-sized scatter and gather.
        tokens = served_tokens
        produced = True if served_outputs is None else served_outputs > 0
    else:
        tokens = np.zeros(t.capacity)
        produced = np.zeros(t.capacity, dtype=bool)
        tokens[frame.rows] = served_tokens
        produced[frame.rows] = True if served_outputs is None else served_outputs > 0
        if not whole:
            rows = rows[keep]
        tokens, produced = tokens[rows], produced[rows]
    log_x = t.log_x[rows]
    tau = t.taus(rows, tau_ms)  # a scalar, or each row's own (class prices)
    t.log_x[rows] = ewma_log(log_x, delta_ms, tokens, tau, memo)
    if t.mean_law_rows:  # prompts on the mean-rate law (StudyConfig.prompt_rate_law)
        window = t.rate_window_ms[rows]
        m = (window == window).nonzero()[0]
        if len(m):
            lane_progress = np.zeros(t.capacity)
            lane_progress[frame.rows] = progress
            served = lane_progress[rows[m]]
            t.log_x[rows[m]] = mean_rate_log(log_x[m], window[m], delta_ms, served)
            t.rate_window_ms[rows[m]] = window[m] + delta_ms
            if until_served:  # its first service starts its history: the EWMA from now on
                t.leave_mean_law(rows[m[served > 0]])
    every = produced is True or count_nonzero(produced) == len(produced)
    log_z = t.log_z[rows]
    has_z = log_z == log_z  # not NaN
    if count_nonzero(has_z) == len(has_z):  # every participant has a delivery history
        with_z, z, hz_produced = rows, log_z, produced
    else:
        with_z, z = rows[has_z], log_z[has_z]
        tau = tau[has_z] if isinstance(tau, np.ndarray) else tau
        hz_produced = True if every else produced[has_z]
        first = rows[~has_z & produced]  # a first burst: its delivery rate starts at publication
        t.pending_log_z[first] = np.nan
        t.has_pending[first] = True
    # Completion records zero deliveries; the interval stays pending until published.
    t.pending_log_z[with_z] = z
    t.log_z[with_z] = z - delta_ms / tau
    t.has_pending[with_z] = hz_produced
    pending = rows if every else rows[produced]
    t.pending_fence[pending] = frame.fence
    t.pending_delta_ms[pending] = delta_ms
    # Every lane produced, every participant with a delivery history, lanes and participants
    # the same rows: what the publication of these rows for this fence will read (flush).
    t.pending_batch = (rows, frame.fence, z, delta_ms) if every and with_z is rows and rows is frame.rows else None


class Publications:
    """Publications reported by the runtime, applied in one vectorized pass before the table is
    next read (`flush`): the scheduler flushes at the top of every call that reads or frees a
    row, so the result is the same as applying each publication when it was reported."""

    def __init__(self, table: RequestTable, tau_ms: float, memo: dict | None = None):
        self.table = table
        self.tau_ms = tau_ms
        self.memo = memo  # the scheduler's Memo.decay
        # (rows, fence, time) batches in report order; the scheduler appends to it directly.
        # Rows are a list, or a completion's read-only row array (Scheduler.published_outputs).
        self.reported: list[tuple[list[int] | np.ndarray, Fence, int]] = []

    def flush(self) -> None:
        """Publication resets the output age; the publication of the frame a request's pending
        delivery came from replaces that interval's zero delivery with one. A late publication
        resets age but never rewinds later service."""
        if not self.reported:
            return
        t = self.table
        batches, self.reported = self.reported, []
        # Usually one frame's publications at one time: scalars then stand for whole columns.
        _, fence, time = batches[0]
        batch, t.pending_batch = t.pending_batch, None
        if len(batches) == 1:
            rows = batches[0][0]
            if batch is not None and rows is batch[0] and fence == batch[1]:
                # The bursts of the last accounted frame (Scheduler.published_outputs): every row
                # resolves its pending delivery, none is a first burst, the pending values are the
                # accounted ones. The general path below computes the same from the columns.
                t.last_publication_ns[rows] = time
                t.has_publication[rows] = True
                t.has_pending[rows] = False
                t.log_z[rows] = ewma_log(batch[2], batch[3], 1.0, t.taus(rows, self.tau_ms), self.memo)
                return
            if type(rows) is not np.ndarray:
                rows = np.fromiter(rows, np.int64, len(rows))
        else:
            sizes = [len(b[0]) for b in batches]
            rows = np.fromiter(chain.from_iterable(b[0] for b in batches), np.int64, sum(sizes))
            if any(b[1] != fence for b in batches):
                fence = np.repeat(np.fromiter((b[1] for b in batches), np.int64, len(batches)), sizes)
            if any(b[2] != time for b in batches):
                time = np.repeat(np.fromiter((b[2] for b in batches), np.int64, len(batches)), sizes)
        t.last_publication_ns[rows] = time  # nondecreasing: the last report of a row wins
        t.has_publication[rows] = True
        resolved = t.has_pending[rows] & (t.pending_fence[rows] == fence)
        k = count_nonzero(resolved)
        if not k:
            return
        if k != len(resolved):  # usually every published row resolves its pending delivery
            rows = rows[resolved]
        # A row reported twice for its pending fence resolves to the same values twice (every
        # value below is computed before any is stored): the delivery still counts once.
        t.has_pending[rows] = False
        before = t.pending_log_z[rows]
        first = np.isnan(before)
        # One fence: one frame's interval, so every resolved row has the same pending delta (a
        # scalar delta lets ewma_log reuse its terms; elementwise, the values are the same).
        single = type(fence) is int
        delta = t.pending_delta_ms.item(rows[0]) if single else t.pending_delta_ms[rows]
        # The first burst is one delivery over its frame; later ones fold one delivery in.
        if count_nonzero(first):
            t.log_z[rows[first]] = -np.log(t.pending_delta_ms[rows[first]])
            later = ~first
            rows, before = rows[later], before[later]
            if not single:
                delta = delta[later]
        t.log_z[rows] = ewma_log(before, delta, 1.0, t.taus(rows, self.tau_ms), self.memo)

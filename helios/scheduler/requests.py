"""Request state as columns: one dense row per held request, with a free list.

Every per-request quantity the hot path reads is a numpy column indexed by row, so planning,
commit and completion work with masks and fancy indexing instead of per-request objects.
A row is taken at admission and freed when the request retires (done, and no submitted fence
still holds it); a freed row is reused by a later admission. Handles are never reused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from helios.scheduler.class_prices import ClassPrices
from helios.scheduler.plan import NO_SLOT, FinishReason, RequestHandle
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.service_class import DEFAULT_TENANT
from helios.scheduler.speculation import SpeculationColumns
from helios.scheduler.tenant_share import TenantShares
from helios.scheduler.utility import count_nonzero


class Phase(IntEnum):
    PREFILL = 0  # prompt not fully consumed (resident or not)
    DECODE = 1  # prompt consumed: a delivery-bearing stream
    DONE = 2  # finished or cancelled; resources held until the last fence


# The phase column's codes as plain ints: numpy compares them without probing an enum member.
PREFILL, DECODE, DONE = (int(p) for p in Phase)


_INT_COLUMNS = ("handle", "epoch", "version", "prompt_tokens", "max_output", "prompt_done", "output_done",
                "queued_prompt", "queued_output", "slot", "pages", "inflight", "last_served_seq",
                "last_publication_ns", "pending_fence", "resident_ns")
# resident_ns: when the request last got its slot (first commit or restore), for the preemption quantum.
# rate_window_ms: the averaging window of a prompt-phase mean rate (service.mean_rate_log); NaN on the EWMA.
# Class prices (class_prices.py): log_w the log-utility weight, tau_ms the adaptation time of the
# row's current phase (the prompt phase's until the prompt is consumed, then the stream's); log_w_own
# the weight before the tenant's 1/n share (tenant_share.py). gap_target_ms: the class's stated gap
# target, NaN without one (StudyConfig.class_gap_bound).
_FLOAT_COLUMNS = ("log_x", "log_z", "pending_delta_ms", "pending_log_z", "rate_window_ms", "log_w", "tau_ms",
                  "stream_tau_ms", "log_w_own", "gap_target_ms")
# priced: the row's class prices differ from the policy's (counted in RequestTable.class_rows);
# output_only: its prompt chunks are no service (ClassPrices.output_only).
_BOOL_COLUMNS = ("occupied", "cancelled", "finished", "host_feedback", "score_prompt", "has_endpoints",
                 "has_publication", "has_pending", "priced", "output_only")


@dataclass(frozen=True, slots=True)
class RequestRow:
    """A read-only copy of one request's row, for tests and debugging (never the hot path)."""

    handle: RequestHandle
    spec: RequestSpec
    phase: Phase
    epoch: int
    version: int
    slot: int | None
    pages: int
    prompt_done: int
    output_done: int
    queued_prompt: int
    queued_output: int
    inflight: int
    finish: FinishReason | None
    log_x: float
    log_z: float | None
    last_publication_ns: int | None
    last_served_seq: int

    @property
    def prompt_left(self) -> int:
        return self.spec.prompt_tokens - self.prompt_done - self.queued_prompt

    @property
    def output_left(self) -> int:
        return self.spec.max_output_tokens - self.output_done - self.queued_output


class RequestTable:
    """The columns (`depth`: the draft capacity of the speculation matrices). `last_served_seq` is the decision counter of the last service (0: never
    served), `log_z` is NaN until the first published burst, `pending_*` hold the delivery
    interval a publication will resolve (`pending_log_z` NaN: the first burst)."""

    def __init__(self, depth: int, capacity: int = 64):
        self.capacity = 0
        self.speculation = SpeculationColumns(depth)  # [rows, depth] acceptance and forecast
        self.index: dict[RequestHandle, int] = {}
        self.specs: list[RequestSpec | None] = []
        self.finish: list[FinishReason | None] = []
        self._free: list[int] = []
        # Bumped whenever a request finishes or is rebound to a new epoch (set_finish, rebind): the
        # only ways a live request stops being live, or a row stops holding the request it held
        # (a row is freed only when done). A frame committed at the current turnover still has
        # every lane live and every participant valid, and completion skips checking them.
        self.turnover = 0
        # live_rows() until a phase or a row's request changes (update_phase, add, remove, _grow
        # are the only writers of the phase and handle columns): most decisions end no request.
        self._live: np.ndarray | None = None
        self._live_columns: tuple | None = None  # (live rows, *live_columns(them))
        # (rows, fence, pending log z, delta) of the last accounted frame whose publication can
        # skip reading the pending columns back (accounting.py); cleared by any other write to them.
        self.pending_batch: tuple | None = None
        self.mean_law_rows = 0  # live rows whose prompt phase is on the mean-rate law (rate_window_ms set)
        # Held rows whose class prices differ from the policy's. While none does, every reader takes
        # the policy's scalar tau and no weight: today's arithmetic, value for value.
        self.class_rows = 0
        self.shares = TenantShares()  # the tenants' 1/n shares, over the classed rows only
        for name in _INT_COLUMNS:
            setattr(self, name, np.zeros(0, dtype=np.int64))
        for name in _FLOAT_COLUMNS:
            setattr(self, name, np.zeros(0))
        for name in _BOOL_COLUMNS:
            setattr(self, name, np.zeros(0, dtype=bool))
        self.phase = np.zeros(0, dtype=np.int8)
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        self._live = None
        for name in _INT_COLUMNS + _FLOAT_COLUMNS + _BOOL_COLUMNS + ("phase",):
            col = getattr(self, name)
            new = np.zeros(capacity, dtype=col.dtype)
            new[:old] = col
            setattr(self, name, new)
        self.phase[old:] = DONE  # a free row is never live
        self.specs += [None] * (capacity - old)
        self.speculation.grow(capacity)
        self.finish += [None] * (capacity - old)
        # pop() hands out the lowest free row first.
        self._free = list(range(capacity - 1, old - 1, -1)) + self._free
        self.capacity = capacity

    # ---- rows ------------------------------------------------------------------------
    def add(self, handle: RequestHandle, spec: RequestSpec, log_x: float, window_ms: float | None = None,
            prices: ClassPrices | None = None, tau_ms: float = 0.0) -> int:
        """A new row at starting rate log_x; `window_ms` puts its prompt phase on the mean-rate law.
        `prices`: the request's class coefficients (None or equal to the policy's `tau_ms` and weight
        one: priced as before classes existed)."""
        if not self._free:
            self._grow(2 * self.capacity)
        row = self._free.pop()
        self.index[handle] = row
        self.specs[row] = spec
        self.speculation.clear(row)
        self.finish[row] = None
        for name in _INT_COLUMNS:
            getattr(self, name)[row] = 0
        for name in _BOOL_COLUMNS:
            getattr(self, name)[row] = False
        self.handle[row] = handle
        self.prompt_tokens[row] = spec.prompt_tokens
        self.max_output[row] = spec.max_output_tokens
        self.prompt_done[row] = spec.cached_tokens  # cached tokens count as consumed
        self.slot[row] = NO_SLOT
        self.occupied[row] = True
        self.host_feedback[row] = spec.host_feedback
        self.score_prompt[row] = spec.score_prompt
        self.has_endpoints[row] = bool(spec.endpoints)
        self.log_x[row] = log_x
        self.log_z[row] = np.nan
        self.pending_delta_ms[row] = 0.0
        self.pending_log_z[row] = np.nan
        self.pending_batch = None
        self.rate_window_ms[row] = np.nan if window_ms is None else window_ms
        self.mean_law_rows += window_ms is not None
        gap = None if prices is None else prices.gap_target_ms
        self.gap_target_ms[row] = np.nan if gap is None else gap
        if prices is None:
            self.log_w[row], self.tau_ms[row], self.stream_tau_ms[row] = 0.0, tau_ms, tau_ms
        else:
            self.log_w[row] = math.log(prices.weight)
            self.tau_ms[row], self.stream_tau_ms[row] = prices.wait_tau_ms, prices.stream_tau_ms
            self.output_only[row] = prices.output_only
            self.priced[row] = (prices.weight != 1.0 or prices.wait_tau_ms != tau_ms
                                or prices.stream_tau_ms != tau_ms or prices.output_only)
            self.class_rows += bool(self.priced[row])
            self.log_w_own[row] = self.log_w[row]
            if self.priced[row] and spec.client != DEFAULT_TENANT:  # anonymous: each its own tenant
                self.shares.join(self, row, spec.client)
        self.update_phase(np.array([row]))
        return row

    def remove(self, row: int) -> None:
        del self.index[int(self.handle[row])]
        self.shares.leave(self, (row,))  # done rows have left already: a no-op
        self.occupied[row] = False
        self.class_rows -= bool(self.priced[row])
        self.priced[row] = False
        self.phase[row] = DONE
        self._live = None
        self.specs[row] = None
        self._free.append(row)

    def row(self, handle: RequestHandle) -> int | None:
        return self.index.get(handle)

    def __contains__(self, handle) -> bool:
        return handle in self.index

    def __len__(self) -> int:
        return len(self.index)

    def __iter__(self):
        return iter(self.index)  # handles, in admission order

    def __getitem__(self, handle: RequestHandle) -> RequestRow:
        r = self.index[handle]
        slot = int(self.slot[r])
        return RequestRow(handle, self.specs[r], Phase(int(self.phase[r])), int(self.epoch[r]),
                          int(self.version[r]), None if slot == NO_SLOT else slot, int(self.pages[r]),
                          int(self.prompt_done[r]), int(self.output_done[r]), int(self.queued_prompt[r]),
                          int(self.queued_output[r]), int(self.inflight[r]), self.finish[r],
                          float(self.log_x[r]), None if np.isnan(self.log_z[r]) else float(self.log_z[r]),
                          int(self.last_publication_ns[r]) if self.has_publication[r] else None,
                          int(self.last_served_seq[r]))

    def get(self, handle: RequestHandle) -> RequestRow | None:
        return self[handle] if handle in self.index else None

    # ---- vectorized reads --------------------------------------------------------------
    def live_rows(self) -> np.ndarray:
        """Rows of live (not done) requests in admission order: every tie-break that falls
        through to position sees the same order as a handle-ordered list. Read-only: the same
        array is returned until a phase or a row's request changes."""
        if self._live is not None:
            return self._live
        rows = (self.phase != DONE).nonzero()[0]
        handles = self.handle[rows].tolist()
        if handles != sorted(handles):  # the usual case: rows were taken in admission order
            rows = rows[np.argsort(self.handle[rows], kind="stable")]
        rows.setflags(write=False)
        self._live = rows
        return rows

    def live_columns(self, rows: np.ndarray) -> tuple:
        """(phase, handle, max_output, positions of the decoding rows) at `rows`, read-only; for
        the current live_rows() array, computed once with it (none of them can change before it
        does: the phase and handle columns change only with the live rows, max_output never)."""
        live = self._live
        if rows is not live or live is None:
            return self._columns_at(rows)
        cols = self._live_columns
        if cols is None or cols[0] is not live:
            cols = self._live_columns = (live, *self._columns_at(live))
        return cols[1:]

    def _columns_at(self, rows: np.ndarray) -> tuple:
        phase = self.phase[rows]
        cols = (phase, self.handle[rows], self.max_output[rows], (phase == DECODE).nonzero()[0])
        for col in cols:
            col.setflags(write=False)
        return cols

    def live_count(self) -> int:
        """len(live_rows()), from its cached rows when they are current."""
        live = self._live
        return len(live) if live is not None else int(count_nonzero(self.phase != DONE))

    def prompt_left(self, rows) -> np.ndarray:
        """Uncommitted, unqueued prompt tokens."""
        return self.prompt_tokens[rows] - self.prompt_done[rows] - self.queued_prompt[rows]

    def output_left(self, rows) -> np.ndarray:
        return self.max_output[rows] - self.output_done[rows] - self.queued_output[rows]

    def context_tokens(self, rows) -> np.ndarray:
        return self.prompt_done[rows] + self.queued_prompt[rows] + self.output_done[rows] + self.queued_output[rows]

    def to_endpoint(self, rows) -> np.ndarray:
        """Tokens from the committed cursor to the next message endpoint (or the prompt end),
        the endpoint taken after the queued cursor."""
        rows = np.asarray(rows, dtype=np.int64)
        ends = self.prompt_tokens[rows].copy()
        for i in self.has_endpoints[rows].nonzero()[0].tolist():
            r = int(rows[i])
            cursor = int(self.prompt_done[r] + self.queued_prompt[r])
            ends[i] = next((e for e in self.specs[r].endpoints if e > cursor), ends[i])
        return ends - self.prompt_done[rows]

    def set_finish(self, row: int, reason: FinishReason) -> None:
        self.finish[row] = reason
        self.finished[row] = True
        self.turnover += 1

    def rebind(self, row: int) -> None:
        """A fresh epoch: results and plans of the old one no longer apply to the row."""
        self.epoch[row] += 1
        self.version[row] += 1
        self.turnover += 1

    def update_phase(self, rows) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        self._live = None
        done = self.cancelled[rows] | self.finished[rows]
        decode = self.prompt_done[rows] >= self.prompt_tokens[rows]
        self.phase[rows] = np.where(done, DONE, np.where(decode, DECODE, PREFILL))
        if self.class_rows:  # a consumed prompt: the stream phase's adaptation time from now on
            streaming = rows[decode]
            self.tau_ms[streaming] = self.stream_tau_ms[streaming]
            if done.any():  # done requests leave their tenant's share
                self.shares.leave(self, rows[done & self.priced[rows]].tolist())
        if self.mean_law_rows:  # leaving the prompt phase ends the mean-rate law
            self.leave_mean_law(rows[self.phase[rows] != PREFILL])

    def taus(self, rows, tau_ms: float):
        """The adaptation times of `rows`: the policy's scalar `tau_ms` while no row has class
        prices (the same arithmetic as before classes), else the rows' own column."""
        return self.tau_ms[rows] if self.class_rows else tau_ms

    def credited_prompt(self, rows, prompt_tokens, credits_prompt: bool):
        """The prompt tokens of lanes on `rows` that count as service: all of them on a law that credits
        prompts, except on rows whose class counts only output; none on a law that does not."""
        if not credits_prompt:
            return 0
        if not self.class_rows:
            return prompt_tokens
        return np.where(self.output_only[rows], 0, prompt_tokens)

    def log_weights(self, rows):
        """log w of `rows`, or None while no row has class prices (weight one: nothing to add)."""
        return self.log_w[rows] if self.class_rows else None

    def leave_mean_law(self, rows: np.ndarray) -> None:
        """Rows that leave the mean-rate law: the EWMA continues from the same rate."""
        window = self.rate_window_ms[rows]
        leaving = rows[window == window]
        self.rate_window_ms[leaving] = np.nan
        self.mean_law_rows -= len(leaving)

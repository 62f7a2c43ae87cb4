"""State operations in the scheduler: prerequisite restores and terminal captures.

Restore (a prerequisite). A request admitted with `cached_tokens` > 0 while the catalog holds
RESTORE graphs has a checkpoint of its first `cached_tokens` prompt tokens: a RESTORE graph must
bind it to a fresh slot before any prefill. Until that restore completes the request is not
ready (no prefill candidate sees it); the restore itself competes by value per time with the
spec's continuation index V*T/(T+F), V being the service of the prefill chunk it enables and F
that chunk's duration (prerequisites.py).

Terminal capture. When completion identifies the normal termination (EOS, length, context) of
a request whose prompt carries message endpoints (a conversation), the request's final state is
a checkpoint worth keeping: the response is the conversation's last completed message, its best-
effort anchor, and the next turn extends it. Without endpoints, the capture is an extra: it is
funded by the request's productive decode, which earns `checkpoint_extra_work_fraction` of each
measured decode interval it took part in, and it is taken only when that allowance covers the
snapshot's measured estimate (unknown costs disable extras). The request then retires through a
SNAPSHOT graph instead of at once. Its lane contributes

    terminal_value + terminal_age_price * sigma * (A + T)

with A the age since termination and sigma the snapshot family's batch-feasible reference
interval, and its age coefficient enters every candidate's common waiting cost. The visible end
of the response (the terminating burst) is held back until the snapshot completed, so a client's
immediate continuation is admitted only after the checkpoint was published. Captured rows keep
their slot and pages (fenced ownership) through the snapshot's completion, whatever its outcome.

Preemption. `preempt` retires a resident decoding request through the same SNAPSHOT without
completing its response: its terminal age starts at preemption, it is no longer selected, and
once the snapshot completed its slot and pages are released and it waits, still live, for a
RESTORE of its exact state (a fresh generation: epoch and version move on), after which it
decodes on from its pending token as if never interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helios.config import PolicyConfig
from helios.errors import InvalidRequest
from helios.graphs import Catalog, GraphKind
from helios.scheduler.lanes import state_lanes
from helios.scheduler.plan import NO_SLOT, FinishReason, GeneratedToken, PlanLanes, RequestHandle
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.requests import DECODE, RequestTable

# Normal terminations: the state is complete and consistent, so it can be published.
_CAPTURED = (FinishReason.EOS, FinishReason.LENGTH, FinishReason.CONTEXT)


@dataclass(frozen=True, slots=True)
class Capture:
    """A terminated request waiting for its terminal snapshot."""

    reason: FinishReason
    since_ns: int  # termination time: the terminal age starts here and nothing resets it
    endpoint: int  # state tokens to copy: prompt plus every output but the pending last one
    tail: tuple[int, ...]  # the held terminating token(s), published with the finish
    preempted: bool = False


class StateOperations:
    """Pending restores and terminal captures of one scheduler (pure bookkeeping)."""

    def __init__(self, catalog: Catalog, policy: PolicyConfig, planned: bool = True, extra_fraction: float = 0.05):
        self.snapshot_shapes = catalog.of_kind(GraphKind.SNAPSHOT)
        self.restore_shapes = catalog.of_kind(GraphKind.RESTORE)
        self.policy = policy
        # Restores need both graphs: what a restore reads, a snapshot must have written.
        self.enabled = planned and bool(self.snapshot_shapes and self.restore_shapes)
        self.restoring: dict[RequestHandle, int] = {}  # handle -> checkpoint tokens, until restored
        self.captures: dict[RequestHandle, Capture] = {}
        # Automatic preemption (preemption.py): victim -> the waiter it yielded its slot to, until
        # that waiter has started or ended; meanwhile no preempted decoder restores.
        self.held: dict[RequestHandle, RequestHandle] = {}
        self.extra_fraction = extra_fraction
        self.earned_ms: dict[RequestHandle, float] = {}  # decode-funded capture allowance

    # ---- admission and readiness ----------------------------------------------------------
    def admitted(self, handle: RequestHandle, spec: RequestSpec) -> None:
        if self.enabled and spec.cached_tokens:
            self.restoring[handle] = spec.cached_tokens

    def not_ready(self, t: RequestTable, rows: np.ndarray) -> np.ndarray:
        """Mask over `rows`: requests whose restore has not completed yet, and preempted ones
        waiting for their snapshot."""
        if not self.restoring and not self.captures:
            return np.zeros(len(rows), dtype=bool)
        held = list(self.restoring) + [h for h, c in self.captures.items() if c.preempted]
        return np.isin(t.handle[rows], np.array(held, dtype=np.int64))

    def preempt(self, t: RequestTable, handle: RequestHandle, now_ns: int) -> None:
        """Start retiring a resident decoder through a snapshot, to resume it later by restore."""
        row = t.index.get(handle)
        if not self.enabled:
            raise InvalidRequest("preemption needs SNAPSHOT and RESTORE graphs in the catalog")
        if row is None or t.phase[row] != DECODE or t.slot[row] == NO_SLOT or handle in self.captures:
            raise InvalidRequest(f"request {handle} is not a resident decoding request")
        # The endpoint is read when the snapshot is planned: frames in flight may still commit.
        self.captures[handle] = Capture(FinishReason.LENGTH, now_ns, 0, (), preempted=True)
        t.version[row] += 1  # plans made before preemption are stale

    def holds(self, handle: RequestHandle) -> bool:
        """A captured request keeps its row, slot and pages until its snapshot completed."""
        return handle in self.captures

    def forget(self, handle: RequestHandle) -> None:
        """A cancelled request no longer waits for a restore (its fenced resources stay owned)."""
        self.restoring.pop(handle, None)
        self.earned_ms.pop(handle, None)
        self.held.pop(handle, None)

    def earn(self, kind: GraphKind, handles, measured_ms: float | None) -> None:
        """Productive decode earns the extra-work fraction of its measured interval."""
        if not self.enabled or measured_ms is None or kind.is_prefill or not kind.produces_tokens:
            return
        credit = self.extra_fraction * measured_ms
        for h in handles:
            self.earned_ms[h] = self.earned_ms.get(h, 0.0) + credit

    # ---- completion ---------------------------------------------------------------------
    def completed(self, t: RequestTable, kind: GraphKind, handles, fence: int, now_ns: int,
                  out: list[GeneratedToken], release, snapshot_ms: float | None = None) -> list[GeneratedToken]:
        """After a frame's ordinary completion: resolve its state operations, and turn this
        frame's normal terminations into captures (their terminating burst held back).
        `release(row)` returns a preempted request's slot and pages; `snapshot_ms` is the
        snapshot family's measured estimate (None: unknown)."""
        result: list[GeneratedToken] = []
        if kind is GraphKind.RESTORE:
            for h in handles:
                self.restoring.pop(h, None)
        elif kind is GraphKind.SNAPSHOT:
            for h in handles:
                cap = self.captures.pop(h, None)
                if cap is None:
                    continue
                if not cap.preempted:
                    result.append(GeneratedToken(h, fence, cap.tail, cap.reason, False))
                elif t.phase[row := t.index[h]] == DECODE:  # not cancelled meanwhile
                    release(row)
                    t.rebind(row)  # the restore binds the state to a fresh generation
                    self.restoring[h] = _state_tokens(t, row)
        for g in out:
            if g.finish is None:
                result.append(g)
                continue
            earned = self.earned_ms.pop(g.handle, 0.0)
            if g.finish in _CAPTURED and self._eligible(t, g.handle, earned, snapshot_ms):
                row = t.index[g.handle]
                tail = g.tokens[-1:] if g.finish is FinishReason.EOS else ()
                head = g.tokens[: len(g.tokens) - len(tail)]
                endpoint = int(t.prompt_done[row] + t.output_done[row]) - 1
                self.captures[g.handle] = Capture(g.finish, now_ns, endpoint, tail)
                if head or g.first:
                    result.append(GeneratedToken(g.handle, g.fence, head, None, g.first))
            else:
                result.append(g)
        return result

    def _eligible(self, t: RequestTable, handle: RequestHandle, earned_ms: float, snapshot_ms: float | None) -> bool:
        row = t.index.get(handle)
        if not self.enabled or row is None or t.slot[row] == NO_SLOT:
            return False
        # With neither a terminal value nor an age price, a capture could wait forever.
        if self.policy.terminal_value <= 0 and self.policy.terminal_age_price <= 0:
            return False
        # A conversation's response is its anchor; anything else is an extra the decode funded.
        return bool(t.has_endpoints[row]) or (snapshot_ms is not None and earned_ms >= snapshot_ms)

    # ---- lanes -----------------------------------------------------------------------------
    def lanes(self, t: RequestTable, kind: GraphKind, rows: np.ndarray, values: np.ndarray) -> PlanLanes:
        """Lanes of a state operation: no prompt consumed, no output row; `context_tokens` is
        the exact endpoint copied (snapshot) or restored (restore)."""
        if kind is GraphKind.SNAPSHOT:
            caps = [self.captures[int(h)] for h in t.handle[rows]]
            context = np.array([_state_tokens(t, int(r)) if c.preempted else c.endpoint
                                for c, r in zip(caps, rows.tolist())], dtype=np.int64)
        else:
            context = np.array([self.restoring[int(h)] for h in t.handle[rows]], dtype=np.int64)
        return state_lanes(t, rows, context, values)


def _state_tokens(t: RequestTable, row: int) -> int:
    """Tokens in a decoding request's state: prompt and committed outputs but the pending one."""
    return int(t.prompt_done[row] + t.output_done[row]) - 1

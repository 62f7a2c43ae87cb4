"""Extra prefill cuts at conversation anchors, funded by a request-local allowance.

Spec ("Checkpoint retention"): earlier messages are considered in reverse order, followed by a
distinct prompt end; additional prefill splits and snapshot copies must fit a request-local
allowance of checkpoint_extra_work_fraction times the estimated uncached prefill work; unknown
costs disable extras; an extra cut's copy may be skipped once its split has executed.

The plan is made once, at admission, from the estimates known then (pure: no clock). A request
admitted before the prefill or snapshot graphs were measured gets no extras (unknown costs);
the terminal capture (checkpoints.py) stays its anchor.

    allowance = fraction * tiled_ms(prompt - cached)
    candidates: endpoints > cached, latest first, then the prompt end (RequestSpec keeps every
                endpoint strictly inside the prompt, so the prompt end is always distinct)
    cost(cut) = snapshot estimate + max(0, tiled cost of the segments with the cut
                                          - tiled cost of the segments without it)

Each candidate is taken when its cost fits what is left of the allowance (first fit in that
order). `tiled_ms(L)` is the estimated prefill time of L tokens as one-row chunks: full chunks of
the measured one-row prefill graph with the lowest time per token, the rest in the cheapest
measured one-row graph that holds it. A split's extra cost is then the extra (partial) chunk it
forces, measured on the same graphs that will run it; a cut at the prompt end splits nothing.

Execution, per request:

    prefill chunks stop at the next planned cut (the view's clip, composed with a vision clip)
    a chunk's completion reaches the cut  -> the cut is due (skipped if the snapshot's estimate
                                             expired or vanished: the split stays, the copy goes)
    due: not ready; a nonterminal SNAPSHOT of exactly the cut (plan.anchor) competes as a
         prerequisite valued by the continuation index V*T/(T+F) of the chunk (or, at the
         prompt end, the decode step) it enables, with no priority override
    the snapshot completes                -> the request continues with its slot and pages

The anchor snapshot keeps the slot and pages (the request stays resident and owns them as any
live request); the core copies the state as a published ANCHOR entry. Cancellation or
termination drops the request's plan; a snapshot in flight keeps its row through its fence.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from helios.graphs import GraphKind
from helios.scheduler.cost import CostState, cost_lookup
from helios.scheduler.lanes import state_lanes
from helios.scheduler.plan import NO_SLOT, PlanLanes, RequestHandle
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.policy import LanePool, finish_candidate
from helios.scheduler.prerequisite import Prerequisite
from helios.scheduler.prerequisites import StateCandidate, continuation_index
from helios.scheduler.requests import DONE, PREFILL, RequestTable
from helios.scheduler.service import PriceCoefficients, log_prices
from helios.scheduler.utility import ranked_lanes


def tiled_ms(tokens: int, graphs: list[tuple[int, float]]) -> float:
    """Estimated one-row prefill time of `tokens` over measured (token capacity, ms) graphs."""
    if tokens <= 0:
        return 0.0
    cap, ms = min(graphs, key=lambda g: (g[1] / g[0], -g[0]))
    full, rest = divmod(tokens, cap)
    tail = min((m for c, m in graphs if c >= rest), default=ms) if rest else 0.0
    return full * ms + tail


def segments_ms(start: int, end: int, cuts, graphs) -> float:
    bounds = [start, *sorted(cuts), end]
    return sum(tiled_ms(b - a, graphs) for a, b in zip(bounds, bounds[1:]))


def plan_cuts(spec: RequestSpec, graphs: list[tuple[int, float]], snapshot_ms: float | None,
              fraction: float) -> tuple[int, ...]:
    """The cuts (ascending) a request's allowance funds; () with unknown costs."""
    if snapshot_ms is None or not graphs or fraction <= 0:
        return ()
    start, end = spec.cached_tokens, spec.prompt_tokens
    allowance = fraction * tiled_ms(end - start, graphs)
    inside = [(im.offset, im.end) for im in spec.images]
    order = [e for e in reversed(spec.endpoints) if e > start] + [end]
    chosen: list[int] = []
    spent = 0.0
    for e in order:
        if e in chosen or any(a < e < b for a, b in inside):  # a cut never splits an image
            continue
        cost = snapshot_ms + max(0.0, segments_ms(start, end, chosen + [e], graphs)
                                 - segments_ms(start, end, chosen, graphs))
        if spent + cost <= allowance:
            chosen.append(e)
            spent += cost
    return tuple(sorted(chosen))


@dataclass(slots=True)
class AnchorState:
    cuts: list[int]  # planned cuts not reached yet, ascending
    due: int | None = None  # a reached cut waiting for its anchor snapshot


@dataclass(slots=True)
class AnchorCandidate(StateCandidate):
    """A nonterminal anchor snapshot."""


@dataclass
class AnchorCuts:
    """Planned and due anchor cuts of one scheduler (pure bookkeeping)."""

    snapshot_shapes: tuple
    prefill_shapes: dict  # prefill kind -> its shapes
    enabled: bool
    fraction: float
    requests: dict[RequestHandle, AnchorState] = field(default_factory=dict)
    skipped: int = 0  # due copies skipped because their cost expired

    @classmethod
    def of(cls, catalog, shapes, enabled: bool, fraction: float) -> "AnchorCuts":
        kinds = (GraphKind.PREFILL, GraphKind.SCORED_PREFILL)
        return cls(catalog.of_kind(GraphKind.SNAPSHOT), {k: shapes.prefill_of(k) for k in kinds},
                   enabled and fraction > 0, fraction)

    # ---- admission --------------------------------------------------------------------------
    def admitted(self, handle: RequestHandle, spec: RequestSpec, estimate_ns) -> None:
        if not self.enabled or not spec.endpoints:
            return
        kind = GraphKind.SCORED_PREFILL if spec.score_prompt else GraphKind.PREFILL
        graphs = [(s.token_capacity, ns / 1e6) for s in self.prefill_shapes[kind]
                  if s.batch_capacity == 1 and (ns := estimate_ns(s)) is not None]
        snaps = [ns for s in self.snapshot_shapes if (ns := estimate_ns(s)) is not None]
        cuts = plan_cuts(spec, graphs, min(snaps) / 1e6 if snaps else None, self.fraction)
        if cuts:
            self.requests[handle] = AnchorState(list(cuts))

    def forget(self, handle: RequestHandle) -> None:
        self.requests.pop(handle, None)

    # ---- readiness and the prefill clip -----------------------------------------------------
    def not_ready(self, t: RequestTable, rows: np.ndarray) -> np.ndarray:
        """Mask over `rows`: a due cut, or a prompt whose queued cursor sits at its next cut."""
        handles = t.handle[rows]
        mask = np.isin(handles, np.fromiter(self.requests, dtype=np.int64, count=len(self.requests)))
        for i in mask.nonzero()[0].tolist():  # only the rows with planned or due cuts
            a, r = self.requests[int(handles[i])], int(rows[i])
            mask[i] = a.due is not None or (
                bool(a.cuts) and t.phase[r] == PREFILL and int(t.prompt_done[r] + t.queued_prompt[r]) == a.cuts[0])
        return mask

    def restrict(self, view, t: RequestTable) -> None:
        """No prefill chunk passes its request's next cut (composed with any vision clip)."""
        for pool, prow in view.prefill.values():
            states = [self.requests.get(h) for h in pool.handles.tolist()]
            if any(a is not None and a.cuts for a in states):
                pool.clip = _clipper(states, (t.prompt_done[prow] + t.queued_prompt[prow]).tolist(), pool.clip)

    # ---- completion -------------------------------------------------------------------------
    def completed(self, t: RequestTable, plan, cost_state) -> None:
        """After a frame's completion. `cost_state(shape)`: the snapshot estimate's state now."""
        for h in plan.handles:
            a = self.requests.get(h)
            if a is None:
                continue
            row = t.index.get(h)
            if row is None or t.phase[row] == DONE:
                del self.requests[h]  # finished (its terminal capture covers it) or cancelled
                continue
            if plan.anchor:
                a.due = None
            elif a.cuts and t.queued_prompt[row] == 0 and t.prompt_done[row] == a.cuts[0]:
                cut = a.cuts.pop(0)
                # The split has executed; the copy goes only while its cost is still known and fresh.
                if any(cost_state(s) is CostState.FRESH for s in self.snapshot_shapes):
                    a.due = cut
                else:
                    self.skipped += 1
            if a.due is None and not a.cuts:
                del self.requests[h]

    # ---- candidates ---------------------------------------------------------------------------
    def log_scale(self, t: RequestTable, coeff: PriceCoefficients) -> float:
        """The largest log price of due requests (not in the view's pools): the view's floor."""
        rows = [t.index[h] for h, a in self.requests.items() if a.due is not None and h in t.index]
        if not rows:
            return -math.inf
        rows = np.array(rows, dtype=np.int64)
        lp, lo = log_prices(t.log_x[rows].copy(), t.log_z[rows].copy(), coeff,
                            log_w=t.log_weights(rows))[:2]
        return float(max(lp.max(), lo.max()))

    def candidates(self, t: RequestTable, captures, costs, decode_shapes, coeff: PriceCoefficients,
                   log_scale: float, waiting: float) -> list:
        """Due anchor snapshots, drained and resident, ranked by the continuation index."""
        due = [(h, a) for h, a in self.requests.items() if a.due is not None and h not in captures
               and t.inflight[r := t.index[h]] == 0 and t.slot[r] != NO_SLOT]
        if not due or not self.snapshot_shapes:
            return []
        rows = np.array([t.index[h] for h, _ in due], dtype=np.int64)
        lp, lo = log_prices(t.log_x[rows].copy(), t.log_z[rows].copy(), coeff,
                            log_w=t.log_weights(rows))[:2]
        v, f = np.zeros(len(rows)), [None] * len(rows)
        for i, ((h, a), r) in enumerate(zip(due, rows.tolist())):
            cursor, end = int(t.prompt_done[r]), int(t.prompt_tokens[r])
            limit = a.cuts[0] if a.cuts else end
            kind = GraphKind.SCORED_PREFILL if t.score_prompt[r] else GraphKind.PREFILL
            best = None
            # The enabled work: the next chunk (to the next cut), or one decode step at the prompt end.
            for sh in (self.prefill_shapes[kind] if cursor < end else decode_shapes):
                work = min(limit - cursor, sh.token_capacity) if cursor < end else 0
                val = math.exp(lp[i] - log_scale) * work + (math.exp(lo[i] - log_scale) if cursor + work == end else 0.0)
                f_ms = costs(sh)[0]
                key = (f_ms is not None, val / f_ms if f_ms else val)
                if best is None or key > best:
                    best, v[i], f[i] = key, val, f_ms
        pool = LanePool(t.handle[rows], t.last_served_seq[rows], t.slot[rows], v)
        out, seen = [], set()
        for shape in sorted(self.snapshot_shapes, key=lambda s: s.batch_capacity):
            t_ms, state = costs(shape)
            ranking = np.array([continuation_index(v[i], t_ms, f[i]) for i in range(len(rows))])
            members = ranked_lanes(ranking, pool.lru, pool.slots)[: shape.batch_capacity]
            if tuple(members.tolist()) in seen:
                continue  # a smaller shape already serves this cohort
            seen.add(tuple(members.tolist()))
            c = AnchorCandidate(shape, members, np.zeros(len(members), dtype=np.int64),
                                float(ranking[members].sum()), 0.0, t_ms, state)
            c.table_rows, c.lane_values = rows, ranking
            c = finish_candidate(c, pool, waiting)
            c.lanes_of, c.anchor = _builder(t, self, c), True
            out.append(c)
        return out


def _builder(t: RequestTable, cuts: AnchorCuts, c: AnchorCandidate):
    def lanes() -> PlanLanes:
        rows, values = c.table_rows[c.members], c.lane_values[c.members]
        context = [cuts.requests[h].due for h in t.handle[rows].tolist()]  # the exact cut copied
        return state_lanes(t, rows, context, values)
    return lanes


def _clipper(states, cursors: list[int], inner):
    """clip(idx, works): each lane's work cut at its next planned cut, then by `inner` (a vision
    clip, which may stop earlier but never later)."""
    def clip(idx: np.ndarray, works: np.ndarray) -> np.ndarray:
        out = np.array(works, dtype=np.int64)
        for j, i in enumerate(np.asarray(idx).tolist()):
            a = states[i]
            if a is not None and a.cuts:
                k = bisect_right(a.cuts, cursors[i])
                if k < len(a.cuts):
                    out[j] = min(int(out[j]), a.cuts[k] - cursors[i])
        return out if inner is None else inner(idx, out)
    return clip


class AnchorKind(Prerequisite):
    """Anchor cuts as a prerequisite kind: no chunk passes a planned cut, a prompt at a due cut waits
    for its anchor snapshot, which competes by the continuation index (AnchorCuts above)."""

    name = "anchors"

    def __init__(self, cuts: AnchorCuts, captures: dict):
        self.cuts = cuts
        self.enabled = cuts.enabled
        self.captures = captures  # the state kind's terminal captures: those copy the request already

    @classmethod
    def build(cls, b) -> "AnchorKind":
        state = b.kinds["state"].ops
        return cls(AnchorCuts.of(b.catalog, b.shapes, state.enabled, b.config.checkpoint_extra_work_fraction),
                   state.captures)

    def admitted(self, handle, request, checked, estimate_ns) -> None:
        self.cuts.admitted(handle, request, estimate_ns)

    def forget(self, handle) -> None:
        self.cuts.forget(handle)

    def excluded(self) -> set:
        return {h for h, a in self.cuts.requests.items() if a.due is not None}  # a state copy in progress

    def pending(self) -> bool:
        return bool(self.cuts.requests)

    def hold_back(self, t: RequestTable, rows: np.ndarray) -> np.ndarray:
        if self.cuts.requests:  # prompts at a cut, or waiting for its anchor snapshot
            return rows[~self.cuts.not_ready(t, rows)]
        return rows

    def log_scale(self, t: RequestTable, coeff: PriceCoefficients) -> float:
        return self.cuts.log_scale(t, coeff) if self.cuts.requests else -math.inf

    def restrict(self, view, t: RequestTable) -> None:
        if self.cuts.requests:
            self.cuts.restrict(view, t)  # no chunk passes a planned cut

    def candidates(self, inputs, view, costs) -> list:
        return self.cuts.candidates(inputs.t, self.captures, costs, inputs.shapes.decode_steps, inputs.coeff,
                                    view.log_scale, view.waiting)

    def completed(self, done, out: list) -> list:
        if self.cuts.requests:
            lookup = cost_lookup(done.costs, done.now_ns)
            self.cuts.completed(done.t, done.plan, lambda sh: lookup(sh)[1])
        return out

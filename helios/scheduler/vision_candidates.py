"""Candidates for vision windows: VISION graphs and the private boundary SNAPSHOT and RESTORE.

All three are prerequisites: they earn nothing themselves and compete by value per time through
the same cohort rule and tie-breaks as every candidate (policy.finish_candidate), with no priority
override. A lane's V is the scaled service of the first prefill chunk its window operations
enable (the tokens that chunk can legally take once the window is populated, plus the first output
token when it ends the prompt), taken at the one-row prefill with the best V/F (measured first);
F is that chunk's duration plus the remaining image operations of the chain: a boundary snapshot's
F adds the restore and the vision graph, a restore's the vision graph. The cohort ranks lanes by
the continuation index V*T/(T+F) (prerequisites.continuation_index); unknown durations compare
optimistically by V. A VISION graph immediately enables inference, so with it and a following
prefill both measured, every (vision, prefill) pair is scored exactly (lookahead.two_stage, the
spec's T+F sequence, sharing the prefill with already-ready prompts); the plan keeps the vision
graph's own T. Capacity the sequence leaves unused in the vision graph advances further windows at
no extra physical cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.graphs import GraphKind
from helios.scheduler.cost import CostState
from helios.scheduler.lookahead import two_stage
from helios.scheduler.lanes import state_lanes
from helios.scheduler.plan import NO_SLOT, PlanLanes
from helios.scheduler.policy import Budget, LanePool, finish_candidate
from helios.scheduler.prerequisite import Prerequisite
from helios.scheduler.prerequisites import StateCandidate, continuation_index
from helios.scheduler.requests import PREFILL, RequestTable
from helios.scheduler.service import PriceCoefficients, log_prices
from helios.scheduler.utility import ranked_lanes
from helios.scheduler.vision import VisionWindows

_VISION, _SNAPSHOT, _RESTORE = GraphKind.VISION, GraphKind.SNAPSHOT, GraphKind.RESTORE


@dataclass(slots=True)
class WindowCandidate(StateCandidate):
    """A window operation (a vision graph, or a private snapshot or restore at a boundary)."""


def _due(vw: VisionWindows, t: RequestTable, restoring) -> dict:
    """Rows waiting for each window operation (a request's work drains before its snapshot)."""
    due = {_VISION: [], _SNAPSHOT: [], _RESTORE: []}
    for h, ws in vw.requests.items():
        row = t.index.get(h)
        if row is None or t.phase[row] != PREFILL or ws.busy or h in restoring:
            continue  # a checkpoint restore binds the slot first (checkpoints.py)
        if ws.restore_due:
            due[_RESTORE].append(row)
        elif not ws.populated:
            due[_VISION].append(row)
        elif t.queued_prompt[row] == 0 and t.inflight[row] == 0 and ws.snapshot_due(int(t.prompt_done[row])):
            due[_SNAPSHOT].append(row)
    return {k: np.array(v, dtype=np.int64) for k, v in due.items() if v}


def window_log_scale(vw: VisionWindows, t: RequestTable, coeff: PriceCoefficients) -> float:
    """The largest log price of the image requests (-inf without any): window lanes are priced
    outside the view's pools and must share its scale."""
    rows = np.array([r for h in vw.requests if (r := t.index.get(h)) is not None], dtype=np.int64)
    if not len(rows):
        return -math.inf
    lp, lo = log_prices(t.log_x[rows].copy(), t.log_z[rows].copy(), coeff,
                        log_w=t.log_weights(rows))[:2]
    return float(max(lp.max(), lo.max()))


def _following(vw, t, rows, kind, shapes_of, costs, lp, lo, log_scale):
    """Per lane: V and F of the best first chunk after its window operations, and the work each
    prefill chunk capacity could take then (for the exact pairs)."""
    v, f, works = np.zeros(len(rows)), [None] * len(rows), {}
    for i, r in enumerate(rows.tolist()):
        ws = vw.requests[int(t.handle[r])]
        cursor = int(t.prompt_done[r] + t.queued_prompt[r])
        active = ws.active if kind is _VISION else ws.active + 1
        left = int(t.prompt_tokens[r]) - cursor
        best = None
        for sh in shapes_of(r):
            work = ws.legal_end(cursor, cursor + min(left, sh.token_capacity), active, True) - cursor
            val = math.exp(lp[i] - log_scale) * work + (math.exp(lo[i] - log_scale) if work == left else 0.0)
            works[(i, sh.token_capacity)] = (work, val)
            f_ms = costs(sh)[0]
            key = (f_ms is not None, val / f_ms if f_ms else val)
            if best is None or key > best:
                best, v[i], f[i] = key, val, f_ms
    return v, f, works


def _chain_ms(costs, kind, vw) -> float | None:
    """The remaining image operations after `kind`'s own graph (smallest prepared batches)."""
    parts = {_VISION: (), _RESTORE: (vw.shapes,), _SNAPSHOT: (vw.restore_shapes, vw.shapes)}[kind]
    total = 0.0
    for shapes in parts:
        ms = costs(min(shapes, key=lambda s: s.batch_capacity))[0]
        if ms is None:
            return None
        total += ms
    return total


def window_candidates(vw: VisionWindows, t: RequestTable, restoring, costs, shapes_of, coeff: PriceCoefficients,
                      log_scale: float, waiting: float, budget: Budget, pages_of, ready_pools) -> list:
    """Every vision, boundary-snapshot and window-restore shape with its best cohort.
    `shapes_of(row)`: the prefill shapes that row's prompt uses; `ready_pools`: the view's prefill
    pools by kind (already-ready prompts that may share the following chunk)."""
    out = []
    for kind, rows in _due(vw, t, restoring).items():
        lp, lo = log_prices(t.log_x[rows].copy(), t.log_z[rows].copy(), coeff,
                            log_w=t.log_weights(rows))[:2]
        v, f, works = _following(vw, t, rows, kind, shapes_of, costs, lp, lo, log_scale)
        chain = _chain_ms(costs, kind, vw)
        f = [None if x is None or chain is None else x + chain for x in f]
        pool = LanePool(t.handle[rows], t.last_served_seq[rows], t.slot[rows], v,
                        resident=t.slot[rows] != NO_SLOT, pages=pages_of(rows))
        shapes = vw.shapes if kind is _VISION else vw.snapshot_shapes if kind is _SNAPSHOT else vw.restore_shapes
        seen = set()
        for shape in sorted(shapes, key=lambda s: s.batch_capacity):
            t_ms, state = costs(shape)
            ranking = np.array([continuation_index(v[i], t_ms, f[i]) for i in range(len(rows))])
            order = ranked_lanes(ranking, pool.lru, pool.slots)
            members = _feasible(vw, t, rows, order, pool, shape.batch_capacity, budget, kind)
            key = tuple(members.tolist())
            if not len(members) or key in seen:
                continue  # nothing fits, or a smaller shape already serves this cohort (padding)
            seen.add(key)
            c = WindowCandidate(shape, members, np.zeros(len(members), dtype=np.int64),
                                float(ranking[members].sum()), 0.0, t_ms, state)
            c.table_rows, c.lane_values = rows, ranking
            c = finish_candidate(c, pool, waiting)
            if kind is _VISION:
                _exact_pairs(c, pool, costs, shapes_of, rows, works, ready_pools, waiting)
            c.lanes_of, c.private_state = _builder(vw, t, kind, c), kind is not _VISION
            out.append(c)
    return out


def _feasible(vw, t, rows, order, pool, cap: int, budget: Budget, kind) -> np.ndarray:
    """Best-first lanes within the capacity, the free slots and pages (non-resident lanes), and
    the free private snapshot rows (a multi-window request's first vision graph reserves one)."""
    chosen, slots, pages, private = [], budget.free_slots, budget.free_pages, vw.rows_free
    for i in order.tolist():
        if len(chosen) == cap:
            break
        if kind is _VISION:
            ws = vw.requests[int(t.handle[rows[i]])]
            if ws.needs_row:
                if private == 0:
                    continue
                private -= 1
            if not pool.resident[i]:
                if slots == 0 or int(pool.pages[i]) > pages:
                    continue
                slots, pages = slots - 1, pages - int(pool.pages[i])
        chosen.append(i)
    return np.asarray(chosen, dtype=np.int64)


def _exact_pairs(c, pool, costs, shapes_of, rows, works, ready_pools, waiting) -> None:
    """Replace a measured vision candidate's score by the best exact (vision, prefill) sequence."""
    if c.t_ms is None or c.cost_state is CostState.UNKNOWN:
        return
    best, best_newly = None, None
    following = {s for i in c.members.tolist() for s in shapes_of(rows[i])}
    served = pool.handles[c.members]
    for sh in sorted(following, key=lambda s: (s.kind.value, s.capacities())):
        f_ms, state = costs(sh)
        if f_ms is None or state is CostState.UNKNOWN:
            continue
        ready_pool = ready_pools.get(sh.kind, (None,))[0]
        # A lane whose prompt uses the other prefill kind adds nothing to this following graph.
        newly = np.array([works[(i, sh.token_capacity)][1] if sh in shapes_of(rows[i]) else 0.0
                          for i in c.members.tolist()])
        ready = _ready_values(ready_pool, sh.token_capacity, served)
        choice = two_stage(newly, ready, (), len(c.members), sh.batch_capacity, c.t_ms, f_ms, waiting)
        if choice is not None and choice.sequence and (best is None or choice.score > best.score):
            best, best_newly = choice, newly
    if best is None:
        return
    # The k lanes the following chunk serves first; the vision graph's spare rows advance the rest.
    ranked = c.members[ranked_lanes(best_newly, pool.lru[c.members], pool.slots[c.members])]
    c.members = ranked
    c.value, c.score = best.value, best.score  # ranked over T + F; the plan keeps the vision T
    c.key = (c.t_ms is None, c.score) + c.key[2:]


def _ready_values(pool: LanePool | None, chunk: int, served: np.ndarray) -> np.ndarray:
    """Already-ready prompts' chunk values (a vision lane's own text chunk is not counted twice)."""
    if pool is None or not len(pool.handles):
        return np.zeros(0)
    works = np.minimum(pool.prompt_left, chunk)
    if pool.clip is not None:
        works = pool.clip(np.arange(len(works)), works)
    values = np.exp(pool.log_prefill) * works + np.where(works == pool.prompt_left, pool.first_token, 0.0)
    return values[~np.isin(pool.handles, served)]


def _builder(vw: VisionWindows, t: RequestTable, kind, c: WindowCandidate):
    def lanes() -> PlanLanes:
        rows, values = c.table_rows[c.members], c.lane_values[c.members]
        if kind is _VISION:  # the window's feature rows, written from offset zero
            context = [vw.requests[h].windows[vw.requests[h].active].features for h in t.handle[rows].tolist()]
        else:  # the exact consumed state the private row holds
            context = t.prompt_done[rows]
        return state_lanes(t, rows, context, values)
    return lanes


class VisionKind(Prerequisite):
    """Vision windows as a prerequisite kind: a prompt waits for its window's vision graph and, at a
    window boundary, for a private snapshot and restore (vision.py); no chunk splits an image."""

    name = "vision"

    def __init__(self, windows: VisionWindows, restoring: dict):
        self.windows = windows
        self.enabled = windows.enabled
        self.restoring = restoring  # the state kind's pending restores: those bind the slot first

    @classmethod
    def build(cls, b) -> "VisionKind":
        return cls(VisionWindows(b.catalog, b.config, b.planned), b.kinds["state"].ops.restoring)

    def check(self, request, max_chunk) -> tuple:
        return self.windows.check(request, max_chunk()) if request.images else ()

    def admitted(self, handle, request, checked, estimate_ns) -> None:
        if checked:
            self.windows.admitted(handle, request, checked)

    def retired(self, handle) -> None:
        if self.windows.requests:
            self.windows.retired(handle)  # its private snapshot row, if it still holds one

    def excluded(self) -> set:
        return set(self.windows.requests)

    def pending(self) -> bool:
        return bool(self.windows.requests)

    def hold_back(self, t: RequestTable, rows: np.ndarray) -> np.ndarray:
        if self.windows.requests:  # prompts waiting for a window operation
            return rows[~self.windows.not_ready(t, rows)]
        return rows

    def log_scale(self, t: RequestTable, coeff: PriceCoefficients) -> float:
        return window_log_scale(self.windows, t, coeff) if self.windows.requests else -math.inf

    def restrict(self, view, t: RequestTable) -> None:
        if self.windows.requests:
            self.windows.restrict(view, t)  # legal chunk ends of image requests

    def candidates(self, inputs, view, costs) -> list:
        if not self.windows.requests:
            return []
        t, res, shapes = inputs.t, inputs.resources, inputs.shapes
        shapes_of = lambda row: shapes.prefill_of(  # noqa: E731
            GraphKind.SCORED_PREFILL if t.score_prompt[row] else GraphKind.PREFILL)
        return window_candidates(self.windows, t, self.restoring, costs, shapes_of, inputs.coeff, view.log_scale,
                                 view.waiting, Budget(res.free_slots, res.free_pages),
                                 lambda rows: res.extent_pages_of(t, rows), view.prefill)

    def check_commit(self, plan) -> bool:
        if not (self.windows.requests and self.windows.is_window_plan(plan)):
            return False
        self.windows.check_commit(plan)  # private snapshot rows
        return True

    def committed(self, plan) -> None:
        self.windows.committed(plan)

    def may_retire(self) -> bool:
        return bool(self.windows.requests)

    def completed(self, done, out: list) -> list:
        if self.windows.requests and self.windows.is_window_plan(done.plan):
            self.windows.completed(done.plan, done.t)
        return out

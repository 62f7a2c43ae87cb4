"""Candidates for state operations: restores (prerequisites) and terminal snapshots.

Both compete with inference through the same value-per-time score, cohort rule (a prefix of
lanes ranked by additive value) and tie-breaks (policy.finish_candidate), with no priority
override. Unknown durations follow the discovery rules: the candidate ranks optimistically by
its value, and no duration or reference interval is invented.

Restore: a lane's contribution is the spec's continuation index V*T/(T+F). V is the scaled
service of the prefill chunk the restore enables (prompt tokens at 1 + f/x, plus the first
output token when the chunk finishes the prompt), F that chunk's duration, T the restore's.
The prefill shape taken for (V, F) is the one-row prefill with the best V/F (measured shapes
first); an unknown F compares optimistically (contribution V).

Snapshot (terminal): terminal_value + terminal_age_price*sigma*(A + T) per lane, scaled by the
decision's shared factor; the T-dependent part enters as the candidate's age slope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.graphs import GraphKind
from helios.scheduler.checkpoints import StateOperations
from helios.scheduler.cost import CostState
from helios.scheduler.lookahead import two_stage
from helios.scheduler.mixed import prompt_fill
from helios.scheduler.plan import NO_SLOT
from helios.scheduler.policy import Budget, Candidate, LanePool, finish_candidate
from helios.scheduler.prerequisite import Prerequisite
from helios.scheduler.requests import RequestTable
from helios.scheduler.service import PriceCoefficients, log_prices
from helios.scheduler.utility import prefix_sums, ranked_lanes, reference_interval_ms


@dataclass(slots=True)
class StateCandidate(Candidate):
    """A prerequisite candidate (every kind's, prerequisite_kinds.py): also names its lanes' table
    rows and scaled lane values, builds its plan's lanes, and says how its plan is marked."""

    table_rows: np.ndarray | None = None  # table row of each pool entry
    lane_values: np.ndarray | None = None  # scaled value per pool entry, T-dependent part included
    lanes_of: object = None  # () -> PlanLanes of the members
    private_state: bool = False  # a window operation's private snapshot or restore (ScheduledPlan)
    anchor: bool = False  # a nonterminal anchor snapshot (ScheduledPlan)


def continuation_index(value: float, t_ms: float | None, f_ms: float | None) -> float:
    """V*T/(T+F): a prerequisite lane's cohort-ranking contribution. Unknown durations compare
    optimistically by useful value."""
    if t_ms is None or f_ms is None:
        return value
    return value * t_ms / (t_ms + f_ms)


def terminal_waiting(ops: StateOperations, log_scale: float) -> float:
    """Scaled sum of terminal age coefficients: added to every candidate's common waiting cost."""
    return ops.policy.terminal_age_price * math.exp(-log_scale) * len(ops.captures)


def restore_log_scale(ops: StateOperations, t: RequestTable, coeff: PriceCoefficients) -> float:
    """The largest log price among pending restores (-inf without any): restore lanes are priced
    outside the planning view's pools, and must share its scale so that no value overflows."""
    if not ops.restoring:
        return -math.inf
    rows = np.array([t.index[h] for h in ops.restoring], dtype=np.int64)
    lp, lo = log_prices(t.log_x[rows].copy(), t.log_z[rows].copy(), coeff,
                        log_w=t.log_weights(rows))[:2]
    return float(max(lp.max(), lo.max()))


def _pool(t: RequestTable, rows: np.ndarray, base: np.ndarray) -> LanePool:
    return LanePool(t.handle[rows], t.last_served_seq[rows], t.slot[rows], base)


def _cohorts(shapes, costs, table_rows: np.ndarray, pool: LanePool, values: np.ndarray, slope_per_lane, waiting: float,
             value_of=None, pages=None, budget: Budget | None = None) -> list[Candidate]:
    """Every batch capacity with the top-B lanes of `values` (state copies have no padding
    work). With `pages` and `budget`, a cohort stops at the slots and pages still free."""
    order = ranked_lanes(values, pool.lru, pool.slots)
    sums = prefix_sums(values[order])
    limit = len(order)
    if budget is not None:
        fits = np.cumsum(pages[order]) <= budget.free_pages
        limit = min(budget.free_slots, int(np.argmin(fits)) if not fits.all() else len(order))
    out = []
    for shape in sorted(shapes, key=lambda s: s.batch_capacity):
        m = min(shape.batch_capacity, limit)
        if m == 0:
            continue
        t_ms, state = costs(shape)
        value = float(sums[m]) if value_of is None else value_of(order[:m], t_ms)
        c = StateCandidate(shape, order[:m], np.zeros(m, dtype=np.int64), value, slope_per_lane * m, t_ms, state)
        c.table_rows = table_rows
        c.lane_values = values + slope_per_lane * (t_ms or 0.0)
        out.append(finish_candidate(c, pool, waiting))
    return out


def snapshot_candidates(ops: StateOperations, t: RequestTable, costs, log_scale: float, waiting: float,
                        now_ns: int) -> list[Candidate]:
    """Terminal captures not yet submitted."""
    handles = [h for h in ops.captures if t.inflight[t.index[h]] == 0]
    if not handles or not ops.snapshot_shapes:
        return []
    rows = np.array([t.index[h] for h in handles], dtype=np.int64)
    s = math.exp(-log_scale)
    measured = [(sh.batch_capacity, ms) for sh in ops.snapshot_shapes
                if (ms := costs(sh)[0]) is not None and costs(sh)[1] is not CostState.UNKNOWN]
    k = len(ops.captures)
    sigma = reference_interval_ms(measured, k, k)
    c_sigma = ops.policy.terminal_age_price * sigma * s if sigma is not None else 0.0
    ages = np.array([max(0, now_ns - ops.captures[h].since_ns) / 1e6 for h in handles])
    base = ops.policy.terminal_value * s + c_sigma * ages
    pool = _pool(t, rows, base)
    return _with_lanes(ops, t, _cohorts(ops.snapshot_shapes, costs, rows, pool, base, c_sigma, waiting))


def _with_lanes(ops: StateOperations, t: RequestTable, cands: list) -> list:
    for c in cands:
        c.lanes_of = _builder(ops, t, c)
    return cands


def _builder(ops: StateOperations, t: RequestTable, c: StateCandidate):
    def lanes():
        return ops.lanes(t, c.shape.kind, c.table_rows[c.members], c.lane_values[c.members])
    return lanes


def restore_candidates(ops: StateOperations, t: RequestTable, costs, prefill_shapes, decode_shapes,
                       coeff: PriceCoefficients, log_scale: float, waiting: float, budget: Budget,
                       pages_of, ready_pool: LanePool | None = None,
                       ready_decoders: LanePool | None = None, mixed_shapes=(), held_out=frozenset()) -> list[Candidate]:
    """Pending restores that can get a slot and their page extent now. With a measured restore
    and a measured following graph, the cohort and score are the exact two-stage choice over
    every (restore, prefill), (restore, decode) and (restore, width-one mixed) pair
    (lookahead.py): a restored prompt continues in a prefill chunk or a mixed graph's prompt row,
    a preempted decoder in a decode batch or a mixed graph's decode rows. `ready_pool` and
    `ready_decoders` are the prefill and decode lanes already ready to share that graph.
    Otherwise lanes rank by the continuation index. The restore's unused rows advance further
    pending restores at no extra physical cost. `held_out`: handles that client slot shares hold
    back (slot_share.py)."""
    # While automatic preemption holds a freed slot for a waiter (ops.held), preempted decoders
    # (no prompt left) do not restore: the slot would go straight back to one of them.
    handles = [h for h in ops.restoring if t.slot[r := t.index[h]] == NO_SLOT and t.inflight[r] == 0
               and not (ops.held and t.prompt_done[r] >= t.prompt_tokens[r]) and h not in held_out]
    if not handles or not ops.restore_shapes or budget.free_slots < 1:
        return []
    rows = np.array([t.index[h] for h in handles], dtype=np.int64)
    lp, lo = log_prices(t.log_x[rows].copy(), t.log_z[rows].copy(), coeff,
                        log_w=t.log_weights(rows))[:2]
    left = t.prompt_left(rows)
    # V and F per lane from the best one-row prefill (measured first, then by V/F).
    best_v, best_f = np.zeros(len(rows)), [None] * len(rows)
    for i in range(len(rows)):
        key_best = None
        # A preempted decoder resumes with one output token per decode; a prompt with a chunk.
        for sh in (prefill_shapes if left[i] > 0 else decode_shapes):
            work = min(int(left[i]), sh.token_capacity) if left[i] > 0 else 0
            v = math.exp(lp[i] - log_scale) * work + (math.exp(lo[i] - log_scale) if work == left[i] else 0.0)
            f_ms = costs(sh)[0]
            key = (f_ms is not None, v / f_ms if f_ms else v)
            if key_best is None or key > key_best:
                key_best, best_v[i], best_f[i] = key, v, f_ms
    pool = _pool(t, rows, best_v)

    def value_of(members, t_ms):
        return float(sum(continuation_index(best_v[j], t_ms, best_f[j]) for j in members.tolist()))

    ranking = np.array([continuation_index(best_v[j], costs(ops.restore_shapes[0])[0], best_f[j])
                        for j in range(len(rows))])
    # Each restored request takes a slot and its page extent: keep the cohort within the budget.
    cands = _cohorts(ops.restore_shapes, costs, rows, pool, ranking, 0.0, waiting, value_of, pages_of(rows), budget)
    for c in cands:
        _exact_pair(c, pool, costs, prefill_shapes, decode_shapes, lp - log_scale, lo - log_scale, left,
                    ready_pool, ready_decoders, waiting, mixed_shapes)
    return _with_lanes(ops, t, cands)


def _chunk_values(log_prefill, log_first, left, chunk: int) -> np.ndarray:
    """Scaled service of one prefill chunk per lane (prompt tokens, plus the first output token
    when the chunk finishes the prompt); zero for a lane with no prompt left."""
    work = np.minimum(left, chunk)
    return np.where(left > 0, np.exp(log_prefill) * work + np.where(work == left, np.exp(log_first), 0.0), 0.0)


_UNBOUNDED = Budget(1 << 30, 1 << 62)  # the lookahead's ready prompts: slots and pages not bounded


def _exact_pair(c: StateCandidate, pool: LanePool, costs, prefill_shapes, decode_shapes, log_prefill, log_first,
                left, ready_pool: LanePool | None, ready_decoders: LanePool | None, waiting: float,
                mixed_shapes=()) -> None:
    """Replace a restore candidate's continuation-index score by the best exact two-stage
    sequence over every measured following prefill, decode and mixed shape. The plan keeps the
    restore's T."""
    if c.t_ms is None or c.cost_state is CostState.UNKNOWN:
        return
    cap = len(c.members)
    best, best_order, best_newly = None, None, 0

    def consider(shape, newly, ready_of, order_of, fixed=None, fixed_newly=False, fixed_rows=1) -> None:
        """Keep the (restore, `shape`) sequence when it beats the best so far. `ready_of(F)`: the
        already-ready lanes' contributions; `order_of()` ranks the pool's lanes for that graph
        (a newly ready prompt row first); `fixed`: a mixed graph's prompt rows, `fixed_rows` of
        them (lookahead.two_stage)."""
        nonlocal best, best_order, best_newly
        f_ms, state = costs(shape)
        if f_ms is None or state is CostState.UNKNOWN:
            return
        choice = two_stage(newly, ready_of(f_ms), (), cap, shape.batch_capacity, c.t_ms, f_ms, waiting,
                           fixed, fixed_newly, fixed_rows)
        if choice is not None and choice.sequence and (best is None or choice.score > best.score):
            best, best_order = choice, order_of()
            best_newly = choice.newly + (fixed is not None and fixed_newly)  # restored rows it serves

    def ready_prompts(chunk: int) -> np.ndarray:  # already-ready prompts' chunk values
        if ready_pool is None or not len(ready_pool.handles):
            return np.zeros(0)
        return np.exp(ready_pool.log_prefill) * np.minimum(ready_pool.prompt_left, chunk) + np.where(
            ready_pool.prompt_left <= chunk, ready_pool.first_token, 0.0)

    def ready_fill(budget: int, rows: int) -> tuple[float, int]:
        """(value, rows) of the already-ready prompts a mixed graph's prompt fill packs into
        `budget` tokens with at most `rows` rows (mixed.prompt_fill; slots and pages, as for the
        one ready row above, are not bounded here)."""
        if ready_pool is None or not len(ready_pool.handles) or budget <= 0 or rows <= 0:
            return 0.0, 0
        fill = prompt_fill(ready_pool, budget, _UNBOUNDED, np.exp(ready_pool.log_prefill), rows)
        return float(sum(value for _, _, value in fill)), len(fill)

    for sh in prefill_shapes:
        newly, ready = _chunk_values(log_prefill, log_first, left, sh.token_capacity), ready_prompts(sh.token_capacity)
        consider(sh, newly, lambda _, ready=ready: ready, lambda newly=newly: ranked_lanes(newly, pool.lru, pool.slots))
    # A preempted decoder (no prompt left) continues with one output token in a decode batch
    # shared with the decoders already running; a restored prompt cannot join that graph.
    resumed = (left == 0).nonzero()[0]
    resumed_values = np.exp(log_first[resumed])  # one output token each
    order = lambda: resumed[ranked_lanes(resumed_values, pool.lru[resumed], pool.slots[resumed])]  # noqa: E731
    running = ready_decoders is not None and len(ready_decoders.handles)

    def ready_of(f_ms):  # a running decoder served at the sequence's end: value and age credit over T + F
        return ready_decoders.base + ready_decoders.age_slope * (c.t_ms + f_ms) if running else np.zeros(0)
    if len(resumed):
        for sh in decode_shapes:
            consider(sh, resumed_values, ready_of, order)
    for sh in mixed_shapes:
        # Spec, "Mixed execution contract": the prompt row is absent, already ready, or enabled by
        # the restore; each leaves an exact two-stage problem for the decode rows.
        # With several prompt rows (docs/packed-prompt-rows.md) the prompt is the packed fill: the
        # ready prompts', or the restored prompt's chunk and the ready prompts in what it leaves.
        consider(sh, resumed_values, ready_of, order)  # absent: decode rows only
        c_sh, rows = sh.prefill_capacity, sh.prompt_rows
        ready = ready_prompts(c_sh)
        if len(ready):
            if rows == 1:
                consider(sh, resumed_values, ready_of, order, float(ready.max()))
            else:
                value, k = ready_fill(c_sh, rows)
                consider(sh, resumed_values, ready_of, order, value, fixed_rows=k)
        chunk = _chunk_values(log_prefill, log_first, left, c_sh)
        if chunk.max(initial=0.0) > 0.0:
            first = int(ranked_lanes(chunk, pool.lru, pool.slots)[0])
            value, k = ready_fill(c_sh - min(int(left[first]), c_sh), rows - 1)
            consider(sh, resumed_values, ready_of, lambda first=first: np.concatenate([[first], order()]),
                     float(chunk[first]) + value, True, 1 + k)
    if best is None:
        return
    served = best_order[:best_newly]
    # The restore's unused rows advance further pending restores at no extra physical cost
    # (spec: "equal value rates prefer advancing more requests").
    chosen = set(served.tolist())
    rest = [i for i in c.members.tolist() if i not in chosen][: max(0, cap - len(served))]
    c.members = np.concatenate([served, np.asarray(rest, dtype=served.dtype)]) if rest else served
    c.works = np.zeros(len(c.members), dtype=np.int64)
    c.value = best.value
    c.score = best.score  # ranks by T + F; the plan's estimated duration stays the restore's T
    c.key = (c.t_ms is None, c.score) + c.key[2:]


class StateKind(Prerequisite):
    """State operations as a prerequisite kind: pending restores (cached prefixes, preempted
    decoders) hold their requests back until restored, terminal captures and preemptions until
    their snapshot; both compete as candidates (above); completion resolves them (checkpoints.py)."""

    name = "state"
    edits_output = True  # a terminal capture holds its request's finish until its snapshot

    def __init__(self, ops: StateOperations):
        self.ops = ops
        self.enabled = ops.enabled

    @classmethod
    def build(cls, b) -> "StateKind":
        return cls(StateOperations(b.catalog, b.policy, b.planned, b.config.checkpoint_extra_work_fraction))

    def admitted(self, handle, request, checked, estimate_ns) -> None:
        self.ops.admitted(handle, request)

    def forget(self, handle) -> None:
        self.ops.forget(handle)

    def holds(self, handle) -> bool:
        return self.ops.holds(handle)

    def pending(self) -> bool:
        return bool(self.ops.captures or self.ops.restoring)

    def hold_back(self, t: RequestTable, rows: np.ndarray) -> np.ndarray:
        if self.ops.restoring or self.ops.captures:  # restores not completed, preemptions
            return rows[~self.ops.not_ready(t, rows)]
        return rows

    def log_scale(self, t: RequestTable, coeff: PriceCoefficients) -> float:
        return restore_log_scale(self.ops, t, coeff)

    def waiting(self, log_scale: float) -> float:
        return terminal_waiting(self.ops, log_scale) if self.ops.captures else 0.0

    def snapshot_candidates(self, inputs, view, costs) -> list:
        return snapshot_candidates(self.ops, inputs.t, costs, view.log_scale, view.waiting, inputs.start_ns)

    def restore_candidates(self, inputs, view, costs) -> list:
        t, res, shapes = inputs.t, inputs.resources, inputs.shapes
        return restore_candidates(self.ops, t, costs, shapes.prefill, shapes.decode_steps, inputs.coeff,
                                  view.log_scale, view.waiting, Budget(res.free_slots, res.free_pages),
                                  lambda rows: res.extent_pages_of(t, rows),
                                  view.prefill.get(GraphKind.PREFILL, (None,))[0], view.decode,
                                  tuple(s for s in shapes.mixed if s.token_capacity == 1), view.held_out)

    def may_retire(self) -> bool:
        return True  # a completed snapshot retires its capture's row

    def earn(self, done, out: list) -> list:
        """The capture allowance that productive decode earns (before any capture resolves)."""
        sample = done.timing.cost_sample_ns()
        self.ops.earn(done.plan.shape.kind, [g.handle for g in out if g.tokens], None if sample is None else sample / 1e6)
        return out

    def completed(self, done, out: list) -> list:
        snap = [ns for sh in self.ops.snapshot_shapes if (ns := done.costs.estimate_ns(sh)) is not None]
        return self.ops.completed(done.t, done.plan.shape.kind, done.plan.handles, done.fence, done.now_ns, out,
                                  done.release, min(snap) / 1e6 if snap else None)

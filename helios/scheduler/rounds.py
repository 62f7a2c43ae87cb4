"""Speculative round candidates: host and device allocation of target rows.

A speculative program (B, D, W, P) serves up to B lanes. Lane i's ceiling is
min(D + 1, W, request limit) rows including its pending token. With host allocation the lane
keeps its complete prefix (shortened only by request limits) and the cohort must fit B and P.
With device allocation the GPU admits, row by row, the best immediate causal frontier by joint
prefix probability (ties: shorter prefix, then original slot) until P rows are used; the host
prices each cohort with the allocation it predicts from its confidence forecasts.
"""

from __future__ import annotations

import numpy as np

from helios.scheduler.cost import CostState
from helios.scheduler.memo import Memo
from helios.scheduler.policy import Candidate, LanePool, defers, finish_candidate
from helios.scheduler.utility import ranked_lanes, rate_score, stall_growth


def device_allocate(joint: list, ceilings, slots, budget: int) -> list[int]:
    """The device's frontier allocation, exactly: rows per lane (each lane at least one)."""
    rows = [1] * len(ceilings)
    left = budget - len(rows)
    if left <= 0:
        return rows
    # Lane i offers positions 1..min(ceiling - 1, len(joint_i)).
    offered = [max(0, min(int(c) - 1, len(j))) for c, j in zip(ceilings, joint)]
    lane = np.repeat(np.arange(len(rows)), offered)
    prob = np.concatenate([np.asarray(j[:k], dtype=float) for j, k in zip(joint, offered)] or [np.zeros(0)])
    same = lane[1:] == lane[:-1]
    if not np.any(prob[1:][same] > prob[:-1][same]):
        # Joint prefix probabilities that never rise along a lane (the usual case: products of
        # probabilities): each lane's next position sorts after the one before it, so the greedy
        # frontier admits exactly the first `left` positions of the global order.
        d = np.arange(len(lane)) - np.repeat(np.cumsum(offered) - offered, offered) + 1
        order = np.lexsort((np.asarray(slots)[lane], d, -prob))[:left]
        return (1 + np.bincount(lane[order], minlength=len(rows))).tolist()
    while left > 0:
        best = None
        for i, c in enumerate(ceilings):
            d = rows[i]  # next draft position (1-based) on this lane's frontier
            if d >= c or d > len(joint[i]):
                continue
            key = (-float(joint[i][d - 1]), d, slots[i])
            if best is None or key < best[0]:
                best = (key, i)
        if best is None:
            break
        rows[best[1]] += 1
        left -= 1
    return rows


def _ceilings(pool: LanePool, shape) -> np.ndarray:
    return np.minimum(np.minimum(shape.proposal_depth + 1, shape.token_capacity), pool.limit)


def _gains(pool: LanePool, ceilings: np.ndarray) -> np.ndarray:
    # Value of the d-th accepted draft: the output price times s_d^alpha, within the ceiling.
    depth = pool.survival_alpha.shape[1]
    allowed = np.arange(depth)[None, :] < (ceilings - 1)[:, None]
    return np.where(allowed, pool.extra_value[:, None] * pool.survival_alpha, 0.0)


def _host_cohort(order, rows, batch, budget):
    chosen, used = [], 0
    for i in order:
        if len(chosen) == batch:
            break
        if used + rows[i] <= budget:
            chosen.append(i)
            used += rows[i]
    return np.asarray(chosen, dtype=np.int64)


def _frontier(pool, gains, ceilings):
    """Every lane's draft positions in the device's admission order (joint prefix probability,
    then shorter prefix, then original slot): (lane, gain) per entry. The order does not depend
    on the cohort ranking, so a group's shapes and rankings share one sort."""
    depth = gains.shape[1]
    allowed = np.arange(depth)[None, :] < (ceilings - 1)[:, None]
    lane, d = np.nonzero(allowed)
    entries = np.lexsort((pool.slots[lane], d, -pool.forecast[lane, d]))
    lane, d = lane[entries], d[entries]
    return lane, gains[lane, d]


def _device_best_prefix(ranking, pool, frontier, batch, budget):
    """Every cohort prefix of `ranking`, each priced with its predicted causal allocation."""
    k = min(batch, budget, len(ranking))
    lanes = ranking[:k]
    position = np.empty(len(ranking), dtype=np.int64)
    position[ranking] = np.arange(len(ranking))
    lane_pos = position[frontier[0]]
    inside = lane_pos < k
    lane_pos, g = lane_pos[inside], frontier[1][inside]
    # Prefix m admits the first budget - m frontier entries of its own lanes (each lane's pending
    # token takes one row): rank counts, per prefix, the entries of its lanes up to each entry.
    m = np.arange(1, k + 1)
    member = lane_pos[None, :] < m[:, None]
    rank = np.cumsum(member, axis=1, dtype=np.int32)
    selected = member & (rank <= (budget - m)[:, None])
    values = np.cumsum(pool.base[lanes]) + selected @ g
    return lanes, m, values, selected, lane_pos


def speculative_candidates(shapes, costs, pool: LanePool, waiting: float, device: bool,
                           prune: bool = False, keep_stale: bool = True,
                           memo: Memo | None = None) -> list[Candidate]:
    """Every program's best cohorts (see the module docstring), scored. `prune`: leave out the
    programs whose score provably cannot reach another candidate's (the ordinary choice reads
    only the best; the list keeps the unpruned list's best, tests/scheduler/test_speculative_pruning.py);
    `keep_stale`: except those with a stale estimate, which a funded timing refresh may still
    choose whatever their score. `memo`: the scheduler's Memo (policy.finish_candidate)."""
    n = len(pool.handles)
    if n == 0:
        return []
    # A bucket above the smallest one that holds every lane serves the same cohort with more
    # padding, so dominance pruning would discard it anyway: skip it before any arithmetic.
    fits_all = min((s.batch_capacity for s in shapes if s.batch_capacity >= n), default=None)
    groups: dict[tuple[int, int], list] = {}
    for shape in shapes:
        if fits_all is None or shape.batch_capacity <= fits_all:
            groups.setdefault((shape.proposal_depth, shape.token_capacity), []).append(shape)
    # Each group's lane terms (ceilings, gains and the value ranking depend on D and W only), and
    # its programs in capacity order: the candidates' order, whatever order they are built in.
    d = pool.deferred
    steps = (None if d is None or not prune
             else np.array([np.nan if (t := d.step(x)) is None else t for x in range(d.count + 1)]))
    programs = []
    for key, group in groups.items():
        g = _Group(pool, group[0], steps)
        programs += [(shape, g, min(shape.batch_capacity, n)) for shape in sorted(group, key=lambda s: s.capacities())]
    out, pruned = [], []  # (rank, candidate); (rank, shape, group, m, t_ms, state, score bound)
    best_known = -np.inf  # the best score among built candidates with a known duration
    # Larger cohorts and shallower programs first: usually the incumbents, and the cheapest to build.
    for r in sorted(range(len(programs)), key=lambda r: (-programs[r][2], programs[r][0].proposal_depth)):
        shape, g, m = programs[r]
        t_ms, state = costs(shape)
        # A round of every lane within its ceilings is as cheap to build as to bound: bound only the others.
        if (prune and t_ms is not None and (state is CostState.FRESH or not keep_stale)
                and (m < n or g.constrained(m, shape.target_capacity))):
            bound = g.bound(pool, shape, m, t_ms, waiting)
            if bound < best_known:
                pruned.append((r, shape, g, m, t_ms, state, bound))
                continue
        for c in g.candidates(pool, shape, m, t_ms, state, waiting, device, memo):
            out.append((r, c))
            if t_ms is not None and c.score > best_known:
                best_known = c.score
    while True:
        # A program left out may hold a kept candidate's cohort on fewer capacities, which makes
        # that candidate padding: build the programs that could, so the padding rule sees them.
        kept = _unpadded(out)
        fewest: dict[int, int] = {}  # per depth, the fewest lanes a kept candidate serves
        for c in kept:
            fewest[c.dedupe[2]] = min(fewest.get(c.dedupe[2], n), len(c.members))
        build = [p for p in pruned if p[3] >= fewest.get(p[1].proposal_depth, n + 1)
                 and any(_may_pad(p, c) for c in kept)]
        if not build:
            # The bounds were taken against candidates that padding may have removed since: build
            # what no longer falls below the best candidate kept.
            top = max((c.score for c in kept if c.t_ms is not None), default=-np.inf)
            build = [p for p in pruned if p[6] >= top]
            if not build:
                return kept
        for p in build:
            pruned.remove(p)
            r, shape, g, m, t_ms, state, _ = p
            out += [(r, c) for c in g.candidates(pool, shape, m, t_ms, state, waiting, device, memo)]


def _may_pad(program, c) -> bool:
    """Whether a left-out program could hold candidate c's cohort on fewer capacities."""
    _, shape, _, m, _, _, _ = program
    return (len(c.members) <= m and c.dedupe[2] == shape.proposal_depth and shape.dominates(c.shape)
            and int(c.rows.sum()) <= shape.target_capacity)


def _unpadded(out: list) -> list[Candidate]:
    """The candidates in program order, less padding: the same cohort, prefixes and depth on a
    program with every capacity at least as large as another's (the spec discards it)."""
    out.sort(key=lambda rc: rc[0])
    by_key: dict[tuple, list] = {}
    for _, c in out:
        by_key.setdefault(c.dedupe, []).append(c.shape)
    return [c for _, c in out if not any(other.dominates(c.shape) for other in by_key[c.dedupe])]


class _Group:
    """A (D, W) group's lane terms, shared by its programs."""

    def __init__(self, pool: LanePool, shape, steps: np.ndarray | None):
        self.steps = steps  # Deferred.step(left) for left = 0..count, NaN for None
        self.ceilings = _ceilings(pool, shape)
        self.gains = _gains(pool, self.ceilings)
        self.drafts = self.gains.sum(axis=1)
        self.full = pool.base + self.drafts
        self.plain = ranked_lanes(self.full, pool.lru, pool.slots)
        self._frontier = self._tops = self._costliest = None

    def constrained(self, m: int, budget: int) -> bool:
        """Whether some m lanes' ceilings exceed the row budget P (else every m-lane round fits)."""
        if self._costliest is None:  # the m most expensive ceilings
            self._costliest = [0, *np.cumsum(np.sort(self.ceilings)[::-1]).tolist()]
        return self._costliest[m] > budget

    def bound(self, pool: LanePool, shape, m: int, t_ms: float, waiting: float) -> float:
        """An upper bound on the score of any round `shape` can build from m lanes at duration T,
        just above what a candidate's computed score can reach (relative margin 1e-9 for the sums'
        rounding). A round that fits its members' ceilings serves exactly m lanes: the top m full
        values, and under the deferred step the top m draft gains, bound its value. A constrained
        round serves some k <= m lanes and at most P - k draft rows: every k is bounded, with the
        top P - k gains as well. The stall charge is bounded by zero."""
        if self._tops is None:
            top = lambda v: np.concatenate(([0.0], np.cumsum(np.sort(v, axis=None)[::-1])))  # noqa: E731
            self._tops = top(self.full), top(self.drafts), top(pool.base), top(self.gains)
            self._top_lists = self._tops[0].tolist(), self._tops[1].tolist()
        # The stall charge is at least zero, up to the rounding of its sums.
        stalls = pool.stall_total * stall_growth(t_ms, pool.tau_ms) / t_ms
        budget, d = shape.target_capacity, pool.deferred
        if not self.constrained(m, budget):  # exactly m lanes are served: finish_candidate's own score
            full, drafts = self._top_lists[0][m], self._top_lists[1][m]
            slope = pool.age_slope * m
            size = (abs(full) + slope * t_ms) / t_ms + t_ms * waiting + stalls
            if d is None:
                return rate_score(full, slope, t_ms, waiting) + 1e-9 * size + 1e-300
            # Deferred.score reads the members' draft gains (value - served base) when it leaves
            # decoders out; the terms it adds bound the margin.
            size += (abs(d.value) + abs(drafts)) / t_ms + abs(d.slope) * d.count
            return d.score(full, slope, t_ms, waiting, m, full - drafts) + 1e-9 * size + 1e-300
        full, drafts, base, gains = self._tops
        k = np.arange(1, m + 1)
        rows = gains[np.clip(budget - k, 0, len(gains) - 1)]
        full, drafts = np.minimum(full[k], base[k] + rows), np.minimum(drafts[k], rows)
        slope = pool.age_slope * k
        score = (full + slope * t_ms) / t_ms - 0.5 * t_ms * waiting
        size = (np.abs(full) + slope * t_ms) / t_ms + t_ms * waiting + stalls
        if d is not None:
            left = d.count - k
            step = self.steps[np.clip(left, 0, None)]
            total = t_ms + step
            later = (d.value + drafts + slope * t_ms + d.slope * left * total) / total - 0.5 * total * waiting
            score = np.where(np.isnan(step), score, later)
            size = size + np.where(np.isnan(step), 0.0, (abs(d.value) + np.abs(drafts) + np.abs(d.slope * left) * total)
                                   / total + total * waiting)
        return float(np.max(score + 1e-9 * size)) + 1e-300

    def candidates(self, pool, shape, m, t_ms, state, waiting, device, memo):
        n = len(pool.handles)
        ceilings, full = self.ceilings, self.full
        batch, budget = shape.batch_capacity, shape.target_capacity
        order = self.plain if m == n or t_ms is None else _cohort_order(pool, self.drafts, full, t_ms, n - m, self.plain)
        if int(ceilings[order[:m]].sum()) <= budget:
            members = order[:m]
            found = [(members, ceilings[members], float(full[members].sum()))]
        elif not (device and shape.proposal_depth > 0):
            members = _host_cohort(order, ceilings, batch, budget)
            if not len(members):
                return
            found = [(members, ceilings[members], float(full[members].sum()))]
        else:
            if self._frontier is None:
                self._frontier = _frontier(pool, self.gains, ceilings)
            found = _device_cohorts(pool, self._frontier, ceilings, full, order, batch, budget)
        for members, rows, value in found:
            c = Candidate(shape, members, np.zeros(len(members), dtype=np.int64), value,
                          pool.age_slope * len(members), t_ms, state)
            c.rows = np.asarray(rows, dtype=np.int64)
            c.ceilings = ceilings[members]
            c.device = device and shape.proposal_depth > 0
            # The cohort (lane indices, in order), its rows and its depth, as bytes: cheap to hash.
            c.dedupe = (members.tobytes(), c.rows.tobytes(), shape.proposal_depth)
            yield finish_candidate(c, pool, waiting, deferred=True, served_base=float(pool.base[members].sum()),
                                   memo=memo)


def _cohort_order(pool: LanePool, drafts, full, t_ms: float, left: int, plain: np.ndarray) -> np.ndarray:
    """Lanes best first for a cohort that leaves `left` decoders out, at duration T. Each member
    adds its value over T and saves its stall charge, stall_i (e^(T/tau) - 1) / T. Under the
    deferred step a left-out lane's base still counts, over T + step, so members differ only by
    their draft gains there (mixed._stall_ranked is the same rule for decoders)."""
    stalled = pool.stall is not None and pool.stall_total > 0.0
    if defers(pool, left):
        total = t_ms + pool.deferred.step(left)
        key = drafts + pool.stall * (stall_growth(t_ms, pool.tau_ms) * total / t_ms) if stalled else drafts
    elif stalled:
        key = full + pool.stall * stall_growth(t_ms, pool.tau_ms)
    else:
        return plain
    return ranked_lanes(key, pool.lru, pool.slots)


def _device_cohorts(pool, frontier, ceilings, full, order, batch, budget):
    """Cohort prefixes under three bounded orderings: total lane value, pending-token delivery
    value, and value per target row; each priced with its predicted causal allocation."""
    found = []
    per_row = full / ceilings
    for ranking in (order, np.lexsort((pool.slots, -pool.base)), np.lexsort((pool.slots, -per_row))):
        lanes, m, values, selected, lane_pos = _device_best_prefix(ranking, pool, frontier, batch, budget)
        if not len(lanes):
            continue
        best = int(np.argmax(values))
        rows = 1 + np.bincount(lane_pos[selected[best]], minlength=len(lanes))[: best + 1]
        found.append((lanes[: best + 1], rows, float(values[best])))
    return found

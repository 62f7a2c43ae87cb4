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

from helios.scheduler.policy import Candidate, LanePool, defers, finish_candidate
from helios.scheduler.utility import ranked_lanes, stall_growth


def device_allocate(joint: list, ceilings, slots, budget: int) -> list[int]:
    """The device's frontier allocation, exactly: rows per lane (each lane at least one)."""
    rows = [1] * len(ceilings)
    left = budget - len(rows)
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


def _device_best_prefix(order, pool, gains, ceilings, batch, budget):
    """Best cohort prefix of `order`, each priced with its predicted causal allocation."""
    lanes = order[: min(batch, budget, len(order))]
    k = len(lanes)
    depth = gains.shape[1]
    q = pool.forecast[lanes]
    allowed = np.arange(depth)[None, :] < (ceilings[lanes] - 1)[:, None]
    lane_pos, d = np.nonzero(allowed)
    if len(lane_pos):
        prob = q[lane_pos, d]
        entries = np.lexsort((pool.slots[lanes][lane_pos], d, -prob))
        lane_pos, d = lane_pos[entries], d[entries]
        g = gains[lanes][lane_pos, d]
    else:
        g = np.zeros(0)
    m = np.arange(1, k + 1)
    member = lane_pos[None, :] < m[:, None]
    rank = np.cumsum(member, axis=1)
    selected = member & (rank <= (budget - m)[:, None])
    base = np.cumsum(pool.base[lanes])
    values = base + selected @ g
    return lanes, m, values, selected, lane_pos


def speculative_candidates(shapes, costs, pool: LanePool, waiting: float, device: bool) -> list[Candidate]:
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
    out, seen = [], {}
    for group in groups.values():
        # Ceilings, gains and the value ranking depend on D and W only: shared by every bucket.
        ceilings = _ceilings(pool, group[0])
        gains = _gains(pool, ceilings)
        drafts = gains.sum(axis=1)
        full = pool.base + drafts
        plain = ranked_lanes(full, pool.lru, pool.slots)
        for shape in sorted(group, key=lambda s: s.capacities()):
            batch, budget = shape.batch_capacity, shape.target_capacity
            m = min(batch, n)
            t_ms, state = costs(shape)
            order = plain if m == n or t_ms is None else _cohort_order(pool, drafts, full, t_ms, n - m, plain)
            constrained = int(ceilings[order[:m]].sum()) > budget
            if not constrained:
                members = order[:m]
                found = [(members, ceilings[members], float(full[members].sum()))]
            elif not (device and shape.proposal_depth > 0):
                members = _host_cohort(order, ceilings, batch, budget)
                if not len(members):
                    continue
                found = [(members, ceilings[members], float(full[members].sum()))]
            else:
                found = _device_cohorts(pool, gains, ceilings, full, order, batch, budget)
            for members, rows, value in found:
                key = (tuple(pool.handles[members]), tuple(int(r) for r in rows), shape.proposal_depth)
                if any(other.dominates(shape) for other in seen.get(key, ())):
                    continue  # same cohort, same prefixes, same depth: padding only
                seen.setdefault(key, []).append(shape)
                c = Candidate(shape, members, np.zeros(len(members), dtype=np.int64), value,
                              pool.age_slope * len(members), t_ms, state)
                c.rows = np.asarray(rows, dtype=np.int64)
                c.ceilings = ceilings[members]
                c.device = device and shape.proposal_depth > 0
                out.append(finish_candidate(c, pool, waiting, deferred=True,
                                            served_base=float(pool.base[members].sum())))
    return out


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


def _device_cohorts(pool, gains, ceilings, full, order, batch, budget):
    """Cohort prefixes under three bounded orderings: total lane value, pending-token delivery
    value, and value per target row; each priced with its predicted causal allocation."""
    found = []
    per_row = full / ceilings
    for ranking in (order, np.lexsort((pool.slots, -pool.base)), np.lexsort((pool.slots, -per_row))):
        lanes, m, values, selected, lane_pos = _device_best_prefix(ranking, pool, gains, ceilings, batch, budget)
        if not len(lanes):
            continue
        best = int(np.argmax(values))
        rows = 1 + np.bincount(lane_pos[selected[best]], minlength=len(lanes))[: best + 1]
        found.append((lanes[: best + 1], rows, float(values[best])))
    return found

"""Candidates for ordinary and scored prefill graphs, with packed rows.

Packed prefill rows. A prefill graph B x C holds B rows and B x C prompt tokens in all; its rows
are packed by prefix sums of their own lengths (as the mixed contract packs), so a row pays for
its own tokens, not for C. The rule: the cohort is the top B lanes (feasible under free slots and
pages) ranked by their value at work min(prompt_left, C); each member first gets
min(prompt_left, C); the capacity the cohort leaves unused then goes to the members in that rank
order, each taking as much of its remaining prompt as fits two bounds of the graph's measured
full occupancy: the token sum stays <= B x C (token-parallel work) and the sum of squared row
lengths stays <= B x C^2 (causal attention work), so a packed graph never does more work than
the full-occupancy runs its cost estimate comes from. Every row consumes >= 1 token, a row
exceeds C only with capacity the others leave unused, and a single-row graph is unchanged. The
engine's contract: a prefill plan has at most B lanes, each with prompt_tokens >= 1, summing to
at most B x C.
"""

from __future__ import annotations

import math
from itertools import accumulate

import numpy as np

from helios.graphs import GraphShape
from helios.scheduler.cost import CostState
from helios.scheduler.policy import Budget, Candidate, LanePool, finish_candidate
from helios.scheduler.memo import Memo, by_identity
from helios.scheduler.utility import ranked_lanes


def _feasible_prefix(order: np.ndarray, resident: list, pool_pages: list, limit: int, budget: Budget) -> np.ndarray:
    """Greedy best-first cohort that fits the free slots and pages (resident lanes always fit).
    `resident` and `pool_pages`: the pool's columns as lists (read per lane, once per chunk)."""
    chosen, slots, pages = [], budget.free_slots, budget.free_pages
    for idx in order.tolist():
        if len(chosen) == limit:
            break
        if not resident[idx]:
            need = int(pool_pages[idx])
            if slots == 0 or need > pages:
                continue
            slots -= 1
            pages -= need
        chosen.append(idx)
    return np.asarray(chosen, dtype=np.int64)


def prefill_candidates(memo: Memo, shapes, costs, pool: LanePool, waiting: float,
                       budget: Budget) -> list[Candidate]:
    """Each prompt capacity competes with the tokens it can actually consume."""
    n = len(pool.handles)
    if n == 0 or not shapes:
        return []
    by_chunk, max_batch = by_identity(memo.chunks, shapes, _chunks, 256)
    seen: dict[tuple, set] = {}  # cohort key -> positions of the shapes that served it
    out = []
    # Per call, not per chunk: what every chunk reads lane by lane, and exp of the log prices
    # (the same elementwise values every chunk computed before).
    resident, pages, unit = pool.resident.tolist(), pool.pages.tolist(), np.exp(pool.log_prefill)
    for chunk, chunk_shapes in by_chunk:
        works = np.minimum(pool.prompt_left, chunk)
        if pool.clip is not None:
            works = pool.clip(np.arange(n), works)
        finishes = works == pool.prompt_left
        # Prompt tokens at 1 + f/x, plus at most one output token when the prompt completes.
        values = unit * works + np.where(finishes, pool.first_token, 0.0)
        order = ranked_lanes(values, pool.lru, pool.slots)
        if pool.clip is not None:
            order = order[works[order] > 0]  # a lane that cannot legally stop within this chunk
        feasible = _feasible_prefix(order, resident, pages, min(max_batch, n), budget)
        # Running sums as a list, indexed per shape: add.accumulate is prefix_sums' cumsum, the same floats.
        sums = [0.0, *np.add.accumulate(values[feasible]).tolist()]
        ranked = _Ranked(pool, feasible, works[feasible])  # per chunk: its shapes take prefixes
        for pos, shape, dominators in chunk_shapes:
            m = min(shape.batch_capacity, len(feasible))
            if m == 0:
                continue
            members = feasible[:m]
            packed, value, used = _packed(pool, ranked, m, shape, sums[m])
            key = (tuple(ranked.handles[:m]), tuple(packed.tolist()))
            same = seen.setdefault(key, set())
            if not dominators.isdisjoint(same):
                continue  # redundant padding: same cohort, same logical work, larger shape
            same.add(pos)
            t_ms, state = costs(shape)
            if pool.stall_bound_ms is not None and t_ms is not None and t_ms > pool.stall_bound_ms:
                continue  # the off-by-default duration bound (StudyConfig.stall_bound_ms)
            if state is CostState.UNKNOWN and _smaller_reaches_endpoint(shape, shapes, packed,
                                                                          pool.to_endpoint[members]):
                continue
            c = Candidate(shape, members, packed, value, 0.0, t_ms, state)
            out.append(finish_candidate(c, pool, waiting, ranked.recent[m - 1], used, memo=memo))
    return out


class _Ranked:
    """One chunk's feasible lanes, best first, as every capacity of that chunk reads them: each
    cohort is a prefix, so the per-lane columns are gathered once per chunk, not per shape."""

    __slots__ = ("members", "works", "rows", "left", "left_list", "handles", "used", "used_sq", "short", "recent")

    def __init__(self, pool: LanePool, feasible: np.ndarray, works: np.ndarray):
        self.members, self.works = feasible, works
        self.rows = works.tolist()
        self.left = pool.prompt_left[feasible]
        self.left_list = self.left.tolist()
        self.handles = pool.handles[feasible].tolist()
        # Exact integer prefix sums of the rows and their squares (what _packed's spare needs).
        self.used = [0, *accumulate(self.rows)]
        self.used_sq = [0, *accumulate(w * w for w in self.rows)]
        # The first lane with prompt beyond its chunk work: a cohort past it may grow.
        self.short = next((i for i, (w, t) in enumerate(zip(self.rows, self.left_list)) if t > w), len(self.rows))
        self.recent = list(accumulate(pool.lru[feasible].tolist(), max))  # recent[m - 1]: the top m's latest service


def _chunks(shapes) -> tuple:
    """((chunk, its (position, shape, positions of the shapes that dominate it) by batch
    capacity), ...) in chunk order, and the largest batch: static, so the padding check is a set
    test instead of pairwise comparisons per decision."""
    by_chunk: dict[int, list] = {}
    for i, s in enumerate(shapes):
        dominators = frozenset(j for j, other in enumerate(shapes) if other.dominates(s))
        by_chunk.setdefault(s.token_capacity, []).append((i, s, dominators))
    return (tuple((c, tuple(sorted(by_chunk[c], key=lambda e: e[1].batch_capacity))) for c in sorted(by_chunk)),
            max(s.batch_capacity for s in shapes))


def _packed(pool: LanePool, ranked: _Ranked, m: int, shape: GraphShape, value: float):
    """Packed works of the top-m cohort (the module's rule), their value and their token sum;
    `value` is that of its unpacked works."""
    works = ranked.works[:m]
    c = shape.token_capacity
    spare = shape.batch_capacity * c - ranked.used[m]
    spare_sq = shape.batch_capacity * c * c - ranked.used_sq[m]
    if spare <= 0 or ranked.short >= m:  # no room, or every member's prompt already fits
        return works, value, ranked.used[m]
    members, rows = ranked.members[:m], ranked.rows[:m]
    for i, (w, total) in enumerate(zip(rows, ranked.left_list)):
        if spare <= 0:
            break
        # Largest growth that keeps both sums within full occupancy: (w + e)^2 - w^2 <= spare_sq.
        e = min(total - w, spare, math.isqrt(w * w + spare_sq) - w)
        if e > 0 and pool.clip is not None:
            e = int(pool.clip(members[i:i + 1], np.array([w + e]))[0]) - w
        if e > 0:
            rows[i] = w + e
            spare -= e
            spare_sq -= (w + e) * (w + e) - w * w
    packed = np.asarray(rows, dtype=np.int64)
    finishes = packed == ranked.left[:m]
    values = np.exp(pool.log_prefill[members]) * packed + np.where(finishes, pool.first_token[members], 0.0)
    return packed, float(values.sum()), sum(rows)


def _smaller_reaches_endpoint(shape, shapes, works, to_endpoint) -> bool:
    """Prefill exploration excludes a larger unmeasured graph when a smaller prepared capacity
    consumes the same tokens up to the next message or prompt endpoint. Capacities compare by
    B x C; a smaller graph is credited with rows of at most C tokens (a lone row: as much as the
    packing rule lets it take)."""
    reach = np.minimum(works, to_endpoint)
    n = len(works)
    for other in shapes:
        if other.target_capacity >= shape.target_capacity or other.batch_capacity < n:
            continue
        limit = _lone_row_limit(other) if n == 1 else other.token_capacity
        if np.array_equal(np.minimum(np.minimum(works, limit), to_endpoint), reach):
            return True
    return False


def _lone_row_limit(shape: GraphShape) -> int:
    """The most tokens one row may take from an otherwise empty prefill graph under packing."""
    b, c = shape.batch_capacity, shape.token_capacity
    return min(b * c, math.isqrt(b * c * c))

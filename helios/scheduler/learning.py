"""Acceptance probes (spec: "Funded acceptance learning").

With full acceptance-learning credit a probe may displace the ordinary choice. A probe is a
speculative round, priced with the bounded optimistic estimate min(1, mean + sqrt(ln 20 / (2w)))
instead of the historical means, that
  - offers some request at least one depth beyond the ordinary choice (the added prefix),
  - beats the ordinary choice's score under that optimistic estimate, and
  - leaves that request future output in which to use the observation (at least one more round of
    the probe's width after it).
Candidates rank by optimistic score improvement per physical execution time; equal gains prefer
the least-informed added prefix (smallest aged weight), then the shorter execution, then the
smaller physical geometry. Only fresh measured programs probe: a stale one is timing refresh's,
so the two ledgers never fund the same execution.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from helios.graphs import GraphKind
from helios.scheduler.cost import CostState
from helios.scheduler.policy import Candidate, LanePool
from helios.scheduler.rounds import speculative_candidates


def ordinary_depths(winner: Candidate, pool: LanePool) -> np.ndarray:
    """Proposal depth the ordinary choice offers each decode-pool lane (0 when it serves none)."""
    depths = np.zeros(len(pool.handles), dtype=np.int64)
    if winner.shape.kind is GraphKind.SPECULATIVE and winner.rows is not None:
        depths[winner.members] = winner.rows - 1
    return depths


def probe_key(c: Candidate, ordinary_score: float, added_weight: float) -> tuple:
    """Larger is better: optimistic score improvement per physical execution time, then the
    least-informed added prefix, the shorter execution, the smaller geometry."""
    return ((c.score - ordinary_score) / c.t_ms, -added_weight, -c.t_ms, tuple(-x for x in c.shape.capacities()))


def probe_choice(shapes, costs, pool: LanePool, waiting: float, device: bool, winner: Candidate,
                 optimistic: np.ndarray, weights: np.ndarray, alpha: float) -> Candidate | None:
    """The best acceptance probe against the ordinary `winner`, or None.

    `optimistic` and `weights` are [lanes, depth] matrices aligned with `pool`: the optimistic
    prefix survival and the aged weight behind it.
    """
    if winner.t_ms is None or not len(pool.handles):
        return None  # discovery goes first: an unknown duration has no rate to beat
    probing = []
    for shape in shapes:
        if shape.proposal_depth >= 1 and costs(shape)[1] is CostState.FRESH:
            probing.append(shape)
    if not probing:
        return None
    hopeful = replace(pool, survival=optimistic, survival_alpha=optimistic ** alpha)
    base_depth = ordinary_depths(winner, pool)
    best, best_key = None, None
    for c in speculative_candidates(probing, costs, hopeful, waiting, device):
        if c.score <= winner.score:
            continue
        depth = c.rows - 1
        members = c.members
        added = (depth > base_depth[members]) & (pool.limit[members] >= 2 * c.rows)
        if not np.count_nonzero(added):
            continue
        # The first added position of each added lane: how informed the new prefix already is.
        lanes = members[added]
        key = probe_key(c, winner.score, float(weights[lanes, base_depth[lanes]].min()))
        if best is None or key > best_key:
            best, best_key = c, key
    return best


def acceptance_probe(sched, view, costs, winner: Candidate, device: bool) -> Candidate | None:
    """`probe_choice` over the scheduler's decode pool, with each lane's optimistic estimate at
    its aged weight (requests without their own estimate stand at the prior's starting weight)."""
    pool = view.decode
    if pool.survival is None or not len(pool.handles):
        return None
    t, rows = sched.requests, view.decode_rows
    cols = t.speculation.acceptance[sched.source]
    generated = t.output_done[rows]
    optimistic = sched.speculation.optimistic(t.speculation, rows, sched.source, generated)
    weights = cols.aged_weights(rows, generated)
    return probe_choice(sched.shapes.speculative, costs, pool, view.waiting, device, winner, optimistic,
                        weights, sched.policy.adaptive_verification_alpha)

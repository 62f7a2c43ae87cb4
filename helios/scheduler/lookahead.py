"""Prerequisite lookahead: the exact two-stage cohort for one pair of prepared shapes.

A prerequisite graph (duration T, capacity Bp: a restore, a snapshot, a vision window) enables
"newly ready" rows that a following inference graph (duration F, capacity Bg) can then serve.
For fixed shapes, lane values are additive, so for each number k >= 1 of newly ready rows in
the following graph the best cohort is: the k largest newly ready contributions, the following
graph's remaining Bg - k capacity filled with the largest already-ready contributions, and the
prerequisite's remaining Bp - k capacity filled with the largest terminal-completion
contributions. Sorted prefix sums give every k at once: exact, with no subset enumeration.

The sequence is scored over T + F:

    (newly ready + already ready + terminal contributions) / (T + F) - (T + F)/2 * waiting

(terminal contributions are computed by the caller with their age stopping at T). The
productive first-stage prefix (the prerequisite alone, with its terminal completions, over T)
is compared too; the better rate wins, and equal rates prefer advancing more requests. The
submitted plan keeps the prerequisite's physical T: lookahead time never enters timing or cost
learning (the caller freezes `t_ms`, not T + F, into the plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class TwoStage:
    """The chosen cohort: how many of each sorted list (largest first) take part, and its rate."""

    newly: int  # newly ready rows in both graphs (0: the first stage alone)
    ready: int  # already-ready rows in the following graph
    terminal: int  # terminal completions in the prerequisite graph
    value: float
    score: float
    sequence: bool  # True: prerequisite then following graph; False: the first stage alone

    @property
    def advanced(self) -> int:
        return self.newly + self.ready + self.terminal


def _sums(values) -> np.ndarray:
    v = np.sort(np.asarray(values, dtype=float))[::-1]
    return np.concatenate([[0.0], np.cumsum(v)])


def two_stage(newly, ready, terminal, prereq_capacity: int, follow_capacity: int, t_ms: float, f_ms: float,
              waiting: float = 0.0) -> TwoStage | None:
    """The best cohort for one (prerequisite, following) shape pair; None without a newly
    ready row and without a terminal row. Contributions must be nonnegative (a lane is
    only added when it adds value)."""
    n_sums, r_sums, m_sums = _sums(newly), _sums(ready), _sums(terminal)
    n, r, m = len(n_sums) - 1, len(r_sums) - 1, len(m_sums) - 1
    best: TwoStage | None = None
    total = t_ms + f_ms
    for k in range(1, min(n, prereq_capacity, follow_capacity) + 1):
        rr, mm = min(r, follow_capacity - k), min(m, prereq_capacity - k)
        value = float(n_sums[k] + r_sums[rr] + m_sums[mm])
        best = _better(best, TwoStage(k, rr, mm, value, value / total - 0.5 * total * waiting, True))
    if m:
        # The first stage alone: terminal completions over T; spare capacity may still advance
        # newly ready rows at no extra physical cost (they add no value in this stage).
        mm = min(m, prereq_capacity)
        spare = min(n, prereq_capacity - mm)
        value = float(m_sums[mm])
        best = _better(best, TwoStage(spare, 0, mm, value, value / t_ms - 0.5 * t_ms * waiting, False))
    return best


def _better(a: TwoStage | None, b: TwoStage) -> TwoStage:
    if a is None:
        return b
    return b if (b.score, b.advanced) > (a.score, a.advanced) else a

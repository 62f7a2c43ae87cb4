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
is compared too; the better rate wins, and equal rates prefer advancing more requests: the
prerequisite's unused capacity advances further newly ready rows at no extra physical cost. The
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
    # Newly ready rows the prerequisite's unused capacity also advances, beyond those the following
    # graph serves: no extra physical cost, no value in this decision ("equal value rates prefer
    # advancing more requests"). In the first stage alone, every newly ready row it advances.
    spare: int = 0
    fixed: int = 0  # following rows the caller fixed (a mixed graph's prompt rows) that take part

    @property
    def advanced(self) -> int:
        return self.newly + self.ready + self.terminal + self.spare + self.fixed


def _sums(values) -> np.ndarray:
    v = np.sort(np.asarray(values, dtype=float))[::-1]
    return np.concatenate([[0.0], np.cumsum(v)])


def two_stage(newly, ready, terminal, prereq_capacity: int, follow_capacity: int, t_ms: float, f_ms: float,
              waiting: float = 0.0, fixed: float | None = None, fixed_newly: bool = False,
              fixed_rows: int = 1) -> TwoStage | None:
    """The best cohort for one (prerequisite, following) shape pair; None without a newly
    ready row and without a terminal row. Contributions must be nonnegative (a lane is
    only added when it adds value).

    `fixed`: the value of one following row the caller has chosen (a mixed graph's prompt row,
    spec "Mixed execution contract": absent is None, already ready, or enabled by the
    prerequisite with `fixed_newly`); it takes one of the following graph's rows, and when newly
    ready one of the prerequisite's, and it counts as the newly ready row that must take part.
    `newly` and `ready` are then the decode rows' contributions. `fixed_rows`: the following rows
    the fixed value takes (several prompt rows packed in one mixed graph, docs/packed-prompt-rows.md;
    of them only one, the restored prompt, is newly ready)."""
    n_sums, r_sums, m_sums = _sums(newly), _sums(ready), _sums(terminal)
    n, r, m = len(n_sums) - 1, len(r_sums) - 1, len(m_sums) - 1
    best: TwoStage | None = None
    total = t_ms + f_ms
    pcap = prereq_capacity - (fixed is not None and fixed_newly)
    taken = 0 if fixed is None else fixed_rows
    fcap = follow_capacity - taken
    extra = 0.0 if fixed is None else fixed
    first = 0 if fixed is not None and fixed_newly else 1  # at least one newly ready row takes part
    for k in range(first, min(n, pcap, fcap) + 1):
        rr, mm = min(r, fcap - k), min(m, pcap - k)
        spare = min(n - k, pcap - k - mm)
        value = float(n_sums[k] + r_sums[rr] + m_sums[mm]) + extra
        best = _better(best, TwoStage(k, rr, mm, value, value / total - 0.5 * total * waiting, True, spare,
                                      taken))
    if m:
        # The first stage alone: terminal completions over T; spare capacity may still advance
        # newly ready rows at no extra physical cost (they add no value in this stage).
        mm = min(m, prereq_capacity)
        spare = min(n, prereq_capacity - mm)
        value = float(m_sums[mm])
        best = _better(best, TwoStage(0, 0, mm, value, value / t_ms - 0.5 * t_ms * waiting, False, spare))
    return best


def _better(a: TwoStage | None, b: TwoStage) -> TwoStage:
    if a is None:
        return b
    # Equal rates prefer advancing more requests. Equal up to rounding: the same contributions
    # summed in another order (k newly ready rows and one ready row against k - 1 and two, when a
    # newly ready and a ready row contribute alike) differ in the last bits.
    if abs(b.score - a.score) <= 1e-12 * max(abs(a.score), abs(b.score)):
        return b if b.advanced > a.advanced else a
    return b if b.score > a.score else a

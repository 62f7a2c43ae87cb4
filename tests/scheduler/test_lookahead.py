"""The exact two-stage cohort against exhaustive enumeration with an independent scorer, and the
spec's snapshot-cost sweep."""

from __future__ import annotations

from itertools import chain, combinations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from helios.scheduler.lookahead import two_stage
from helios.scheduler.prerequisites import continuation_index


def subsets(items):
    return chain.from_iterable(combinations(range(len(items)), k) for k in range(len(items) + 1))


def brute_force(newly, ready, terminal, bp, bg, t, f, w, fixed=None, fixed_newly=False, fixed_rows=1):
    """Every subset triple, scored from scratch: (best score, most requests at that score). Spec,
    "Prerequisites and completion": unused prerequisite capacity advances further newly ready rows
    at no extra physical cost, and equal value rates prefer advancing more requests. `fixed`: one
    following row chosen beforehand (a mixed graph's prompt row), newly ready or already ready;
    `fixed_rows`: the following rows it takes (several packed prompt rows, one of them newly ready)."""
    cands = []
    own = 1 if fixed is not None and fixed_newly else 0  # prerequisite rows the fixed row takes
    taken = 0 if fixed is None else fixed_rows  # following rows the fixed rows take
    for sn in subsets(newly):
        for sm in subsets(terminal):
            if (sn or own) and len(sn) + len(sm) + own <= bp:
                for sr in subsets(ready):
                    if len(sn) + len(sr) + taken > bg:
                        continue
                    value = sum(newly[i] for i in sn) + sum(ready[i] for i in sr) + sum(terminal[i] for i in sm)
                    value += fixed or 0.0
                    spare = min(len(newly) - len(sn), bp - own - len(sn) - len(sm))
                    count = len(sn) + len(sr) + len(sm) + spare + taken
                    cand = (value / (t + f) - (t + f) / 2 * w, count)
                    cands.append(cand)
            if not sn and sm and len(sm) <= bp:
                value = sum(terminal[i] for i in sm)
                # The first stage alone: its spare capacity advances newly ready rows at no cost.
                cand = (value / t - t / 2 * w, len(sm) + min(len(newly), bp - len(sm)))
                cands.append(cand)
    if not cands:
        return None
    # Equal rates up to rounding (the same rows summed in another order, a relative difference
    # near 1e-16): the most requests. Rates that differ more, however small, are not equal.
    top = max(score for score, _ in cands)
    return top, max(n for score, n in cands if abs(score - top) <= 1e-12 * abs(top))


values = st.lists(st.floats(0.0, 50.0, allow_nan=False), max_size=4)


@settings(max_examples=300, deadline=None)
@given(values, values, values, st.integers(1, 4), st.integers(1, 4), st.floats(0.1, 20.0), st.floats(0.1, 20.0),
       st.sampled_from([0.0, 0.01, 0.5]))
# Equal rows in `newly` and `ready`: the two equal-rate cohorts' sums round differently.
@example([1.3770856054250942, 29.686218967909937, 49.38990081612347, 49.48438902916358], [1.3770856054250942], [],
         4, 4, 1.0, 1.0, 0.0)
# Two newly ready rows and one ready row against one and two: the same sum, rounded apart.
@example([18.969273363775365, 18.969273363775365], [46.0, 18.969273363775365], [], 2, 3, 1.0, 1.0, 0.0)
def test_two_stage_matches_exhaustive_enumeration(newly, ready, terminal, bp, bg, t, f, w):
    got = two_stage(newly, ready, terminal, bp, bg, t, f, w)
    want = brute_force(newly, ready, terminal, bp, bg, t, f, w)
    if want is None:
        assert got is None
        return
    assert got.score == pytest.approx(want[0], rel=1e-9, abs=1e-9)
    if got.sequence:
        assert got.newly >= 1  # at least one newly ready row takes part
    # Equal value rates prefer advancing more requests.
    if abs(got.score - want[0]) <= 1e-9 * max(1.0, abs(want[0])):
        assert got.advanced == want[1]


@settings(max_examples=300, deadline=None)
@given(values, values, values, st.integers(1, 4), st.integers(2, 4), st.floats(0.1, 20.0), st.floats(0.1, 20.0),
       st.sampled_from([0.0, 0.01, 0.5]), st.floats(0.0, 80.0), st.booleans())
@example([0.0], [], [2.2250738585072014e-308], 1, 2, 1.0, 1.0, 0.0, 0.0, False)  # a tiny rate is still higher
def test_a_mixed_prompt_row_leaves_an_exact_two_stage_problem(newly, ready, terminal, bp, bg, t, f, w, prompt,
                                                               prompt_newly):
    """Spec, "Mixed execution contract": before a mixed graph the prompt row is absent, already
    ready, or enabled by the prerequisite; each case is an exact two-stage problem for the decode
    and terminal rows, checked against every subset."""
    got = two_stage(newly, ready, terminal, bp, bg, t, f, w, prompt, prompt_newly)
    want = brute_force(newly, ready, terminal, bp, bg, t, f, w, prompt, prompt_newly)
    if want is None:
        assert got is None
        return
    assert got.score == pytest.approx(want[0], rel=1e-9, abs=1e-9)
    if got.sequence:
        assert got.fixed and (got.newly >= 1 or prompt_newly)  # a newly ready row takes part
    if abs(got.score - want[0]) <= 1e-9 * max(1.0, abs(want[0])):
        assert got.advanced == want[1]


@settings(max_examples=200, deadline=None)
@given(values, values, values, st.integers(1, 4), st.integers(2, 6), st.floats(0.1, 20.0), st.floats(0.1, 20.0),
       st.sampled_from([0.0, 0.01, 0.5]), st.floats(0.0, 80.0), st.booleans(), st.integers(1, 3))
def test_packed_prompt_rows_leave_an_exact_two_stage_problem(newly, ready, terminal, bp, bg, t, f, w, prompt,
                                                             prompt_newly, rows):
    """Several prompt rows packed in one mixed graph (docs/packed-prompt-rows.md): the fixed value
    takes `rows` following rows (one prerequisite row when the restored prompt is among them), and
    the decode and terminal rows are still an exact two-stage problem, checked against every subset."""
    got = two_stage(newly, ready, terminal, bp, bg, t, f, w, prompt, prompt_newly, rows)
    want = brute_force(newly, ready, terminal, bp, bg, t, f, w, prompt, prompt_newly, rows)
    if want is None:
        assert got is None
        return
    assert got.score == pytest.approx(want[0], rel=1e-9, abs=1e-9)
    if got.sequence:
        assert got.fixed == rows and got.newly + got.ready + rows <= bg
    if abs(got.score - want[0]) <= 1e-9 * max(1.0, abs(want[0])):
        assert got.advanced == want[1]


def test_spare_prerequisite_capacity_advances_every_waiting_row():
    """A prerequisite of batch four with three newly ready rows and a following graph of two: the
    sequence serves two, and the spare rows advance the third at no extra physical cost."""
    got = two_stage([5.0, 4.0, 3.0], [], [], 4, 2, 1.0, 2.0)
    assert got.sequence and got.newly == 2 and got.spare == 1 and got.advanced == 3


def test_snapshot_cost_sweep_enables_the_shared_decode_only_with_enough_value_per_time():
    """Three ready decoders; one more row joins the shared decode batch only after a snapshot of
    cost T. The sequence must win exactly when (a + sum b)/(T + F) - (T + F)/2 w beats decoding
    the three now, sum b / F - F/2 w."""
    a, b, f, w = 30.0, [10.0, 10.0, 10.0], 10.0, 0.01
    outcomes = []
    for t in np.geomspace(0.05, 200.0, 60):
        seq = two_stage([a], b, [], 1, 4, float(t), f, w)
        decode_now = sum(b) / f - f / 2 * w
        expected = (a + sum(b)) / (t + f) - (t + f) / 2 * w > decode_now  # independent scorer
        outcomes.append(seq.score > decode_now)
        assert outcomes[-1] == expected
        assert seq.newly == 1 and seq.ready == 3
    assert any(outcomes) and not all(outcomes)  # the sweep crosses the switch point
    # The winner switches once: cheap snapshots enable the batch, expensive ones do not.
    assert outcomes == sorted(outcomes, reverse=True)


def test_terminal_rows_fill_the_prerequisite_and_can_win_alone():
    # A cheap snapshot graph with two terminal completions: their value alone over T beats the
    # sequence whose following graph is slow and adds little.
    got = two_stage([1.0], [], [50.0, 40.0], 4, 4, 2.0, 100.0)
    assert not got.sequence and got.terminal == 2 and got.spare == 1  # spare capacity advances it
    got = two_stage([500.0], [], [50.0, 40.0], 3, 4, 2.0, 10.0)
    assert got.sequence and (got.newly, got.terminal) == (1, 2)


def test_chain_continuation_index():
    # V*T/(T+F): a further stage of F ms discounts a continuation's ranking contribution.
    assert continuation_index(12.0, 4.0, 8.0) == pytest.approx(4.0)

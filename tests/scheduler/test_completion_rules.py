"""One set of completion rules: `_columns` (the whole-column check of the common form) is a cache
of `_lane_problem`'s rules. For records in that form (CompletionRecords holding tuples of Python
ints) it accepts exactly what the lane-by-lane rules accept, with the same columns; any other
form goes to the lane rules."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from helios.scheduler.completion_check import _columns, _lane_problem
from helios.scheduler.plan import CompletionRecord, Lane, PlanLanes


def _lanes(rows):
    return PlanLanes.of([Lane(h, e, 0, None, 0, p, 0, r, 1.0, 1.0, 0.0) for h, e, p, r in rows])


LANE = st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 64), st.integers(0, 3))
# A record built from its lane with some fields disturbed: handle, epoch, prompt, token count,
# a negative or bool token, eos.
CHANGE = st.tuples(st.sampled_from(["none", "handle", "epoch", "prompt", "negative", "bool"]),
                   st.integers(-1, 2), st.booleans())


def _record(lane, change, delta, eos):
    handle, epoch, prompt, rows = lane
    n = max(0, rows + delta)
    tokens = tuple(range(5, 5 + n))
    if change == "handle":
        handle += 1
    elif change == "epoch":
        epoch += 1
    elif change == "prompt":
        prompt += 1
    elif change == "negative" and n:
        tokens = (-1,) + tokens[1:]
    elif change == "bool" and n:
        tokens = (True,) + tokens[1:]
    return CompletionRecord(handle, epoch, prompt, tokens, eos)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(LANE, CHANGE, st.booleans()), min_size=1, max_size=6), st.booleans())
def test_the_column_check_accepts_exactly_what_the_lane_rules_accept(cases, rounds):
    lanes = _lanes([lane for lane, _, _ in cases])
    records = [_record(lane, *change) for lane, change, _ in cases]
    live = [is_live for _, _, is_live in cases]
    lane_ok = all(_lane_problem(l, r, is_live, rounds) is None for l, r, is_live in zip(lanes, records, live))
    checked = _columns(lanes, records, lambda: live, rounds)
    # bool tokens are ints to Python but not token ids: the lane rules refuse them, so must the cache.
    assert (checked is not None) == lane_ok
    if checked is not None:
        tokens, counts, eos, handles, _, as_planned = checked
        assert tokens == [r.tokens for r in records] and counts == [len(r.tokens) for r in records]
        assert eos == [r.eos for r in records] and handles == [l.handle for l in lanes]
        assert as_planned == (counts == [l.output_rows for l in lanes])


def test_other_forms_go_to_the_lane_rules():
    """numpy integer tokens and record subclasses are not the common form: the cache declines them
    and the lane rules decide (they accept numpy integers and refuse anything but a CompletionRecord)."""
    lanes = _lanes([(1, 0, 0, 1)])
    numpy_tokens = [CompletionRecord(1, 0, 0, (np.int64(7),))]
    assert _columns(lanes, numpy_tokens, lambda: [True], False) is None
    assert _lane_problem(lanes[0], numpy_tokens[0], True, False) is None
    assert _lane_problem(lanes[0], ("not", "a record"), True, False).startswith("not a CompletionRecord")

"""scripts/ttft_anatomy.py's slot-bound share against a brute-force count on a unit time grid."""

import importlib.util
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

_spec = importlib.util.spec_from_file_location(
    "ttft_anatomy", Path(__file__).resolve().parents[2] / "scripts" / "ttft_anatomy.py")
anatomy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(anatomy)


def _brute(start, arrival, end, slots):
    held_full = waited = 0
    for a, s in zip(arrival, start):
        for x in range(a, s):  # unit steps [x, x + 1): held counts requests with start <= x < end
            waited += 1
            held_full += sum(1 for s2, e2 in zip(start, end) if s2 <= x < e2) >= slots
    return held_full / waited if waited else 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10), st.integers(1, 20)), min_size=1, max_size=8),
       st.integers(1, 4))
def test_the_share_of_waits_with_every_slot_held_matches_a_unit_grid_count(reqs, slots):
    arrival = np.array([a for a, _, _ in reqs], dtype=float)
    start = arrival + [w for _, w, _ in reqs]
    end = start + [d for _, _, d in reqs]
    got = anatomy._slot_bound_share(start, arrival, end, slots)
    assert np.isclose(got, _brute(start.astype(int).tolist(), arrival.astype(int).tolist(),
                                  end.astype(int).tolist(), slots))


def test_no_wait_is_no_share():
    t = np.array([0.0, 5.0])
    assert anatomy._slot_bound_share(t, t, t + 3, 1) == 0.0

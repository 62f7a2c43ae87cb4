"""Extra prefill cuts at conversation anchors (scheduler/anchors.py): cuts land exactly at the
planned endpoints, latest message first, within the request-local allowance; unknown costs
disable extras but keep the terminal capture; a zero fraction changes nothing; and random
admission and cancellation lose no request and leak nothing."""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.config import SchedulerConfig, SpeculationMode
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import speculative_shapes
from helios.scheduler import Scheduler
from helios.scheduler.anchors import AnchorCuts, tiled_ms

from tests.scheduler.conftest import MS, FixedCosts, assert_all_ended, cancel_pick, decode, drain, make, prefill, sim_driver, spec, step
from tests.scheduler.conftest import table_policy

SNAP, REST = GraphShape(GraphKind.SNAPSHOT, 1), GraphShape(GraphKind.RESTORE, 1)
# One-row prefill: 64 tokens in 30 ms, 256 in 80 ms (the cheaper per token); snapshot 2 ms.
TABLE = {decode(1): 10, decode(4): 14, prefill(64): 30, prefill(256): 80, SNAP: 2, REST: 3}



def with_fraction(fraction: float, **kw) -> SchedulerConfig:
    return SchedulerConfig(checkpoint_extra_work_fraction=fraction, **kw)


def anchor_cuts(log) -> list[int]:
    return [int(p.lanes.context_tokens[0]) for p, _ in log if p.anchor]


def crosses_none(log, cuts) -> bool:
    """No prefill chunk starts before a cut and ends after it."""
    return all(not a < c < b for a, b in chunk_ends(log) for c in cuts)


def chunk_ends(log) -> list[tuple[int, int]]:
    return [(int(p.lanes.prompt_start[0]), int(p.lanes.prompt_start[0] + p.lanes.prompt_tokens[0]))
            for p, _ in log if p.shape.kind.is_prefill]


def test_cuts_land_exactly_at_planned_endpoints_within_the_allowance():
    # Uncached 300 tokens: one 256 chunk (80) and 44 in a 64 chunk (30) = 110 ms; 0.05 -> 5.5 ms.
    # Latest first: 250 (its split is free: 250 -> 80, 50 -> 30; cost = the 2 ms snapshot), then
    # 100 (splits 250 into 100 + 150: one more 256 chunk, 80 ms: over), then the prompt end (2 ms).
    allowance = 0.05 * (80 + 30)
    assert allowance >= 2 + 2 and allowance < 2 + 80
    s = make(TABLE)
    h = s.admit(spec(prompt=300, out=3, endpoints=(100, 250)), 0)
    log, _ = drain(s)
    assert anchor_cuts(log) == [250, 300]
    # No chunk passes a cut, and the anchor snapshot comes right after the chunk that reaches it.
    assert chunk_ends(log) == [(0, 250), (250, 300)]
    kinds = [(p.shape.kind, p.anchor) for p, _ in log]
    assert kinds[:4] == [(GraphKind.PREFILL, False), (GraphKind.SNAPSHOT, True),
                         (GraphKind.PREFILL, False), (GraphKind.SNAPSHOT, True)]
    assert kinds[-1] == (GraphKind.SNAPSHOT, False)  # the terminal capture still follows
    # A nonterminal snapshot keeps the slot: the request continues in the same slot.
    slots = {int(p.lanes.slot[0]) for p, _ in log[1:]}
    assert len(slots) == 1 and not s.is_live(h) and not s.anchors.requests
    assert s.resources.free_slots == s.resources.total_slots


def test_latest_message_first_when_the_allowance_funds_one_cut():
    # 600 tokens: 2 x 256 (160) + 88 in a 256 chunk (80) = 240 ms. Cuts at 256 and 512 are both
    # free splits (each 2 ms); an allowance of 0.01 x 240 = 2.4 ms funds exactly one: the later.
    allowance = 0.01 * (2 * 80 + 80)
    assert 2 <= allowance < 4
    s = make(TABLE, config=with_fraction(0.01))
    s.admit(spec(prompt=600, out=2, endpoints=(256, 512)), 0)
    log, _ = drain(s)
    assert anchor_cuts(log) == [512] and crosses_none(log, [512])
    # With room for all three (0.05 x 240 = 12 ms >= 6 ms): 256, 512 and the prompt end.
    s = make(TABLE)
    s.admit(spec(prompt=600, out=2, endpoints=(256, 512)), 0)
    assert anchor_cuts(drain(s)[0]) == [256, 512, 600]


def test_cut_cost_counts_the_extra_chunk_a_split_forces():
    graphs = [(64, 30.0), (256, 80.0)]
    assert tiled_ms(300, graphs) == 110.0 and tiled_ms(44, graphs) == 30.0 and tiled_ms(0, graphs) == 0.0
    # 100 tokens in a 256-row chunk alone; a cut at 40 gives two 64 chunks (60 ms): not dearer.
    s = make(TABLE, config=with_fraction(0.03))  # 0.03 x 80 = 2.4: one 2 ms snapshot
    s.admit(spec(prompt=100, out=2, endpoints=(40,)), 0)
    assert anchor_cuts(drain(s)[0]) == [40]
    # Endpoints at or below the restored prefix are never cut.
    # 344 uncached tokens: 160 ms, 8 ms allowance; 512 (a free split) and the prompt end fit.
    s = make(TABLE)
    s.admit(spec(prompt=600, out=2, cached_tokens=256, endpoints=(100, 256, 512)), 0)
    log, _ = drain(s)
    assert anchor_cuts(log) == [512, 600] and log[0][0].shape.kind is GraphKind.RESTORE
    assert crosses_none(log, [512])


def test_unknown_costs_disable_extra_cuts_but_keep_the_terminal_capture():
    for unmeasured in ((SNAP,), (prefill(64), prefill(256))):
        s = make(TABLE, unmeasured=unmeasured)
        s.admit(spec(prompt=300, out=3, endpoints=(100, 250)), 0)
        log, _ = drain(s)
        assert not anchor_cuts(log) and not s.anchors.requests
        assert log[-1][0].shape.kind is GraphKind.SNAPSHOT and not log[-1][0].anchor


def test_expired_snapshot_cost_skips_the_copy_after_the_split():
    s = make(TABLE, policy=table_policy(estimate_ttl_ns=50 * MS))
    s.admit(spec(prompt=300, out=2, endpoints=(250,)), 0)
    assert s.anchors.requests  # planned while the estimates were fresh
    s.advance_to(60 * MS)  # the snapshot estimate expires before the cut is reached
    log, _ = drain(s)
    assert chunk_ends(log)[0] == (0, 250)  # the split executed
    assert not anchor_cuts(log) and s.anchors.skipped >= 1 and not s.anchors.requests


def test_zero_fraction_plans_exactly_as_without_anchor_cuts(monkeypatch):
    def run(disable: bool):
        if disable:
            monkeypatch.setattr(AnchorCuts, "admitted", lambda *a, **k: None)
        s = make(TABLE, config=with_fraction(0.0))
        for i, (prompt, ends) in enumerate(((300, (100, 250)), (120, (40,)), (600, (256, 512)))):
            s.admit(spec(prompt=prompt, out=3, endpoints=ends), i * MS)
        log, _ = drain(s)
        monkeypatch.undo()
        return [(p.shape, p.lanes.handle.tolist(), p.lanes.prompt_start.tolist(), p.lanes.prompt_tokens.tolist(),
                 p.lanes.context_tokens.tolist(), p.anchor, [g.tokens for g in out]) for p, out in log]
    assert run(False) == run(True)
    assert not any(anchor for *_, anchor, _ in run(False))


def test_baselines_never_cut():
    from helios.baselines import make_scheduler
    sched = make_scheduler("sarathi", Catalog(TABLE), None, SchedulerConfig(request_slots=4))
    sched.seed_costs({sh: [int(ms * MS)] for sh, ms in TABLE.items()}, 0)
    sched.admit(spec(prompt=300, out=2, endpoints=(100, 250)), 0)
    assert not sched.anchors.enabled and not sched.anchors.requests
    assert not anchor_cuts(drain(sched)[0])


# ---- invariants under random admission and cancellation ------------------------------------

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["admit", "admit", "cancel", "step", "step"]),
                          st.integers(0, 7), st.integers(1, 400)), min_size=1, max_size=40),
       st.integers(0, 3))
def test_no_lost_request_and_no_leak_with_anchor_cuts(ops, seed):
    sched, d = sim_driver(TABLE, seed, slots=3)
    handles, ends_of = [], {}
    for op, pick, n in ops:
        if op == "admit":
            prompt = 40 + n
            ends = tuple(sorted({e for e in (n // 3, prompt - 5, 20 + n % 50) if 0 < e < prompt}))
            ends = ends if pick % 4 else ()
            handles.append(d.submit(range(prompt), 1 + n % 5, ends, output_len=n % 4 + 1))
            ends_of[handles[-1]] = ends + (prompt,)
        elif op == "cancel":
            cancel_pick(d, handles, pick)
        else:
            d.step()
    d.run()
    assert_all_ended(sched, d, handles, slots=3)
    assert not sched.anchors.requests and not sched.state.captures and not sched.state.restoring
    # Every anchor snapshot copied exactly one of its request's endpoints or its prompt end, once,
    # and only requests with endpoints were cut.
    copied = [(int(h), int(at)) for p in d.history if p.anchor for h, at in zip(p.lanes.handle, p.lanes.context_tokens)]
    assert len(copied) == len(set(copied))
    assert all(len(ends_of[h]) > 1 and at in ends_of[h] for h, at in copied)


def test_cut_clip_composes_with_an_inner_clip():
    from helios.scheduler.anchors import AnchorState, _clipper
    import numpy as np
    states = [AnchorState([100, 200]), None, AnchorState([])]
    inner = lambda idx, works: np.minimum(works, 90)  # noqa: E731  (a vision clip stopping earlier)
    clip = _clipper(states, [0, 0, 0], None)
    assert clip(np.arange(3), np.array([150, 150, 150])).tolist() == [100, 150, 150]
    assert _clipper(states, [100, 0, 0], None)(np.array([0]), np.array([150])).tolist() == [100]  # next cut: 200
    assert _clipper(states, [0, 0, 0], inner)(np.arange(3), np.array([150, 150, 150])).tolist() == [90, 90, 90]


def test_cancel_with_an_anchor_snapshot_in_flight_keeps_then_frees_the_row():
    from helios.scheduler import ExecutionTiming
    from tests.scheduler.conftest import records_for
    s = make(TABLE)
    h = s.admit(spec(prompt=300, out=3, endpoints=(250,)), 0)
    fence = 0
    while not (p := s.plan()).anchor:
        fence += 1
        step(s, p, fence)
    fence += 1
    s.commit(p, fence)
    s.cancel(h, s.now_ns)
    assert h in s.requests.index  # its row, slot and pages stay owned through its fence
    assert s.resources.free_slots == s.resources.total_slots - 1
    s.advance_to(s.now_ns + 2 * MS)
    s.complete(fence, records_for(p), ExecutionTiming((2 * MS,), wall_ns=2 * MS))
    assert s.plan() is None and h not in s.requests.index and not s.anchors.requests
    assert s.resources.free_slots == s.resources.total_slots and s.resources.free_pages == s.resources.total_pages


def speculative_table(widths) -> dict:
    shapes = speculative_shapes(4, widths, 16, ragged=False)
    return {**{sh: 10 + 2 * sh.batch_capacity + sh.target_capacity for sh in shapes},
            prefill(64): 30, prefill(256): 80, SNAP: 2, REST: 3}


@pytest.mark.parametrize("mode, widths", [(SpeculationMode.ADAPTIVE, (1, 2)), (SpeculationMode.FIXED, (3,))])
def test_an_anchor_snapshot_under_speculation_is_valued_by_the_decode_step_it_enables(mode, widths):
    # With speculation loaded, width-one programs (or, fixed, the K + 1 ones) replace decode. The
    # snapshot at a prompt end enables that step; valued by no graph it was worth nothing, ran
    # only when nothing else could, and the server's chat streams decoded one at a time.
    s = make(speculative_table(widths), config=SchedulerConfig(speculation=mode, copy_proposals=True))
    first = s.admit(spec(prompt=300, out=200, endpoints=(250,)), 0)
    fence, log = 0, []
    while not any(p.shape.kind is GraphKind.SPECULATIVE for p, _ in log):  # the first stream decodes
        fence += 1
        p = s.plan()
        log.append((p, step(s, p, fence)))
    late = [s.admit(spec(prompt=300, out=40, endpoints=(250,)), s.now_ns) for _ in range(3)]
    log, _ = drain(s, fence)
    rounds = [p for p, _ in log if p.shape.kind is GraphKind.SPECULATIVE]
    assert max(len(p.lanes) for p in rounds) == 4  # the late streams join the first one's rounds
    assert not any(s.is_live(h) for h in [first, *late]) and not s.anchors.requests
    assert s.resources.free_slots == s.resources.total_slots

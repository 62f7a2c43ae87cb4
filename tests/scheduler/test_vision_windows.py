"""Vision windows in the scheduler and SimCore (spec: "Prerequisites and completion"): whole-image
windows bounded by the prepared feature storage, vision graphs as prerequisites, atomic image
spans, private window snapshots at each boundary, and nothing lost or leaked."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.baselines import make_scheduler
from helios.config import SchedulerConfig
from helios.engine.sim_core import SimCore
from helios.errors import InvalidRequest
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import Capacities, build_catalog
from helios.runtime.driver import DriverRequest, SyncDriver
from helios.scheduler import ImageSpan, RequestSpec, Scheduler
from helios.scheduler.selection import cost_lookup
from helios.scheduler.vision import group_windows
from helios.sim.synthetic_cost import SyntheticCostModel

from tests.scheduler.conftest import MS, FixedCosts, decode, drain, make, prefill, spec, step

V1, V2 = GraphShape(GraphKind.VISION, 1, 200), GraphShape(GraphKind.VISION, 2, 200)
SNAP, REST = GraphShape(GraphKind.SNAPSHOT, 1), GraphShape(GraphKind.RESTORE, 1)
TEXT = {decode(1): 10, decode(4): 14, prefill(64): 30, prefill(64, 4): 60, prefill(256): 80, SNAP: 2, REST: 3}
TABLE = {**TEXT, V1: 20, V2: 30}
IMAGES = (ImageSpan(20, 100), ImageSpan(130, 120), ImageSpan(300, 50), ImageSpan(360, 150))  # 3 windows of 200



def inside(end, images):
    return any(im.offset < end < im.end for im in images)


# ---- step 1: spans and windows ----------------------------------------------------------------
def test_request_spec_validates_image_spans():
    RequestSpec(100, 4, images=(ImageSpan(0, 10), ImageSpan(10, 90)))  # adjacent, to the prompt end
    bad = [(ImageSpan(95, 10),), (ImageSpan(10, 20), ImageSpan(25, 5)), (ImageSpan(50, 5), ImageSpan(10, 5)),
           [ImageSpan(0, 5)], ("image",)]
    for images in bad:
        with pytest.raises(InvalidRequest):
            RequestSpec(100, 4, images=images)
    with pytest.raises(InvalidRequest, match="straddles"):
        RequestSpec(100, 4, cached_tokens=15, images=(ImageSpan(10, 10),))
    for args in ((-1, 5), (0, 0), (0, 5, 0), (True, 5)):
        with pytest.raises(InvalidRequest):
            ImageSpan(*args)
    assert ImageSpan(3, 7).features == 7 and ImageSpan(3, 7, 12).features == 12


def test_windows_group_whole_images_bounded_by_storage():
    windows = group_windows(IMAGES, 200)
    assert [[im.offset for im in w.images] for w in windows] == [[20], [130, 300], [360]]
    assert all(w.features <= 200 for w in windows)
    # Compact feature offsets from zero in every window.
    assert [w.feature_offsets for w in windows] == [(0,), (0, 120), (0,)]
    assert windows[1].start == 130
    with pytest.raises(InvalidRequest, match="feature storage"):
        group_windows((ImageSpan(0, 10, 201),), 200)
    s = make(TABLE)
    with pytest.raises(InvalidRequest, match="feature storage"):
        s.admit(spec(prompt=400, images=(ImageSpan(0, 10, 300),)), 0)
    with pytest.raises(InvalidRequest, match="largest prefill chunk"):
        s.admit(spec(prompt=400, images=(ImageSpan(0, 300, 100),)), 0)
    # Crossing a window needs snapshot and restore graphs; one window does not.
    no_state = make({k: v for k, v in TABLE.items() if k not in (SNAP, REST)})
    no_state.admit(spec(prompt=400, images=IMAGES[:1]), 0)
    with pytest.raises(InvalidRequest, match="SNAPSHOT and RESTORE"):
        no_state.admit(spec(prompt=600, images=IMAGES), 0)
    with pytest.raises(InvalidRequest, match="VISION"):
        make(TEXT).admit(spec(prompt=400, images=IMAGES[:1]), 0)
    with pytest.raises(InvalidRequest, match="VISION"):
        make_scheduler("vllm-fcfs", Catalog(TABLE), None, SchedulerConfig()).admit(
            spec(prompt=400, images=IMAGES[:1]), 0)


# ---- step 2: prerequisites, atomic spans, unpopulated windows ------------------------------------
def test_vision_is_a_prerequisite_that_drains_the_window():
    s = make(TABLE)
    s.admit(spec(prompt=300, out=2, images=(ImageSpan(0, 100),)), 0)
    first = s.plan()
    assert first.shape.kind is GraphKind.VISION and first.requires_feedback
    assert first.estimated_duration_ns == 20 * MS  # the plan keeps the vision graph's own T
    assert first.lanes.prompt_tokens.tolist() == [0] and first.lanes.context_tokens.tolist() == [100]
    assert not first.private_state


def test_vision_competes_by_value_per_time():
    """No priority override: a cheap vision graph runs before the running decoder's next step, an
    expensive one waits until the decoder has finished."""
    kinds = []
    for vision_ms in (0.5, 5000.0):
        s = make({**TABLE, V1: vision_ms, V2: vision_ms})
        h = s.admit(spec(prompt=64, out=40), 0)
        fence = 0
        while s.request_row(h).output_done == 0:
            fence += 1
            step(s, s.plan(), fence)
        s.admit(spec(prompt=300, out=2, images=(ImageSpan(0, 100),)), s.now_ns)
        kinds.append(s.plan().shape.kind)
    assert kinds == [GraphKind.VISION, GraphKind.DECODE]


LAYOUT = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 64)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LAYOUT, st.integers(0, 40), st.sampled_from([(64,), (64, 128), (128, 256)]), st.sampled_from([64, 100, 200]))
def test_atomic_spans_never_split_and_prefill_never_passes_an_unpopulated_window(layout, tail, chunks, storage):
    images, cursor = [], 0
    for gap, n in layout:  # gaps and image lengths: sorted, non-overlapping spans
        images.append(ImageSpan(cursor + gap, n, min(n, storage)))
        cursor += gap + n
    prompt = cursor + tail + 1
    vis = [GraphShape(GraphKind.VISION, 1, storage)]
    table = {decode(1): 10, SNAP: 2, REST: 3, vis[0]: 20, **{prefill(c): 10 + c / 8 for c in chunks},
             prefill(chunks[0], 2): 40}
    s = make(table)
    h = s.admit(spec(prompt=prompt, out=2, images=tuple(images)), 0)
    windows = s.vision.requests[h].windows
    populated, consumed, fence = 0, [], 0  # windows populated so far; (start, end) of prompt chunks
    while (p := s.plan()) is not None:
        fence += 1
        if p.shape.kind is GraphKind.VISION:
            populated += 1
        elif p.shape.kind.is_prefill:
            start, end = p.lanes.prompt_start[0], p.lanes.prompt_start[0] + p.lanes.prompt_tokens[0]
            assert not inside(end, images)  # an image is consumed whole by one chunk
            limit = windows[populated].start if populated < len(windows) else prompt
            assert end <= limit  # never past the first dependency of an unpopulated window
            consumed.append((start, end))
        step(s, p, fence)
    assert not s.is_live(h)
    assert consumed[0][0] == 0 and consumed[-1][1] == prompt  # every prompt token exactly once
    assert all(a[1] == b[0] for a, b in zip(consumed, consumed[1:]))
    assert populated == len(windows) and s.vision.rows_free == s.vision.rows_total


@settings(max_examples=200, deadline=None)
@given(LAYOUT, st.integers(0, 20), st.integers(1, 300), st.booleans())
def test_legal_chunk_ends_split_no_span(layout, tail, want, populated):
    s = make(TABLE)
    images, cursor = [], 0
    for gap, n in layout:
        images.append(ImageSpan(cursor + gap, n, 1))
        cursor += gap + n
    h = s.admit(spec(prompt=cursor + tail + 1, images=tuple(images)), 0)
    ws = s.vision.requests[h]
    ends = [0] + [im.end for im in images]
    for start in (e for e in ends if e <= ws.limit(0, populated)):  # reachable cursors
        end = ws.legal_end(start, start + want, 0, populated)
        assert start <= end <= start + want and not inside(end, images)
        assert end <= ws.limit(0, populated)
        # Maximal: no legal end lies beyond it within the request and the limit.
        top = min(start + want, ws.limit(0, populated))
        assert all(inside(e, images) for e in range(end + 1, top + 1))


# ---- step 3: multi-window requests ------------------------------------------------------------------
def test_multi_window_request_completes_with_every_token_once():
    s = make(TABLE)
    h = s.admit(spec(prompt=600, out=5, images=IMAGES), 0)
    rows_total = s.vision.rows_free
    log, _ = drain(s)
    kinds = [p.shape.kind for p, _ in log]
    private = [p.shape.kind for p, _ in log if p.private_state]
    assert kinds.count(GraphKind.VISION) == 3 and private == [GraphKind.SNAPSHOT, GraphKind.RESTORE] * 2
    prefills = [p for p, _ in log if p.shape.kind.is_prefill]
    assert sum(int(p.lanes.prompt_tokens.sum()) for p in prefills) == 600
    # Each boundary: snapshot of the exact consumed state, restore to a fresh epoch, then vision.
    for i, k in enumerate(kinds):
        if log[i][0].private_state and k is GraphKind.SNAPSHOT:
            snap, rest, vis = log[i][0], log[i + 1][0], log[i + 2][0]
            assert snap.private_state and rest.private_state and rest.shape.kind is GraphKind.RESTORE
            assert vis.shape.kind is GraphKind.VISION
            assert snap.lanes.context_tokens.tolist() == snap.lanes.prompt_start.tolist()
            assert snap.lanes.context_tokens[0] in (130, 360)  # the next window's first image
            assert rest.lanes.epoch[0] == snap.lanes.epoch[0] + 1 and vis.lanes.epoch[0] == rest.lanes.epoch[0]
    assert [p.lanes.context_tokens[0] for p, _ in log if p.shape.kind is GraphKind.VISION] == [100, 170, 150]
    tokens = [t for _, out in log for g in out if g.handle == h for t in g.tokens]
    assert len(tokens) == 5  # usage counters of the logical request
    assert not s.is_live(h) and not s.state.captures  # private snapshots are no terminal captures
    assert s.vision.rows_free == rows_total and not s.vision.requests
    assert s.resources.free_slots == s.resources.total_slots and s.resources.free_pages == s.resources.total_pages


def test_one_private_row_reserved_and_released():
    s = make(TABLE, config=SchedulerConfig(window_snapshot_rows=1))
    a = s.admit(spec(prompt=600, out=3, images=IMAGES), 0)
    b = s.admit(spec(prompt=600, out=3, images=IMAGES), 0)
    held, fence = [], 0
    while (p := s.plan()) is not None:
        fence += 1
        step(s, p, fence)
        held.append(sum(ws.row for ws in s.vision.requests.values()))
        assert s.vision.rows_free + held[-1] == 1
    assert max(held) == 1 and not s.is_live(a) and not s.is_live(b) and s.vision.rows_free == 1


def _sim(slots=3):
    catalog = Catalog(TABLE)
    core = SimCore(catalog, FixedCosts(TABLE), seed=1, request_slots=slots)
    sched = Scheduler(catalog, config=SchedulerConfig(request_slots=slots))
    sched.seed_costs({sh: [int(ms * MS)] for sh, ms in TABLE.items()}, 0)
    clock = itertools.count(0, MS)
    return sched, SyncDriver(sched, core, clock=lambda: next(clock))


def _submit(sched, d, prompt, out, images=(), output_len=None):
    h = sched.admit(RequestSpec(prompt, out, images=images), d.now())
    d.core.attach(h, range(prompt), output_len=output_len)
    d.loop.attached(h)
    d.requests[h] = DriverRequest(tuple(range(prompt)), d.now())
    return h


def test_multi_window_request_on_simcore_keeps_its_identity():
    sched, d = _sim()
    h = _submit(sched, d, 600, 6, IMAGES)
    t = _submit(sched, d, 80, 4)
    d.run()
    assert len(d.requests[h].tokens) == 6 and len(d.requests[t].tokens) == 4
    assert [p.shape.kind for p in d.history].count(GraphKind.VISION) == 3
    assert sched.resources.free_slots == 3 and sched.vision.rows_free == sched.vision.rows_total


@pytest.mark.parametrize("stage", range(22))
@pytest.mark.parametrize("in_flight", [False, True])
def test_cancellation_mid_window_loses_nothing_and_leaks_nothing(stage, in_flight):
    sched, d = _sim()
    h = _submit(sched, d, 600, 6, IMAGES)
    other = _submit(sched, d, 200, 5)
    for _ in range(stage):
        d.step()
    if in_flight:
        d.commit()  # cancelled with this frame (often a window operation) still in flight
    d.cancel(h)
    d.run()
    assert len(d.requests[other].tokens) == 5  # the other request loses nothing
    assert not sched.is_live(h) and not sched.vision.requests
    assert sched.vision.rows_free == sched.vision.rows_total
    assert sched.resources.free_slots == 3 and sched.resources.free_pages == sched.resources.total_pages


def test_text_only_requests_behave_as_before():
    """Vision graphs in the catalog change nothing for prompts without images."""
    runs = []
    for table in (TEXT, TABLE):
        s = make(table)
        for n in (70, 300, 130):
            s.admit(spec(prompt=n, out=4, endpoints=(n // 2,)), 0)
        runs.append([(p.shape, p.lanes, p.estimated_duration_ns) for p, _ in drain(s)[0]])
    assert runs[0] == runs[1]


# ---- step 4: the catalog and SimCore ----------------------------------------------------------------
def test_catalog_vision_option_and_simcore_prices_vision_graphs():
    base = Capacities(max_batch=4, prefill_chunks=(64, 256))
    assert not build_catalog(base).of_kind(GraphKind.VISION)
    catalog = build_catalog(Capacities(max_batch=4, prefill_chunks=(64, 256), vision_feature_storage=256))
    assert [s.batch_capacity for s in catalog.of_kind(GraphKind.VISION)] == [1, 2, 4]
    assert {s.token_capacity for s in catalog.of_kind(GraphKind.VISION)} == {256}
    assert catalog.of_kind(GraphKind.SNAPSHOT) and catalog.of_kind(GraphKind.RESTORE)
    model = SyntheticCostModel()
    sched = Scheduler(catalog, config=SchedulerConfig(request_slots=4))
    core = SimCore(catalog, model, request_slots=4)
    h = sched.admit(RequestSpec(300, 2, images=(ImageSpan(0, 200),)), 0)
    core.attach(h, range(300))
    plan = sched.plan()
    assert plan.shape.kind is GraphKind.VISION  # unmeasured: ranks optimistically by its value
    ex = core.execute(plan, 1)
    assert ex.duration_ns == model.duration_ns(plan.shape, [200]) == model.a_pre + model.b_pre * 256
    assert all(not r.tokens and r.prompt_tokens == 0 for r in ex.records)


def test_continuation_includes_the_remaining_image_operations():
    from helios.scheduler.vision_candidates import _chain_ms
    s = make(TABLE)
    costs = cost_lookup(s.costs, 0)
    assert _chain_ms(costs, GraphKind.VISION, s.vision) == 0.0
    assert _chain_ms(costs, GraphKind.RESTORE, s.vision) == 20.0  # the next window's vision graph
    assert _chain_ms(costs, GraphKind.SNAPSHOT, s.vision) == 23.0  # restore, then vision
    assert _chain_ms(cost_lookup(make(TABLE, unmeasured=(V1,)).costs, 0), GraphKind.SNAPSHOT, s.vision) is None


def test_boundary_snapshot_ranks_by_the_continuation_index_of_the_next_chunk():
    """V*T/(T+F): V is the next window's first legal chunk (130 -> 360 at C=256: the 64-token
    chunk cannot take the 120-token image), F = that chunk + restore + vision = 80 + 3 + 20 ms."""
    import math
    from helios.scheduler.service import log_prices
    s = make(TABLE)
    h = s.admit(spec(prompt=600, out=2, images=IMAGES), 0)
    fence = 0
    while not (p := s.plan()).private_state:
        fence += 1
        step(s, p, fence)
    assert p.shape.kind is GraphKind.SNAPSHOT and p.lanes.prompt_start.tolist() == [130]
    t, r = s.requests, s.requests.row(h)
    lp, lo = log_prices(t.log_x[[r]].copy(), t.log_z[[r]].copy(), s._coeff())[:2]
    v = math.exp(lp[0] - p.log_scale) * (360 - 130)
    assert math.isclose(p.lanes.value[0], v * 2.0 / (2.0 + 80.0 + 3.0 + 20.0), rel_tol=1e-9)

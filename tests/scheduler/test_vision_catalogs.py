"""Vision windows on built catalogs (SimCore, synthetic costs): mixed graphs, scored prefill,
restored prefixes and random traffic never split an image, never pass an unpopulated window,
and leak nothing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helios.config import SchedulerConfig
from helios.engine.sim_core import SimCore
from helios.graphs import GraphKind
from helios.prepare import Capacities, build_catalog
from helios.runtime.driver import DriverRequest, SyncDriver
from helios.scheduler import RequestSpec, Scheduler
from helios.sim.synthetic_cost import SyntheticCostModel

from tests.scheduler.conftest import MS, cancel_pick, make, spec
from tests.scheduler.test_vision_windows import IMAGES, TABLE, _submit, drain, inside


# ---- realistic catalogs: mixed graphs, scored prefill, restored prefixes, random traffic ------------
def check_history(history, windows_of, prompt_of):
    """Replays committed plans: no prompt-consuming lane (prefill chunk or mixed prompt row) splits
    an image or passes the first image of a window whose vision graph has not run."""
    populated = {h: 0 for h in windows_of}
    for plan in history:
        if plan.shape.kind is GraphKind.VISION or plan.private_state:
            assert plan.requires_feedback and plan.queue_fences == ()  # submitted work drained first
        if plan.shape.kind is GraphKind.VISION:
            for h in plan.handles:
                populated[h] += 1
            continue
        for lane in plan.lanes:
            if lane.prompt_tokens == 0 or lane.handle not in windows_of:
                continue
            windows, end = windows_of[lane.handle], lane.prompt_start + lane.prompt_tokens
            assert not inside(end, [im for w in windows for im in w.images])
            n = populated[lane.handle]
            assert end <= (windows[n].start if n < len(windows) else prompt_of[lane.handle])


def _catalog_sim(mixed=False, scored=False, slots=4):
    caps = Capacities(max_batch=4, prefill_chunks=(64, 256), mixed_prefill=mixed, scored_prefill=scored,
                      vision_feature_storage=200)
    catalog = build_catalog(caps)
    sched = Scheduler(catalog, config=SchedulerConfig(request_slots=slots))
    clock = itertools.count(0, MS)
    return sched, SyncDriver(sched, SimCore(catalog, SyntheticCostModel(), seed=3, request_slots=slots),
                             clock=lambda: next(clock), depth=2)  # decode frames may queue two deep


@pytest.mark.parametrize("mixed,scored", [(True, False), (False, True)])
def test_mixed_graphs_and_scored_prefill_respect_windows(mixed, scored):
    sched, d = _catalog_sim(mixed, scored)
    windows_of, prompt_of = {}, {}
    for i in range(3):
        h = sched.admit(RequestSpec(600, 8, images=IMAGES, score_prompt=scored and i == 1), d.now())
        d.core.attach(h, range(600))
        d.loop.attached(h)
        d.requests[h] = DriverRequest(tuple(range(600)), d.now())
        windows_of[h], prompt_of[h] = sched.vision.requests[h].windows, 600
    text = _submit(sched, d, 90, 20)
    d.run()
    check_history(d.history, windows_of, prompt_of)
    assert all(len(d.requests[h].tokens) == 8 for h in windows_of) and len(d.requests[text].tokens) == 20
    if mixed:
        assert any(p.shape.kind is GraphKind.MIXED for p in d.history)
    assert sched.resources.free_slots == 4 and sched.vision.rows_free == sched.vision.rows_total


def test_images_inside_a_restored_prefix_need_no_vision():
    s = make(TABLE)
    h = s.admit(spec(prompt=600, out=2, cached_tokens=130, endpoints=(130,), images=IMAGES), 0)
    assert [w.start for w in s.vision.requests[h].windows] == [130, 360]
    log, _ = drain(s)
    kinds = [p.shape.kind for p, _ in log]
    assert kinds[0] is GraphKind.RESTORE and kinds.count(GraphKind.VISION) == 2  # the checkpoint first
    assert sum(int(p.lanes.prompt_tokens.sum()) for p, _ in log) == 600 - 130 and not s.is_live(h)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["image", "text", "cancel", "step", "step"]), st.integers(0, 7),
                          st.integers(1, 40)), min_size=1, max_size=40), st.booleans())
def test_random_traffic_leaks_nothing_and_loses_no_request(ops, mixed):
    sched, d = _catalog_sim(mixed, slots=3)
    handles, windows_of, prompt_of = [], {}, {}
    for op, pick, n in ops:
        if op == "image":
            images = IMAGES[: 1 + n % 4]
            prompt = images[-1].end + n
            h = _submit(sched, d, prompt, 1 + n % 9, images, output_len=n % 7 + 1)
            windows_of[h], prompt_of[h] = sched.vision.requests[h].windows, prompt
            handles.append(h)
        elif op == "text":
            handles.append(_submit(sched, d, 10 + 7 * n, 1 + n % 9, output_len=n % 5 + 1))
        elif op == "cancel":
            cancel_pick(d, handles, pick)
        else:
            d.step()
    d.run()
    check_history(d.history, windows_of, prompt_of)
    assert all(d.requests[h].finish is not None for h in handles) and not any(sched.is_live(h) for h in handles)
    assert sched.resources.free_slots == 3 and sched.resources.free_pages == sched.resources.total_pages
    assert sched.vision.rows_free == sched.vision.rows_total and not sched.vision.requests
    assert not sched.state.captures and not sched.state.restoring

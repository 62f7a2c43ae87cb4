"""Completion's shortcuts change nothing: the same operations with the shortcuts turned off
(every lane and participant rechecked, participants scattered by row) leave the same state."""

import random

import pytest

import helios.scheduler.execution as execution
from helios.config import SchedulerConfig
from helios.errors import StalePlan
from helios.scheduler import CompletionRecord, ExecutionTiming, FinishReason
from helios.scheduler.queue import Frame

from conftest import MS, decode, digest, make, prefill, spec

TABLE = {decode(1): 8.0, decode(2): 8.5, decode(4): 9.0, prefill(64): 6.0, prefill(64, 2): 7.0,
         prefill(64, 4): 9.0}
CONFIG = SchedulerConfig(request_slots=4, kv_pages=256, page_tokens=16, max_context=512)
# Frames overlap (two commits before a completion) and requests are short, so lanes finish or
# are cancelled while another frame still holds them.
KINDS = ("admit", "commit", "commit", "complete", "eos", "cancel", "publish")


def run(ops):
    """Apply `ops`; returns the state digest and the published tokens after each one."""
    s = make(TABLE, config=CONFIG)
    handles, inflight, fence, last_out, trail = [], [], 0, [], []
    for op, arg in ops:
        if op == "admit":
            handles.append(s.admit(spec(prompt=20 + 30 * arg, out=1 + arg % 4), s.now_ns))
        elif op == "commit" and (plan := s.plan()) is not None:
            fence += 1
            s.commit(plan, fence)
            inflight.append((fence, plan))
        elif op in ("complete", "eos") and inflight:
            f, plan = inflight.pop(0)
            s.advance_to(s.now_ns + (arg + 1) * MS)
            records = [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (3,) * l.output_rows,
                                        op == "eos" and i == arg % len(plan.lanes) and l.output_rows > 0)
                       for i, l in enumerate(plan.lanes)]
            last_out = [(g, f) for g in s.complete(f, records, ExecutionTiming(((arg + 1) * MS,), wall_ns=MS))]
            trail.append(last_out)
        elif op == "cancel" and handles:
            s.cancel(handles[arg % len(handles)], s.now_ns)
        elif op == "publish":
            for g, f in last_out[: arg + 1]:
                if g.tokens:
                    s.published_output(g.handle, f)
        trail.append(digest(s))
    return trail


def checked_frame(*args):
    """A Frame whose completion takes every general path."""
    frame = Frame(*args)
    frame.turnover = None
    frame.participant_rows = frame.participant_rows.copy()
    return frame


@pytest.mark.parametrize("seed", range(8))
def test_shortcuts_leave_the_same_state(seed):
    rng = random.Random(seed)
    for _ in range(25):  # seeded sequences: overlapping frames are rare in shrunk examples
        ops = [(rng.choice(KINDS), rng.randrange(8)) for _ in range(60)]
        fast = run(ops)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(execution, "Frame", checked_frame)
            general = run(ops)
        assert fast == general, ops


def test_turnover_moves_on_finish_cancel_and_rebind():
    s = make(TABLE, config=CONFIG)
    a, b = s.admit(spec(out=1), 0), s.admit(spec(out=8), 0)
    t = s.requests
    start = t.turnover
    s.cancel(b, 0)
    assert t.turnover > start
    start = t.turnover
    t.rebind(t.row(a))
    assert t.turnover > start
    start = t.turnover
    t.set_finish(t.row(a), FinishReason.LENGTH)
    assert t.turnover > start


def test_commit_rejects_a_plan_whose_request_retired():
    s = make(TABLE, config=CONFIG)
    a, b = s.admit(spec(), 0), s.admit(spec(), 0)
    plan = s.plan()
    gone = plan.handles[-1]
    s.cancel(gone, 0)  # nothing in flight: the request retires at once
    assert gone not in s.requests
    before = digest(s)
    with pytest.raises(StalePlan, match=f"request {gone} is no longer runnable"):
        s.commit(plan, 1)
    assert digest(s) == before

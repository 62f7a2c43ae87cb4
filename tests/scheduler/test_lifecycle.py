"""Request lifecycle: cancellation at every phase, slot reuse, and invariants under bad input."""

import pytest
from hypothesis import given, settings, strategies as st

from helios.config import SchedulerConfig
from helios.errors import InvalidCompletion, UnknownRequest
from helios.scheduler import CompletionRecord, ExecutionTiming, FinishReason

from conftest import MS, Driver, FixedCosts, decode, digest, make, prefill, records_for, spec, step

TABLE = {decode(1): 8.0, decode(2): 8.5, decode(4): 9.0, prefill(64): 6.0, prefill(256): 10.0,
         prefill(64, 2): 7.0, prefill(64, 4): 9.0}
CONFIG = SchedulerConfig(request_slots=2, kv_pages=64, page_tokens=16, max_context=1024)


def fresh():
    s = make(TABLE, config=CONFIG)
    return s, Driver(s, FixedCosts(TABLE))


def assert_all_free(s):
    assert s.resources.free_slots == CONFIG.request_slots
    assert s.resources.free_pages == CONFIG.kv_pages


def reuse_slot(s, d):
    h = s.admit(spec(prompt=64, out=3), s.now_ns)
    d.run(10)
    assert s.requests.get(h) is None  # finished and retired
    assert_all_free(s)


def test_cancel_before_residency_releases_nothing_and_forgets_the_request():
    s, d = fresh()
    h = s.admit(spec(), 0)
    s.cancel(h, 0)
    assert s.plan() is None and h not in s.requests
    reuse_slot(s, d)


def test_cancel_during_an_in_flight_prefill_keeps_resources_until_the_fence():
    s, d = fresh()
    h = s.admit(spec(prompt=500), 0)
    p = s.plan()
    s.commit(p, 1)
    s.cancel(h, 0)
    assert s.plan() is None  # cancellation stops selection immediately
    assert s.resources.free_slots == 1  # the slot stays owned through the last submitted fence
    s.complete(1, records_for(p), ExecutionTiming((MS,)))
    assert_all_free(s)
    reuse_slot(s, d)


def test_cancel_between_prefill_chunks():
    s, d = fresh()
    h = s.admit(spec(prompt=500), 0)
    d.run_one()
    s.cancel(h, s.now_ns)
    assert_all_free(s)
    reuse_slot(s, d)


def test_cancel_during_decode_with_two_frames_in_flight():
    s, d = fresh()
    h = s.admit(spec(prompt=64, out=100), 0)
    d.run_one()
    p1 = s.plan()
    s.commit(p1, 10)
    p2 = s.plan()
    s.commit(p2, 11)
    s.cancel(h, s.now_ns)
    s.complete(10, [CompletionRecord(h, p1.lanes[0].epoch, 0, ())], ExecutionTiming((MS,)))
    assert s.resources.free_slots == 1
    out = s.complete(11, records_for(p2), ExecutionTiming((MS,)))
    assert out == []  # a cancelled request publishes nothing more
    assert_all_free(s)
    reuse_slot(s, d)


def test_cancel_after_finish_is_a_no_op_and_unknown_handles_raise():
    s, d = fresh()
    h = s.admit(spec(prompt=64, out=2), 0)
    d.run(5)
    s.cancel(h, s.now_ns)
    s.published_output(h, 1)
    with pytest.raises(UnknownRequest):
        s.cancel(999, s.now_ns)


def test_finish_reasons_eos_length_and_context():
    s, d = fresh()
    a = s.admit(spec(prompt=64, out=50), 0)
    b = s.admit(spec(prompt=64, out=2), 0)
    finishes = {}
    for _ in range(10):
        plan = s.plan()
        if plan is None:
            break
        d.fence += 1
        for g in step(s, plan, d.fence, eos={a} if d.fence == 3 else ()):
            if g.finish:
                finishes[g.handle] = g.finish
    assert finishes == {a: FinishReason.EOS, b: FinishReason.LENGTH}
    s2 = make(TABLE, config=SchedulerConfig(request_slots=2, kv_pages=64, max_context=70))
    c = s2.admit(spec(prompt=64, out=50), 0)
    d2 = Driver(s2, FixedCosts(TABLE))
    d2.run(20)
    assert c not in s2.requests and s2.resources.free_slots == 2


# ---- property: malformed, stale or duplicate completions change nothing ---------------------

def corrupt(plan, kind, records):
    r = list(records)
    lane = plan.lanes[0]
    if kind == "wrong_epoch":
        r[0] = CompletionRecord(lane.handle, lane.epoch + 1, lane.prompt_tokens, r[0].tokens)
    elif kind == "wrong_handle":
        r[0] = CompletionRecord(lane.handle + 1000, lane.epoch, lane.prompt_tokens, r[0].tokens)
    elif kind == "prompt_mismatch":
        r[0] = CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens + 1, r[0].tokens)
    elif kind == "too_many_tokens":
        r[0] = CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, r[0].tokens + (1, 2))
    elif kind == "negative_token":
        r[0] = CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, (-1,) * lane.output_rows)
    elif kind == "missing_lane":
        r = r[1:] if len(r) > 1 else []
    elif kind == "extra_lane":
        r = r + [r[0]]
    elif kind == "eos_without_token":
        r[0] = CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, (), True)
    return r


KINDS = ["wrong_epoch", "wrong_handle", "prompt_mismatch", "too_many_tokens", "negative_token",
         "missing_lane", "extra_lane", "eos_without_token", "bad_timing", "stale_fence", "duplicate"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 3)), min_size=1, max_size=12),
       st.integers(1, 5))
def test_malformed_stale_or_duplicate_completion_raises_and_changes_nothing(attacks, n):
    s = make(TABLE, config=SchedulerConfig(request_slots=4, kv_pages=512, max_context=1024))
    handles = [s.admit(spec(prompt=64 + 40 * i, out=4), 0) for i in range(n)]
    fence = 0
    done_fences = []
    for kind, delay in attacks:
        plan = s.plan()
        if plan is None:
            break
        fence += 1
        s.commit(plan, fence)
        s.advance_to(s.now_ns + (delay + 1) * MS)
        good = records_for(plan)
        before = digest(s)
        with pytest.raises(InvalidCompletion):
            if kind == "bad_timing":
                s.complete(fence, good, ExecutionTiming((-5,)))
            elif kind == "stale_fence":
                s.complete(fence + 100, good, ExecutionTiming((MS,)))
            elif kind == "duplicate" and done_fences:
                s.complete(done_fences[-1], good, ExecutionTiming((MS,)))
            elif kind == "duplicate":
                s.complete(fence - 1, good, ExecutionTiming((MS,)))
            else:
                bad = corrupt(plan, kind, good)
                if bad == good:
                    raise InvalidCompletion("corruption did not apply")
                s.complete(fence, bad, ExecutionTiming((MS,)))
        assert digest(s) == before
        s.complete(fence, good, ExecutionTiming(((delay + 1) * MS,)))
        done_fences.append(fence)
        for h in handles:
            if h in s.requests and s.requests[h].output_done:
                s.published_output(h, fence)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "step", "cancel", "wait"]), st.integers(0, 20)),
                min_size=1, max_size=60))
def test_no_lost_requests_and_no_leaked_slots_or_pages(ops):
    config = SchedulerConfig(request_slots=3, kv_pages=96, page_tokens=16, max_context=512)
    s = make(TABLE, config=config)
    d = Driver(s, FixedCosts(TABLE))
    admitted = []
    for op, arg in ops:
        if op == "admit":
            admitted.append(s.admit(spec(prompt=16 + 20 * arg, out=1 + arg % 5), s.now_ns))
        elif op == "cancel" and admitted:
            s.cancel(admitted[arg % len(admitted)], s.now_ns)
        elif op == "wait":
            s.advance_to(s.now_ns + arg * MS)
        else:
            d.run(arg % 4 + 1)
        used = int(s.requests.pages.sum())  # free rows hold no pages
        assert used + s.resources.free_pages == config.kv_pages
    d.run(10_000)
    assert not s.requests  # every request finished or was cancelled: none lost or stuck
    assert s.resources.free_slots == config.request_slots and s.resources.free_pages == config.kv_pages

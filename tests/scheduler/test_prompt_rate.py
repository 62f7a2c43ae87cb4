"""The mean-rate laws before a request has history (StudyConfig.prompt_rate_law, docs/scheduling-utility.md §6).

A request's starting rate counts as one adaptation time of history, and its rate is its mean progress
toward its first token since admission (a prompt of P tokens is worth one output token):
x = (x0 tau + p/P) / (tau + W). Unserved, its price grows as (tau + W) / tau, without bound but
linearly. PROMPT_PHASE keeps the mean until the request's first output token, UNTIL_SERVED until its
first service; then the one EWMA continues from the same rate. The presets keep the table's EWMA.
"""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helios.config import PromptRateLaw, StudyConfig, study_preset
from helios.scheduler import ExecutionTiming
from helios.scheduler.planning import project_rates
from helios.scheduler.requests import DECODE, PREFILL
from helios.scheduler.service import ewma_log, mean_rate_log

from conftest import MS, Driver, FixedCosts, decode, make, prefill, records_for, spec
from conftest import configs

TAU = 100.0
TABLE = {decode(1): 10.0, decode(2): 11.0, decode(4): 12.0, prefill(64): 8.0, prefill(256): 20.0}
MEAN = configs(prompt_rate_law=PromptRateLaw.PROMPT_PHASE)
UNTIL = configs(prompt_rate_law=PromptRateLaw.UNTIL_SERVED)
FIRST = configs(prompt_rate_law=PromptRateLaw.FIRST_OUTPUT)
OUTPUT = configs(prompt_rate_law=PromptRateLaw.OUTPUT_EWMA)


@settings(deadline=None, max_examples=60)
@given(st.floats(-8.0, 3.0), st.lists(st.tuples(st.floats(0.5, 500.0), st.floats(0.0, 50.0)), max_size=12))
def test_the_mean_law_is_the_closed_form_mean_with_one_tau_of_prior(log_x0, intervals):
    log_x, window = log_x0, TAU
    mass, elapsed = math.exp(log_x0) * TAU, TAU
    for d, s in intervals:
        log_x = float(mean_rate_log(log_x, window, d, s))
        window += d
        mass, elapsed = mass + s, elapsed + d
        assert log_x == pytest.approx(math.log(mass / elapsed), rel=1e-9, abs=1e-9)


@settings(deadline=None, max_examples=40)
@given(st.floats(-8.0, 3.0), st.lists(st.floats(0.5, 500.0), min_size=1, max_size=12))
def test_an_unserved_prompt_price_grows_linearly_and_without_bound(log_x0, waits):
    """f/x grows by exactly (tau + W) / tau after W unserved ms: unbounded, never exponential."""
    log_x, window = log_x0, TAU
    for d in waits:
        before = log_x
        log_x = float(mean_rate_log(log_x, window, d, 0.0))
        window += d
        assert log_x < before
    assert log_x0 - log_x == pytest.approx(math.log(window / TAU), rel=1e-9)
    for wait in (1e6, 1e12):  # no bound on the growth
        assert float(mean_rate_log(log_x, window, wait, 0.0)) == pytest.approx(log_x - math.log((window + wait) / window))


def _served(s, plan, handle):
    """Normalized service of `handle` in `plan`, as the EWMA counts it (commit-time references)."""
    norm = s._normalizers()
    return sum(norm.normalized_service(int(lane.prompt_tokens), int(lane.output_rows))
               for lane in plan.lanes if lane.handle == handle)


def _progress(s, plan, handle):
    """Progress of `handle` toward its first token in `plan`, as the mean law counts it."""
    length = s.request_row(handle).spec.prompt_tokens
    return sum(int(lane.prompt_tokens) / length + int(lane.output_rows) for lane in plan.lanes if lane.handle == handle)


def _prompt_behind_two_streams(policy, prefill_ms):
    """Two streams decoding, then a 600-token prompt admitted; the prefill graphs take `prefill_ms`
    (64- and 256-token chunks) so that decoding wins some frames first."""
    slow = {**TABLE, prefill(64): prefill_ms[0], prefill(256): prefill_ms[1]}
    s = make(slow, policy=policy)
    d = Driver(s, FixedCosts(slow))
    for _ in range(2):
        s.admit(spec(prompt=64, out=400), 0)
    d.run(4)
    return s, d, s.admit(spec(prompt=600, out=8), s.now_ns)


def _projected_log_x(s, h, law=PromptRateLaw.EWMA):
    """`h`'s log rate as planning projects it through the queued frames."""
    rows = s.requests.live_rows()
    return project_rates(s.requests, rows, s.queue, TAU, law)[0][list(rows).index(s.requests.row(h))]


def _step(s, d, h):
    """One frame: the plan, its duration in ms, and `h`'s first-token progress and EWMA service in it."""
    plan = d.run_one()
    _, start, end = d.history[-1]
    return (end - start) / MS, _progress(s, plan, h), _served(s, plan, h)


def test_a_prompt_phase_mean_lasts_until_the_first_output_then_the_ewma():
    s, d, h = _prompt_behind_two_streams(MEAN, (40.0, 100.0))
    mass, elapsed = math.exp(s.request_row(h).log_x) * TAU, TAU
    unserved = served_frames = 0
    while s.request_row(h).phase.value == PREFILL:
        ms, progress, _ = _step(s, d, h)
        mass, elapsed = mass + progress, elapsed + ms
        unserved += progress == 0
        served_frames += progress > 0
        assert s.request_row(h).log_x == pytest.approx(math.log(mass / elapsed), rel=1e-9)
    assert unserved and served_frames >= 2  # it waited, and took several chunks
    assert s.request_row(h).phase.value == DECODE
    entered = s.request_row(h).log_x
    ms, _, served = _step(s, d, h)
    # A decoder again: the one EWMA, from the rate the prompt phase left.
    assert s.request_row(h).log_x == pytest.approx(float(ewma_log(entered, ms, served, TAU)), rel=1e-9)


def _mean_of_output(s, h):
    """FIRST_OUTPUT's x = (x0 tau + o) / (tau + W), frame by frame."""
    mass, elapsed = math.exp(s.request_row(h).log_x) * TAU, TAU

    def after(before, ms, first):
        nonlocal mass, elapsed
        mass, elapsed = mass + (1.0 if first else 0.0), elapsed + ms
        return math.log(mass / elapsed)
    return after


def _ewma_of_output(s, h):
    """OUTPUT_EWMA's x: the table's EWMA of output tokens (an unserved frame divides x by e^(d/tau))."""
    return lambda before, ms, first: float(ewma_log(before, ms, 1.0 if first else 0.0, TAU))


@pytest.mark.parametrize("policy, law", [(FIRST, _mean_of_output), (OUTPUT, _ewma_of_output)],
                         ids=["first_output", "output_ewma"])
def test_only_the_first_token_counts_so_chunks_never_lower_the_price(policy, law):
    """FIRST_OUTPUT and OUTPUT_EWMA count what the user received. Through the prefill the price grows
    exactly as an unserved prompt's (linearly on the mean, by e^(d/tau) a frame on the EWMA), chunks or
    not; the interval that finishes the prompt counts its first token; then the EWMA."""
    s, d, h = _prompt_behind_two_streams(policy, (40.0, 100.0))
    expected = law(s, h)
    chunks = 0
    while s.request_row(h).phase.value == PREFILL:
        before = s.request_row(h).log_x
        ms, progress, _ = _step(s, d, h)
        chunks += progress > 0
        first = s.request_row(h).phase.value == DECODE  # this frame published the first token
        assert s.request_row(h).log_x == pytest.approx(expected(before, ms, first), rel=1e-9)
        if not first:
            assert s.request_row(h).log_x < before  # a chunk lowered nothing: the price kept growing
    assert chunks >= 2  # several chunks, none of them counted
    entered = s.request_row(h).log_x
    ms, _, served = _step(s, d, h)
    assert s.request_row(h).log_x == pytest.approx(float(ewma_log(entered, ms, served, TAU)), rel=1e-9)


def test_on_output_ewma_the_projection_of_a_queued_chunk_counts_no_service():
    """Planning projects a queued prefill frame as completion will count it: no service for the chunk."""
    s = make(TABLE, policy=OUTPUT)
    d = Driver(s, FixedCosts(TABLE))
    h = s.admit(spec(prompt=3000, out=8), 0)
    plan = s.plan()
    assert plan.shape.kind.name == "PREFILL"
    d.fence += 1
    s.commit(plan, d.fence)
    before = s.request_row(h).log_x
    projected = _projected_log_x(s, h, OUTPUT[1].prompt_rate_law)
    ns = plan.estimated_duration_ns
    assert float(projected) == pytest.approx(before - ns / MS / TAU, rel=1e-12)
    s.advance_to(s.now_ns + ns)
    s.complete(d.fence, records_for(plan), ExecutionTiming((ns,)))
    assert s.request_row(h).log_x == pytest.approx(float(projected), rel=1e-12)


@pytest.mark.parametrize("policy, chunk_lowers_price", [(FIRST, False), (OUTPUT, False), (MEAN, True)],
                         ids=["first_output", "output_ewma", "prompt_phase"])
def test_on_first_output_a_chunk_does_not_demote_a_prompt_below_its_twin(policy, chunk_lowers_price):
    """The PROMPT_PHASE behaviour FIRST_OUTPUT removes: two prompts admitted together, one served a chunk
    (batch-1 prefill graphs only), the other not. On PROMPT_PHASE the served one's credited progress lowers
    its price below its twin's; on FIRST_OUTPUT their prices stay equal."""
    s = make(TABLE, policy=policy)
    d = Driver(s, FixedCosts(TABLE))
    a, b = (s.admit(spec(prompt=3000, out=8), 0) for _ in range(2))
    d.run_one()
    served = [h for h in (a, b) if s.request_row(h).prompt_done > 0]
    assert len(served) == 1
    other = b if served[0] == a else a
    x_served, x_other = s.request_row(served[0]).log_x, s.request_row(other).log_x
    if chunk_lowers_price:
        assert x_served > x_other  # higher rate: lower price f/x
    else:
        assert x_served == pytest.approx(x_other, rel=1e-12)


def test_the_phase_transition_itself_moves_no_price_on_the_mean_law():
    """The interval that finishes the prompt is counted on the mean law (chunk and first token);
    leaving the prompt phase then changes nothing until the next actual service."""
    s = make(TABLE, policy=MEAN)
    h = s.admit(spec(prompt=64, out=8), 0)
    x0 = s.request_row(h).log_x
    plan = s.plan()
    s.commit(plan, 1)
    s.advance_to(8 * MS)
    s.complete(1, records_for(plan), ExecutionTiming((8 * MS,)))
    row = s.request_row(h)
    assert row.phase.value == DECODE
    # The whole 64-token prompt (one output token's worth) and the first token: 2 units in 8 ms.
    assert _progress(s, plan, h) == pytest.approx(2.0)
    assert row.log_x == pytest.approx(math.log((math.exp(x0) * TAU + 2.0) / (TAU + 8.0)))
    assert s.requests.mean_law_rows == 0 and np.isnan(s.requests.rate_window_ms[s.requests.row(h)])
    s.plan()  # planning projects copies only
    assert s.request_row(h).log_x == row.log_x


def test_the_projection_counts_a_waiting_prompt_on_the_mean_law_as_completion_will():
    slow = {**TABLE, prefill(64): 400.0, prefill(256): 900.0}  # the prompt loses to decoding for a while
    s = make(slow, policy=MEAN)
    d = Driver(s, FixedCosts(slow))
    for _ in range(2):
        s.admit(spec(prompt=64, out=400), 0)
    d.run(4)
    h = s.admit(spec(prompt=256, out=8), s.now_ns)
    plan = s.plan()
    assert plan.shape.kind.name == "DECODE"
    d.fence += 1
    s.commit(plan, d.fence)
    projected = _projected_log_x(s, h)
    ns = plan.estimated_duration_ns
    s.advance_to(s.now_ns + ns)
    s.complete(d.fence, records_for(plan), ExecutionTiming((ns,)))
    assert s.request_row(h).log_x == pytest.approx(float(projected), rel=1e-12)
    assert s.request_row(h).phase.value == PREFILL  # still waiting: the law still applies


def test_equal_prompt_histories_give_equal_prices_on_the_mean_law():
    s = make(TABLE, policy=MEAN)
    d = Driver(s, FixedCosts(TABLE))
    s.admit(spec(prompt=64, out=400), 0)
    d.run(3)
    a, b = (s.admit(spec(prompt=5000, out=8), s.now_ns) for _ in range(2))
    d.run(3)  # both wait, or one is served: compare only while their histories are equal
    ra, rb = s.request_row(a), s.request_row(b)
    if ra.prompt_done == rb.prompt_done:
        assert ra.log_x == rb.log_x


def test_a_mean_until_served_lasts_until_the_first_chunk_then_the_ewma():
    s, d, h = _prompt_behind_two_streams(UNTIL, (400.0, 900.0))
    mass, elapsed = math.exp(s.request_row(h).log_x) * TAU, TAU
    waited = 0
    while True:
        ms, progress, _ = _step(s, d, h)
        mass, elapsed = mass + progress, elapsed + ms
        assert s.request_row(h).log_x == pytest.approx(math.log(mass / elapsed), rel=1e-9)
        if progress:
            break
        waited += 1
    assert waited and s.request_row(h).phase.value == PREFILL  # waited, then took a first chunk
    assert s.requests.mean_law_rows == 0
    while s.request_row(h).phase.value == PREFILL:  # history from here on: the one EWMA, served or not
        before = s.request_row(h).log_x
        ms, _, served = _step(s, d, h)
        assert s.request_row(h).log_x == pytest.approx(float(ewma_log(before, ms, served, TAU)), rel=1e-9)


@pytest.mark.parametrize("policy", [MEAN, UNTIL, FIRST], ids=["prompt_phase", "until_served", "first_output"])
def test_a_cancelled_or_finished_prompt_leaves_no_row_on_the_mean_law(policy):
    s = make(TABLE, policy=policy)
    d = Driver(s, FixedCosts(TABLE))
    hs = [s.admit(spec(prompt=300, out=4), 0) for _ in range(4)]
    s.cancel(hs[0], 0)
    d.run(60)
    assert not any(s.is_live(h) for h in hs)  # every one retired: cancelled or finished
    assert s.requests.mean_law_rows == 0


def test_only_a_mean_law_puts_rows_on_it_and_the_presets_keep_the_ewma():
    assert study_preset("balanced").prompt_rate_law is PromptRateLaw.EWMA
    assert study_preset("throughput").prompt_rate_law is PromptRateLaw.EWMA
    s = make(TABLE)
    h = s.admit(spec(prompt=64), 0)
    assert s.requests.mean_law_rows == 0 and np.isnan(s.requests.rate_window_ms[s.requests.row(h)])
    m = make(TABLE, policy=MEAN)
    h = m.admit(spec(prompt=64), 0)
    assert m.requests.mean_law_rows == 1 and m.requests.rate_window_ms[m.requests.row(h)] == TAU
    m.cancel(h, 1)  # leaving by cancellation ends the law too
    assert m.requests.mean_law_rows == 0
    o = make(TABLE, policy=OUTPUT)
    h = o.admit(spec(prompt=64), 0)
    assert o.requests.mean_law_rows == 0 and np.isnan(o.requests.rate_window_ms[o.requests.row(h)])
    assert StudyConfig(prompt_rate_law="output_ewma").prompt_rate_law is PromptRateLaw.OUTPUT_EWMA

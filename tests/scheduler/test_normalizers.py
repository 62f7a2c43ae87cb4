"""Phase normalizers and priced decoder stalls (issue 12, docs/scheduling-utility.md).

Rates count machine time: an output token counts one, a prompt token r_d/r_p of one (the ratio of
the phases' measured reference rates). A phase transition or a new measurement keeps each request's price until actual
service changes it; the stall of an excluded decoder costs the growth of its own prices over T.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helios.scheduler import ExecutionTiming
from helios.scheduler.requests import DECODE, PREFILL
from helios.scheduler.service import PHYSICAL, Normalizers, ewma_log, reference_normalizers
from helios.scheduler.utility import stall_cost, stall_growth

from conftest import MS, Driver, FixedCosts, decode, make, prefill, records_for, spec, step
from conftest import configs

TAU = 100.0
TABLE = {decode(1): 10.0, decode(2): 11.0, decode(4): 12.0, prefill(64): 8.0, prefill(256): 20.0,
         prefill(1024): 80.0}
R_PREFILL = max(64 / 8.0, 256 / 20.0, 1024 / 80.0)  # tokens/ms: the fastest per-row prompt rate
R_DECODE = 1 / 10.0  # tokens/ms: one token per fastest delivery graph


def test_reference_rates_come_from_the_measured_catalog():
    assert reference_normalizers([], []) == PHYSICAL  # nothing measured: tokens/ms are the unit
    n = reference_normalizers([(64, 8.0), (256, 20.0), (1024, 80.0)], [(1, 10.0), (4, 12.0)])
    assert n.log_prefill == pytest.approx(math.log(R_PREFILL))
    assert n.log_decode == pytest.approx(math.log(R_DECODE))
    assert n.normalized_service(128, 2) == pytest.approx(128 * R_DECODE / R_PREFILL + 2)


def test_the_scheduler_records_the_commit_time_normalizers_on_each_frame():
    s = make(TABLE)
    s.admit(spec(prompt=64), 0)
    s.commit(s.plan(), 1)
    frame = s.queue.frames[0]
    assert frame.normalizers.log_prefill == pytest.approx(math.log(R_PREFILL))
    assert frame.normalizers.log_decode == pytest.approx(math.log(R_DECODE))
    assert make(TABLE, policy=configs(phase_normalized=False))._normalizers() == PHYSICAL


@settings(deadline=None, max_examples=40)  # timing-free: a loaded machine must not fail it
@given(st.integers(1, 3000), st.floats(2.0, 400.0), st.floats(-3.0, 3.0))
def test_price_is_preserved_across_the_phase_transition(prompt, ms, start):
    """The prompt's last chunk moves the request to decode. Its rate is the EWMA of its normalized
    service over that interval, nothing more: the transition itself moves no price."""
    s = make(TABLE)
    h = s.admit(spec(prompt=prompt, out=8), 0)
    fence = 0
    while True:
        plan = s.plan()
        assert plan.shape.kind.is_prefill  # alone: only its prompt can run
        last = plan.lanes.prompt_tokens[0] == s.request_row(h).prompt_left
        if last:
            s.requests.log_x[s.requests.row(h)] = start  # any history before the last chunk
        fence += 1
        s.commit(plan, fence)
        norm = s.queue.frames[-1].normalizers  # the frame counts its service in its commit-time references
        ns = int(ms * MS)
        s.advance_to(s.now_ns + ns)
        s.complete(fence, records_for(plan), ExecutionTiming((ns,)))
        if last:
            break
        assert s.request_row(h).phase.value == PREFILL
    row = s.request_row(h)
    assert row.phase.value == DECODE
    served = norm.normalized_service(int(plan.lanes.prompt_tokens[0]), 1)  # the chunk and the first token
    assert row.log_x == pytest.approx(float(ewma_log(start, ns / MS, served, TAU)), rel=1e-12, abs=1e-12)
    # Planning as a decoder projects copies; the stored history does not move.
    s.plan()
    assert s.request_row(h).log_x == row.log_x


def test_a_normalizer_change_keeps_every_price():
    s = make(TABLE)
    hs = [s.admit(spec(prompt=300, out=8), 0) for _ in range(3)]
    d = Driver(s, FixedCosts(TABLE))
    d.run(3)
    before = [s.request_row(h).log_x for h in hs]
    # A faster prefill measurement raises the prefill reference rate.
    s.seed_costs({prefill(1024): [int(40.0 * MS)] * 9, decode(1): [int(7.0 * MS)] * 9}, s.now_ns)
    assert s._normalizers().log_prefill > math.log(R_PREFILL)
    assert s._normalizers().log_decode > math.log(R_DECODE)
    assert [s.request_row(h).log_x for h in hs] == before  # x, and so every price, unchanged


def test_a_fresh_prefill_does_not_enter_decode_looking_over_served():
    """Two decoders have shared the machine; a third request's prompt has just been prefilled. With
    physical rates its token rate is that of a prefill (~100x a decoder's), so its price is the
    lowest; with shares of the machine it enters decode comparable to the others."""
    def rates(normalized):
        s = make(TABLE, policy=configs(phase_normalized=normalized))
        old = [s.admit(spec(prompt=64, out=400), 0) for _ in range(2)]
        d = Driver(s, FixedCosts(TABLE))
        for _ in range(30):
            d.run_one()
        new = s.admit(spec(prompt=1024, out=400), s.now_ns)
        while s.request_row(new).phase.value == PREFILL:
            d.run_one()
        return [s.request_row(h).log_x for h in old], s.request_row(new).log_x

    old, new = rates(False)
    assert new - max(old) > math.log(20)  # physical: the newcomer looks 20x+ over-served
    old, new = rates(True)
    assert abs(new - np.mean(old)) < math.log(4)


def test_stall_cost_grows_as_an_unserved_price_does():
    # e^(T/tau) - 1: the growth of an unserved request's fairness and delivery prices over T.
    assert stall_growth(100.0, 100.0) == pytest.approx(math.e - 1)
    assert stall_cost(2.0, 50.0, 100.0) == pytest.approx(2.0 * math.expm1(0.5) / 50.0)
    assert math.isfinite(stall_growth(1e9, 1.0))  # capped, not overflowing


# Larger chunks are more efficient per token (a fixed per-graph overhead), as on real GPUs.
STALL_TABLE = {decode(1): 10.0, decode(2): 11.0, decode(4): 12.0, decode(8): 13.0, decode(16): 15.0,
               prefill(64): 10.0, prefill(256): 25.0, prefill(1024): 80.0}


def _long_prompt_among_decoders(policy, n=4):
    """n decoders stream; a 4000-token prompt arrives. Returns the prompt's chunk sizes and the
    longest gap any decoder saw."""
    s = make(STALL_TABLE, policy=policy)
    hs = [s.admit(spec(prompt=64, out=1000), 0) for _ in range(n)]
    d = Driver(s, FixedCosts(STALL_TABLE))
    for _ in range(12):
        d.run_one()
    prompt = s.admit(spec(prompt=4000, out=8), s.now_ns)
    chunks = []
    for _ in range(80):
        p = d.run_one()
        if p.shape.kind.is_prefill:
            chunks.append(p.shape.token_capacity)
    return prompt in d.published, chunks, max(np.diff(d.published[h]).max() for h in hs if len(d.published.get(h, ())) > 1) / MS


@pytest.mark.parametrize("n", [4, 16])
def test_priced_stalls_keep_decoder_gaps_shorter(n):
    # tau = 30 ms against 80-ms chunks: graphs of a few tau, as on the simulated GPU (docs). Section 4's
    # price growth alone: the deferred step (on by default) also shortens the gaps, and at 16
    # decoders it keeps them as short without the growth (with it on: 245 ms with the growth, 243 without).
    alone = dict(adaptation_ms=30.0, deferred_step_pricing=False)
    served, _, gap = _long_prompt_among_decoders(configs(**alone), n)
    served_off, _, gap_off = _long_prompt_among_decoders(configs(**alone, stall_pricing=False), n)
    assert served and served_off  # the prompt's first token comes out either way
    assert gap < gap_off


def test_zero_fairness_coefficients_remove_the_stall_price():
    # Nothing grows without f and g, so nothing is charged (and, as the spec warns, nothing then
    # keeps the prompt from starving behind beta-valued output tokens).
    zero = configs(token_fairness=0.0, delivery_fairness=0.0, adaptation_ms=30.0)
    assert _long_prompt_among_decoders(zero) == _long_prompt_among_decoders(
        configs(token_fairness=0.0, delivery_fairness=0.0, adaptation_ms=30.0, stall_pricing=False))


def test_the_off_by_default_stall_bound_drops_long_chunks_near_an_old_decoder():
    served, chunks, gap = _long_prompt_among_decoders(configs(stall_bound_ms=60.0, stall_pricing=False))
    # age + T + the fastest (10-ms) decode step <= 60 ms: no 80-ms chunk while a decoder waits.
    assert served and 1024 not in chunks and gap < 80.0


def test_cached_reference_rates_follow_every_estimate_change_and_only_those():
    """The normalizers and decode costs are cached against the cost table's version: a new
    estimate must show at once, an observation that leaves the median unchanged must not
    bump the version, and the cached value always equals a fresh computation."""
    s = make(TABLE)
    before = s._normalizers()
    assert before.log_decode == pytest.approx(math.log(R_DECODE))
    version = s.costs.version
    s.costs.observe(decode(1), int(10.0 * MS), 0)  # the same sample: median unchanged
    assert s.costs.version == version and s._normalizers() is before
    s.costs.observe(decode(1), int(4.0 * MS), 0)  # median of (10, 10, 4) stays 10
    assert s.costs.version == version
    s.costs.observe(decode(1), int(4.0 * MS), 0)  # median of (10, 10, 4, 4) is 7 ms: a faster decode
    assert s.costs.version > version
    assert s._normalizers().log_decode == pytest.approx(math.log(1 / 7.0))
    assert (1, 7.0) in s._decode_reference().costs
    fresh = reference_normalizers(
        [(sh.token_capacity, s.costs.estimate_ns(sh) / 1e6) for sh in s.shapes.prefill],
        [(sh.batch_capacity, s.costs.estimate_ns(sh) / 1e6) for sh in s.shapes.delivery])
    assert s._normalizers() == fresh

"""The deferred step (docs/scheduling-utility.md, section 4): a prefill, mixed or width-one decode graph
that leaves active decoders out is scored as the sequence of itself and the fastest measured step that
serves them."""

import dataclasses

import pytest

from helios.config import preset, study_preset
from helios.graphs import GraphKind
from helios.scheduler.policy import Deferred
from helios.scheduler.utility import deferred_rate_score, rate_score

from conftest import Driver, FixedCosts, configs, decode, make, prefill, preset_configs, shift_log_x, spec
from mixed_helpers import small_mixed_catalog


def test_the_score_is_the_rate_of_the_sequence():
    # value 100 with a served age slope of 2 over T = 10 ms, then a 5-ms step for decoders worth 30 whose
    # age slope (1) runs to the step's end; the waiting cost (0.5 per ms) over all 15 ms.
    got = deferred_rate_score(100.0, 2.0, 10.0, 0.5, 30.0, 1.0, 5.0)
    assert got == pytest.approx((100 + 2 * 10 + 30 + 1 * 15) / 15 - 0.5 * 15 * 0.5)
    assert deferred_rate_score(100.0, 2.0, 10.0, 0.5, 30.0, 1.0, None) == rate_score(100.0, 2.0, 10.0, 0.5)


def test_a_candidate_that_serves_every_decoder_or_has_no_measured_step_keeps_the_plain_score():
    steps = (None, 4.0, 5.0, 6.0)
    d = Deferred(value=30.0, count=3, slope=1.0, steps=steps)
    plain = rate_score(100.0, 2.0, 10.0, 0.5)
    assert d.score(100.0, 2.0, 10.0, 0.5, served=3, served_value=30.0) == plain
    # Two of three served: the third (worth 30 - 18) waits for steps[1].
    assert d.score(100.0, 2.0, 10.0, 0.5, served=2, served_value=18.0) == pytest.approx(
        deferred_rate_score(100.0, 2.0, 10.0, 0.5, 12.0, 1.0, 4.0))
    unmeasured = dataclasses.replace(d, steps=(None,) * 4)
    assert unmeasured.score(100.0, 2.0, 10.0, 0.5, served=0, served_value=0.0) == plain


def _first_chunk(policy):
    # A prefill graph of a 1024-token chunk takes 26.5 ms, the same chunk with the four streams (B=8)
    # 27.3 ms, and their own step 6.4 ms: leaving them out saves 0.8 ms now and costs 6.4 ms later.
    table = small_mixed_catalog()
    s = make(table, policy=policy)
    d = Driver(s, FixedCosts(table))
    streams = [s.admit(spec(prompt=64, out=120), 0) for _ in range(4)]
    d.run(8)
    assert all(s.request_row(h).phase.name == "DECODE" for h in streams)
    long = s.admit(spec(prompt=6000, out=4), s.now_ns)
    while True:
        plan = d.run_one()
        if long in plan.handles:
            return plan, streams


def test_a_long_prompt_rides_with_the_decoders_instead_of_deferring_them():
    plan, streams = _first_chunk(preset_configs("balanced"))
    assert plan.shape.kind is GraphKind.MIXED and set(streams) <= set(plan.handles)
    # The same decision without the deferred step: the fresh prompt's price buys a chunk alone, and the
    # four streams need a decode graph of their own afterwards (the behaviour before this rule).
    plan, streams = _first_chunk((preset("balanced"), dataclasses.replace(study_preset("balanced"), deferred_step_pricing=False)))
    assert plan.shape.kind is GraphKind.PREFILL and not set(streams) & set(plan.handles)


def _starved_stream_step(policy):
    # Four streams, one of them priced e^5 above the others (it waited): a 1-row graph takes 5 ms and
    # the 4-row graph 8 ms. Alone, the starved stream's value per ms is the best rate (148 / 5 > 151 / 8);
    # with the step the other three still need, the 1-row graph is 151 over 5 + 8 ms.
    table = {decode(1): 5.0, decode(4): 8.0, prefill(64, 4): 9.0}
    s = make(table, policy=policy)
    d = Driver(s, FixedCosts(table))
    streams = [s.admit(spec(prompt=1, out=50), 0) for _ in range(4)]
    while not all(s.request_row(h).phase.name == "DECODE" for h in streams):
        d.run_one()
    shift_log_x(s, streams[0], -5.0)
    return s.plan(), streams


def test_a_starved_stream_rides_the_full_batch_instead_of_a_graph_of_its_own():
    plan, streams = _starved_stream_step(configs())
    assert plan.shape == decode(4) and set(plan.handles) == set(streams)
    plan, streams = _starved_stream_step(configs(deferred_step_pricing=False))
    assert plan.shape == decode(1) and plan.handles == (streams[0],)

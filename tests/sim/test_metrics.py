"""Metrics on hand-built request logs: percentiles, gaps, Jain, SLO attainment, goodput sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helios.scheduler.plan import FinishReason
from helios.sim.loop import RequestLog
from helios.sim.metrics import (SLO, RunMetrics, backlogged_jain, compute_metrics, goodput_sweep, jain_index,
                                meets_slo, percentile, request_gaps_ms, slo_attainment)

MS = 1_000_000
S = 1_000_000_000


def log(arrival_ms: float, pubs_ms, *, client="a", prompt=10, tokens=1, finished=True, prefills=()) -> RequestLog:
    """A finished request that published `tokens` tokens at each of `pubs_ms` (absolute times, ms)."""
    pubs = [(int(t * MS), tokens) for t in pubs_ms]
    done = pubs[-1][0] if (finished and pubs) else None
    return RequestLog(int(arrival_ms * MS), client, prompt, pubs, [(int(t * MS), n) for t, n in prefills],
                      FinishReason.EOS if done is not None else None, done)


def test_percentiles_are_linear_interpolation():
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert math.isnan(percentile([], 50))


def test_ttft_gap_and_e2e_percentiles_from_logs():
    # TTFTs 1..100 ms; each request then publishes twice more, 10 ms and 30 ms later.
    logs = [log(0, [t, t + 10, t + 40]) for t in range(1, 101)]
    m = compute_metrics(logs, SLO(ttft_ms=1e9, gap_ms=1e9))
    assert m.ttft_p50_ms == pytest.approx(50.5) and m.ttft_p99_ms == pytest.approx(99.01)
    assert m.gap_p50_ms == pytest.approx(20.0)  # gaps: 100 x 10 ms and 100 x 30 ms
    assert m.gap_p99_ms == pytest.approx(30.0)
    assert m.e2e_p50_ms == pytest.approx(90.5) and m.requests == m.finished == 100
    np.testing.assert_allclose(request_gaps_ms(logs[0]), [10.0, 30.0])


def test_throughput_over_the_makespan():
    logs = [log(0, [100, 200], tokens=5, prefills=[(50, 10)]), log(500, [1000], tokens=10, prefills=[(900, 30)])]
    m = compute_metrics(logs, SLO(1e9, 1e9), arrival_window_ns=2 * S)
    assert m.makespan_s == pytest.approx(1.0)  # first arrival 0 ms, last event 1000 ms
    assert m.output_tok_s == pytest.approx(20.0)  # 5 + 5 + 10 output tokens in 1 s
    assert m.total_tok_s == pytest.approx(60.0)  # plus 40 prompt tokens
    assert m.offered_rate == pytest.approx(1.0)  # 2 requests over the 2-s arrival window


def test_jain_index_of_equal_and_unequal_shares():
    assert jain_index([3, 3, 3, 3]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)  # one takes all: 1/n
    assert jain_index([1, 2, 3]) == pytest.approx(36 / 42)
    assert jain_index([0, 0]) == 1.0 and math.isnan(jain_index([]))


def _waiting(client, arrival_ms, first_ms, prompt, outputs_after=()):
    """A request that waits from arrival to `first_ms`, when its whole prompt and first token complete."""
    return log(arrival_ms, [first_ms, *outputs_after], client=client, prompt=prompt,
               prefills=[(first_ms, prompt)])


def test_backlogged_jain_equal_and_unequal_service():
    equal = [_waiting("a", 0, 10_000, 500), _waiting("b", 0, 10_000, 500)]
    assert backlogged_jain(equal) == pytest.approx(1.0)
    # 1501 vs 501 tokens (prompt + first token) over the same 10-s backlog.
    unequal = [_waiting("a", 0, 10_000, 1500), _waiting("b", 0, 10_000, 500)]
    assert backlogged_jain(unequal) == pytest.approx(jain_index([1501, 501]))
    assert backlogged_jain([_waiting("a", 0, 10_000, 500)]) is None  # one client: undefined


def test_backlogged_jain_uses_service_rates_within_the_backlog():
    # b waits a tenth as long for a tenth of the tokens: the same rate, so perfectly fair.
    same_rate = [_waiting("a", 0, 10_000, 999), _waiting("b", 0, 1_000, 99)]
    assert backlogged_jain(same_rate) == pytest.approx(1.0)
    # Tokens after the backlog ends do not count; tokens of a's other (decoding) request during it do.
    after = [_waiting("a", 0, 10_000, 999), _waiting("b", 0, 1_000, 99, outputs_after=range(1_100, 5_000, 10))]
    assert backlogged_jain(after) == pytest.approx(1.0)
    decoding = log(0, list(range(100, 10_001, 100)), client="a")  # publishes 100 tokens while a waits
    decoding.publications[0] = (0 + 1, 1)  # its own wait is a single nanosecond
    with_decode = after + [decoding]
    assert backlogged_jain(with_decode) == pytest.approx(jain_index([1100 / 10, 100 / 1]), rel=1e-3)


def test_slo_attainment():
    slo = SLO(ttft_ms=100, gap_ms=50)
    ok = log(0, [80, 120, 160])  # TTFT 80, gaps 40, 40
    slow_start = log(0, [150, 160])  # TTFT 150
    stall = log(0, [10] + list(range(20, 60, 10)) + [200])  # one 150 ms gap: its p99 is above 50
    unfinished = log(0, [10, 20], finished=False)
    single = log(0, [90])  # one token: no gaps, only TTFT counts
    assert [meets_slo(x, slo) for x in (ok, slow_start, stall, unfinished, single)] == [True, False, False,
                                                                                        False, True]
    assert slo_attainment([ok, slow_start, stall, unfinished, single], slo) == pytest.approx(0.4)
    never = RequestLog(0, "a", 10)
    assert not meets_slo(never, slo)


def test_gap_quantile_of_the_slo_is_per_request():
    # 200 gaps of 10 ms and one of 100 ms: the p99 stays under 50 ms, the max does not.
    pubs = [10 * i for i in range(1, 202)] + [2110]
    r = log(0, pubs)
    assert meets_slo(r, SLO(ttft_ms=100, gap_ms=50))
    assert not meets_slo(r, SLO(ttft_ms=100, gap_ms=50, gap_quantile=1.0))


def _fake(attainment_of):
    calls = []

    def run(scale):
        calls.append(scale)
        a = attainment_of(scale)
        return RunMetrics(10, 10, 1.0, 10.0 * scale, 0, 0, 0, 0, 0, 0, 0, 0, None, a)
    return run, calls


def test_goodput_sweep_brackets_and_bisects():
    run, calls = _fake(lambda s: 1.0 - s / 10)  # attainment >= 0.9 up to scale 1
    g = goodput_sweep(run, [0.5, 1, 2, 4], target=0.9, refine=2)
    assert calls[:3] == [0.5, 1, 2]  # stops at the first failing grid point
    assert calls[3] == pytest.approx(math.sqrt(2)) and calls[4] == pytest.approx(2 ** 0.25)
    assert g.status == "bracketed" and g.scale == 1 and g.goodput == pytest.approx(10.0)
    run, _ = _fake(lambda s: 1.0 - s / 20)  # passes up to 2: the first midpoint sqrt(2) * ... passes
    g = goodput_sweep(run, [0.5, 1, 4], target=0.9, refine=1)
    assert g.scale == pytest.approx(2.0) and g.goodput == pytest.approx(20.0)


def test_goodput_sweep_edges():
    run, calls = _fake(lambda s: 1.0)
    g = goodput_sweep(run, [1, 2], refine=3)
    assert g.status == "at-least" and g.goodput == pytest.approx(20.0) and calls == [1, 2]
    run, calls = _fake(lambda s: 0.5)
    g = goodput_sweep(run, [1, 2], extend_down=2)
    assert g.status == "below" and g.goodput == 0.0 and calls == [1, 0.5, 0.25]
    run, calls = _fake(lambda s: 1.0 if s <= 0.5 else 0.0)
    g = goodput_sweep(run, [1, 2], extend_down=2, refine=0)
    assert g.status == "bracketed" and g.scale == 0.5 and calls == [1, 0.5]

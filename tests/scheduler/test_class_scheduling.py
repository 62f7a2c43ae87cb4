"""Service classes through the real scheduler (issue 40; docs/scheduling-utility.md, "Service classes and
tenants"): a request's class changes its prices, not its queue. Its weight multiplies f and g, and its
prompt phase and stream phase keep their own adaptation times (RequestTable's tau_ms column)."""

from __future__ import annotations

import math

import pytest

from helios.config import SchedulerConfig, preset, study_preset
from helios.scheduler.class_prices import class_prices
from helios.scheduler.service_class import BUILTIN_CLASSES, DEFAULT_CLASS, ServiceClass

from conftest import MS, Driver, FixedCosts, decode, make, prefill, spec

BALANCED = (preset("balanced"), study_preset("balanced"))
TABLE = {decode(1): 10.0, decode(2): 11.0, prefill(64): 8.0}
INTERACTIVE = next(c for c in BUILTIN_CLASSES if c.name == "interactive")


def _fair_log_price(s, h) -> float:
    """log(w f / x) of `h` from its table row: the price that grows while it waits."""
    t, r = s.requests, s.requests.row(h)
    return s.coeff.log_f + float(t.log_w[r]) - float(t.log_x[r])


def _backlog(classes, weight_scale=1.0):
    """One slot, held by a default-class decoder with a long output; one waiting prompt per class,
    admitted at t = 0 without a slot (backlogged: no candidate can serve them)."""
    s = make(TABLE, policy=BALANCED, config=SchedulerConfig(request_slots=1))
    d = Driver(s, FixedCosts(TABLE))
    s.admit(spec(prompt=64, out=2000), 0)
    d.run(2)  # the decoder holds the only slot
    now = s.now_ns
    waiting = [s.admit(spec(prompt=64, out=8, service_class=ServiceClass(
        c.name, c.ttft_ms, c.ttft_per_token_ms, c.gap_ms, c.deadline_ms, c.weight * weight_scale, c.priority)), now)
        for c in classes]
    return s, d, waiting


def test_the_default_class_takes_the_policys_scalar_path():
    """Rule: with every request in the default class, nothing of the class columns is read (the same
    arithmetic as before classes, which bench/determinism.py checks on whole traces)."""
    s = make(TABLE, policy=BALANCED)
    h = s.admit(spec(prompt=64, out=8), 0)
    assert s.requests.class_rows == 0
    assert s.requests.log_weights(s.requests.live_rows()) is None
    assert s.requests.taus(s.requests.live_rows(), 50.0) == 50.0
    k = s.admit(spec(prompt=64, out=8, service_class=INTERACTIVE), 0)
    assert s.requests.class_rows == 1
    s.cancel(k, 0)
    Driver(s, FixedCosts(TABLE)).run(3)
    assert s.requests.class_rows == 0 and h in s.requests


@pytest.mark.parametrize("cls", [c for c in BUILTIN_CLASSES], ids=lambda c: c.name)
def test_a_backlogged_price_grows_without_bound_in_every_class(cls):
    """Rule: while a request of any positive-weight class (the lowest, batch, included) is backlogged,
    its price grows by W / tau_wait of its class: linearly in log, so past any level."""
    s, d, (h,) = _backlog([cls])
    prices = class_prices(cls, s.policy, 64, 8)
    start, before = s.now_ns, _fair_log_price(s, h)
    levels = []
    for _ in range(4):
        d.run(20)
        assert s.requests.row(h) is not None and s.requests[h].slot is None  # still backlogged
        levels.append(_fair_log_price(s, h))
        waited = (s.now_ns - start) / MS
        assert levels[-1] - before == pytest.approx(waited / prices.wait_tau_ms, rel=1e-9)
    assert all(b > a for a, b in zip([before] + levels, levels))  # strictly growing, at a constant slope


def test_equal_histories_in_one_class_give_equal_prices_and_the_class_sets_the_growth():
    """Rule: two requests of one class with the same history have the same price; a class with a
    tighter first-token target (interactive) grows faster than the policy's (default)."""
    s, d, (a, b, c) = _backlog([INTERACTIVE, INTERACTIVE, DEFAULT_CLASS])
    first = [_fair_log_price(s, h) for h in (a, b, c)]
    d.run(30)
    last = [_fair_log_price(s, h) for h in (a, b, c)]
    assert first[0] == first[1] and last[0] == last[1]
    assert last[0] - first[0] > last[2] - first[2] > 0


def test_every_weight_scaled_together_shifts_every_price_by_one_factor():
    """Rule (invariance under the shared scale): every class weight times k moves every request's
    log price by log k and nothing else, so the order of prices, and the decisions, are the same."""
    classes = [c for c in BUILTIN_CLASSES]
    s1, d1, h1 = _backlog(classes)
    s2, d2, h2 = _backlog(classes, weight_scale=8.0)
    d1.run(25)
    d2.run(25)
    assert [p.lanes.handle.tolist() for p, *_ in d1.history] == [p.lanes.handle.tolist() for p, *_ in d2.history]
    for a, b in zip(h1, h2):
        assert _fair_log_price(s2, b) - _fair_log_price(s1, a) == pytest.approx(math.log(8.0), abs=1e-9)


def _two_prompts(classes: bool):
    """A batch prompt admitted first, an interactive one 30 ms later; the catalog's one prefill graph
    takes a single prompt, so the first plan serves one of them."""
    s = make(TABLE, policy=BALANCED)
    batch = ServiceClass("batch", deadline_ms=6000.0, weight=0.25) if classes else DEFAULT_CLASS
    first = s.admit(spec(prompt=64, out=4, service_class=batch), 0)
    second = s.admit(spec(prompt=64, out=4, service_class=INTERACTIVE if classes else DEFAULT_CLASS), 30 * MS)
    return s, first, second


def test_an_interactive_prompt_overtakes_an_earlier_batch_prompt_because_of_its_class():
    s, batch, interactive = _two_prompts(classes=True)
    assert s.plan().lanes.handle.tolist() == [interactive]
    # The same arrivals with no classes: the earlier prompt goes first (ties keep admission order).
    s, batch, interactive = _two_prompts(classes=False)
    assert s.plan().lanes.handle.tolist() == [batch]


def test_a_batch_request_is_served_under_a_continuous_interactive_stream():
    """No starvation: an interactive prompt arrives every other frame; the batch prompt's price grows as e^(W / tau_wait) and
    it is served within bounded time. (Under sustained overload of a tighter class the one waiting
    longest in units of its own target goes first: then the batch request waits until its wait, as a
    fraction of its target, passes theirs.)"""
    s = make(TABLE, policy=BALANCED)
    d = Driver(s, FixedCosts(TABLE))
    batch = s.admit(spec(prompt=64, out=2, service_class=ServiceClass("batch", deadline_ms=6000.0, weight=0.25)), 0)
    s.admit(spec(prompt=64, out=2, service_class=INTERACTIVE), 0)
    s.admit(spec(prompt=64, out=2, service_class=INTERACTIVE), 0)
    served_at = None
    for frame in range(300):
        if frame % 2 == 0:
            s.admit(spec(prompt=64, out=2, service_class=INTERACTIVE), s.now_ns)
        plan = d.run_one()
        if batch in plan.lanes.handle.tolist() and plan.lanes.prompt_tokens[plan.lanes.handle == batch].sum():
            served_at = frame
            break
    assert served_at is not None and served_at > 0  # overtaken at first, then served
    first_prompts = [p.lanes.handle.tolist() for p, *_ in d.history[:2]]
    assert batch not in sum(first_prompts, [])  # the interactive prompts admitted with it went first


@pytest.mark.parametrize("cls", [INTERACTIVE, DEFAULT_CLASS], ids=lambda c: c.name)
def test_a_prompt_chunk_is_no_service_for_a_class_with_a_first_token_target(cls):
    """Rule: a class with a first-token target counts only output in its prompt phase (a chunk delivers
    nothing the target measures), so its price grows by d/tau_wait through every chunk; the default
    class keeps the policy's law, where a chunk is service and holds the price down."""
    s = make(TABLE, policy=BALANCED)
    d = Driver(s, FixedCosts(TABLE))
    h = s.admit(spec(prompt=256, out=4, service_class=cls), 0)
    tau = class_prices(cls, s.policy, 256, 4).wait_tau_ms
    before = _fair_log_price(s, h)
    plan = d.run_one()
    assert plan.lanes.handle.tolist() == [h] and int(plan.lanes.prompt_tokens[0]) == 64  # one chunk of four
    grew = _fair_log_price(s, h) - before
    ms = (d.history[-1][2] - d.history[-1][1]) / MS
    if cls is DEFAULT_CLASS:
        assert grew < ms / tau - 0.1  # served: far below an unserved prompt's growth
    else:
        assert grew == pytest.approx(ms / tau, rel=1e-9)

"""The per-class window of the mean-rate law (issue 40; docs/scheduling-utility.md, "Service classes and
tenants"): on a mean law a request's starting rate counts as one prompt-phase adaptation time of its
own class, so a backlogged prompt's price grows as 1 + W / tau_wait; hand-stepped."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from helios.config import SchedulerConfig, preset, study_preset
from helios.scheduler.class_prices import class_prices
from helios.scheduler.service_class import BUILTIN_CLASSES, DEFAULT_CLASS

from conftest import MS, Driver, FixedCosts, decode, make, prefill, spec

TABLE = {decode(1): 10.0, decode(2): 11.0, prefill(64): 8.0}


@pytest.mark.parametrize("law", ["first_output", "prompt_phase"])
@pytest.mark.parametrize("cls", BUILTIN_CLASSES, ids=lambda c: c.name)
def test_a_backlogged_prompt_grows_as_one_plus_its_wait_over_its_class_tau(cls, law):
    """Rule: the window starts at tau_wait = D / K_wait (the policy's tau for the default class), so
    x = x0 tau_wait / (tau_wait + W) and log price - log start price = log(1 + W / tau_wait)."""
    policy = (preset("balanced"), replace(study_preset("balanced"), prompt_rate_law=law))
    s = make(TABLE, policy=policy, config=SchedulerConfig(request_slots=1))
    d = Driver(s, FixedCosts(TABLE))
    s.admit(spec(prompt=64, out=2000), 0)
    d.run(2)  # a default-class decoder holds the only slot: the prompt below stays unserved
    start = s.now_ns
    h = s.admit(spec(prompt=64, out=8, service_class=cls), start)
    t, row = s.requests, s.requests.row(h)
    tau = class_prices(cls, s.policy, 64, 8).wait_tau_ms
    assert t.rate_window_ms[row] == tau
    assert (tau == s.policy.adaptation_ms) == (cls is DEFAULT_CLASS or not cls.has_targets)
    x0 = float(t.log_x[row])
    for _ in range(3):
        d.run(15)
        waited = (s.now_ns - start) / MS
        assert s.requests[h].slot is None
        assert x0 - float(t.log_x[t.row(h)]) == pytest.approx(math.log1p(waited / tau), rel=1e-9)

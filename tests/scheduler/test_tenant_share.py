"""The tenant's 1/n share through the real scheduler (issue 40; docs/scheduling-utility.md, "Service
classes and tenants"): a named tenant's classed requests share its weight, w_i = w_class W / n, with n
its live classed requests; hand-stepped on the virtual clock."""

from __future__ import annotations

import math

import pytest

from helios.config import SchedulerConfig, preset, study_preset
from helios.scheduler.service_class import BUILTIN_CLASSES, DEFAULT_CLASS

from conftest import Driver, FixedCosts, decode, make, prefill, spec

BALANCED = (preset("balanced"), study_preset("balanced"))
TABLE = {decode(1): 10.0, decode(2): 11.0, prefill(64): 8.0}
INTERACTIVE = next(c for c in BUILTIN_CLASSES if c.name == "interactive")  # weight 4


def _log_w(s, h) -> float:
    return float(s.requests.log_w[s.requests.row(h)])


def test_a_tenants_weight_is_shared_by_its_live_classed_requests():
    """Rule: w_i = w_class * W / n. Three interactive requests of tenant acme (W = 2) get 4 * 2 / 3 each;
    when one is done the other two get 4 * 2 / 2; an anonymous request (no `user`) and a default-class
    request of the same tenant take no part (n = 1 and weight one)."""
    s = make(TABLE, policy=BALANCED)
    acme = [s.admit(spec(prompt=64, out=4, client="acme", tenant_weight=2.0, service_class=INTERACTIVE), 0)
            for _ in range(3)]
    anonymous = s.admit(spec(prompt=64, out=4, service_class=INTERACTIVE), 0)
    plain = s.admit(spec(prompt=64, out=4, client="acme"), 0)
    assert [_log_w(s, h) for h in acme] == pytest.approx([math.log(4 * 2 / 3)] * 3, abs=1e-12)
    assert _log_w(s, anonymous) == pytest.approx(math.log(4))
    assert _log_w(s, plain) == 0.0 and not s.requests.priced[s.requests.row(plain)]
    s.cancel(acme[0], 0)
    assert [_log_w(s, h) for h in acme[1:]] == pytest.approx([math.log(4 * 2 / 2)] * 2, abs=1e-12)
    Driver(s, FixedCosts(TABLE)).run(200)  # everything finishes: no tenant is left with a share
    assert s.requests.shares.rows == {} and s.requests.shares.tenant_of == {}


def test_a_tenant_gains_nothing_by_splitting_its_work_into_more_requests():
    """Rule (tenant-level proportional fairness): tenant b's three waiting prompts together weigh what
    tenant a's one does, so with equal histories a's one prompt has 3x the price of each of b's, and
    when the only slot frees it is served first although b's prompts were admitted earlier. The same
    arrivals without tenants (anonymous requests) are served in admission order."""
    for named in (True, False):
        s = make(TABLE, policy=BALANCED, config=SchedulerConfig(request_slots=1))
        d = Driver(s, FixedCosts(TABLE))
        s.admit(spec(prompt=64, out=3, service_class=DEFAULT_CLASS), 0)
        d.run(1)  # the decoder holds the only slot until it finishes
        now = s.now_ns
        b = [s.admit(spec(prompt=64, out=2, client="b" if named else "default", service_class=INTERACTIVE), now)
             for _ in range(3)]
        a = s.admit(spec(prompt=64, out=2, client="a" if named else "default", service_class=INTERACTIVE), now)
        t = s.requests
        shares = [math.exp(_log_w(s, h)) for h in b]
        if named:
            assert sum(shares) == pytest.approx(math.exp(_log_w(s, a)))  # equal tenants, equal total weight
        gap = (float(t.log_w[t.row(a)] - t.log_x[t.row(a)]) - float(t.log_w[t.row(b[0])] - t.log_x[t.row(b[0])]))
        assert gap == pytest.approx(math.log(3) if named else 0.0, abs=1e-9)
        first = next(p for p in d.run(20) if int(p.lanes.prompt_tokens.sum()) > 0)
        assert first.lanes.handle.tolist() == ([a] if named else [b[0]])

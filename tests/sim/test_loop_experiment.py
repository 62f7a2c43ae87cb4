"""The workload runner: determinism, warm-up, service logging, trace rescaling and tick spreading."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from helios.scheduler.plan import SelectionReason
from helios.sim.experiment import Setup, build_scheduler, default_slo, nominal_load, run_trace, warm_up, load_cost_model
from helios.sim.traces import TraceRequest
from helios.sim.workload import load_workload, rescale, spread_ticks

SETUP = Setup(request_slots=16)
WINDOW = 8.0  # seconds of the Azure trace: ~10 requests


def _run(seed: int, **kw):
    return run_trace("helios-balanced", "azure", window_s=WINDOW, scale=1.0, setup=SETUP, seed=seed,
                     progress=False, **kw)


def test_same_seed_gives_identical_metrics():
    a, b = _run(3), _run(3)
    assert a.metrics == b.metrics
    assert [(s.label, s.start_ns, s.measured_ns) for s in a.sim.steps] == \
           [(s.label, s.start_ns, s.measured_ns) for s in b.sim.steps]
    c = _run(4)  # the seed drives SimCore's timing noise
    assert c.metrics != a.metrics


def test_every_request_finishes_and_prompt_service_is_logged():
    r = _run(0)
    logs = list(r.sim.logs.values())
    base = load_workload("azure", WINDOW)
    assert len(logs) == len(base) == r.metrics.requests == r.metrics.finished
    for log, req in zip(sorted(logs, key=lambda x: x.arrival_ns), base):
        assert sum(n for _, n in log.prefills) == log.prompt_tokens == req.prompt_tokens
        assert log.output_tokens == req.output_tokens  # EOS at the trace's output length
    assert 0 <= r.metrics.slo_attainment <= 1 and r.metrics.jain is None  # one client


def test_warm_up_measures_every_graph_so_nothing_is_discovered():
    r = _run(0)
    assert not any(t.reason is SelectionReason.DISCOVERY for t in r.sim.scheduler.traces)
    cold = run_trace("helios-balanced", "azure", window_s=WINDOW, scale=1.0, progress=False,
                     setup=dataclasses.replace(SETUP, warmup=False))
    assert any(t.reason is SelectionReason.DISCOVERY for t in cold.sim.scheduler.traces)


@pytest.mark.parametrize("name", ["helios-balanced", "helios-throughput", "vllm-fcfs", "sarathi", "vtc", "direct"])
def test_every_named_scheduler_warms_up(name):
    catalog = SETUP.catalog()
    try:
        sched = build_scheduler(name, catalog, SETUP.config())
    except ImportError:
        pytest.skip("baselines not available")
    warm_up(sched, catalog, load_cost_model(SETUP.cost_model), 1024)
    assert all(sched.costs.estimate_ns(shape) for shape in catalog)


def test_rescale_and_nominal_load_are_proportional():
    base = load_workload("azure", WINDOW)
    fast = rescale(base, 2.0)
    assert [r.arrival_ns for r in fast] == [round(r.arrival_ns / 2) for r in base]
    window = int(WINDOW * 1e9)
    assert nominal_load(base, window // 2, SETUP) == pytest.approx(2 * nominal_load(base, window, SETUP))
    slo = default_slo(base, SETUP)
    assert slo.ttft_ms > 0 and slo.gap_ms > 0 and slo.gap_quantile == 0.99


def test_spread_ticks_keeps_order_within_the_tick():
    reqs = [TraceRequest(0, 1, 1), TraceRequest(0, 2, 1), TraceRequest(0, 3, 1), TraceRequest(3000, 4, 1),
            TraceRequest(3000, 5, 1)]
    out = spread_ticks(reqs, tick_ns=3000)
    assert [r.arrival_ns for r in out] == [0, 1000, 2000, 3000, 4500]
    assert [r.prompt_tokens for r in out] == [1, 2, 3, 4, 5]
    mooncake = load_workload("mooncake", 12.0)
    assert len({r.arrival_ns for r in mooncake}) == len(mooncake)


def test_variants_set_policy_and_study_fields_on_their_preset():
    """`flare sim --scheduler 'helios-balanced[key=value]'` keeps every study switch (StudyConfig) and
    coefficient (PolicyConfig) one name away; helios-spec-table is the spec's table as written."""
    from helios.config import PolicyConfig, StudyConfig, preset
    from helios.errors import ConfigError

    catalog = SETUP.catalog()
    sched = build_scheduler("helios-balanced[stall_pricing=0,adaptation_ms=100,prompt_rate_law=output_ewma]",
                            catalog, SETUP.config())
    assert sched.policy == replace(PolicyConfig(), adaptation_ms=100.0)
    assert sched.study == replace(StudyConfig(), stall_pricing=False, prompt_rate_law="output_ewma")
    plain = build_scheduler("helios-balanced", catalog, SETUP.config())
    assert (plain.policy, plain.study) == (PolicyConfig(), StudyConfig())
    table = build_scheduler("helios-spec-table[deferred_step_pricing=1]", catalog, SETUP.config())
    assert table.policy == preset("spec") and table.study == replace(StudyConfig.spec(), deferred_step_pricing=True)
    throughput = build_scheduler("helios-throughput", catalog, SETUP.config())
    assert throughput.policy == preset("throughput") and throughput.study == StudyConfig()
    with pytest.raises(ConfigError, match="StudyConfig"):
        build_scheduler("helios-balanced[no_such_switch=1]", catalog, SETUP.config())

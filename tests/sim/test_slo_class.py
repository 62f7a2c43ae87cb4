"""Single class, targets known (issue 40): `helios-balanced[default_class=slo]` runs Helios with a class
table whose default class carries the report's SLO as its targets; nothing else about the run changes."""

from __future__ import annotations

import pytest

from helios.config import PolicyConfig, StudyConfig
from helios.errors import ConfigError
from helios.scheduler.class_prices import GAP_ADAPTATIONS, WAIT_ADAPTATIONS, class_prices
from helios.sim.experiment import Setup, build_scheduler, default_slo, run_trace, split_variant, to_arrivals
from helios.sim.metrics import SLO
from helios.sim.slo_class import slo_table, with_default_class
from helios.sim.workload import load_workload

SETUP = Setup(request_slots=16)
SLO_CLASS = "helios-balanced[default_class=slo]"


def test_the_default_class_carries_the_slo_as_its_targets():
    slo = SLO(ttft_ms=1546.0, gap_ms=379.0)
    table = slo_table(slo)
    cls = table.service_class(None)  # a request that names no class
    assert (cls.ttft_ms, cls.gap_ms, cls.deadline_ms, cls.weight) == (1546.0, 379.0, None, 1.0)
    assert list(table.classes) == [table.default]  # one class: still a single-class workload
    prices = class_prices(cls, PolicyConfig(), prompt_tokens=500, max_output_tokens=100)
    assert prices.wait_tau_ms == pytest.approx(1546.0 / WAIT_ADAPTATIONS)
    assert prices.stream_tau_ms == pytest.approx(379.0 / GAP_ADAPTATIONS)
    assert prices.weight == 1.0 and prices.output_only
    arrivals = with_default_class(to_arrivals(load_workload("azure", 8.0)), table)
    assert arrivals and all(a.spec.service_class is cls for a in arrivals)


def test_the_variant_keeps_the_preset_and_only_helios_takes_it():
    catalog = SETUP.catalog()
    assert split_variant(SLO_CLASS) == ("helios-balanced", {"default_class": "slo"})
    sched = build_scheduler(SLO_CLASS, catalog, SETUP.config())
    assert (sched.policy, sched.study) == (PolicyConfig(), StudyConfig())
    with pytest.raises(ConfigError, match="default_class='tight'.*choose from slo"):
        split_variant("helios-balanced[default_class=tight]")
    with pytest.raises(ConfigError, match="Helios only"):
        build_scheduler("sarathi[default_class=slo]", catalog, SETUP.config())


def test_a_run_with_the_slo_class_is_priced_by_it():
    """The same trace, seed and SLO: the class's prices change decisions, so the runs differ."""
    base = load_workload("azure", 8.0)
    slo = default_slo(base, SETUP)
    plain = run_trace("helios-balanced", "azure", window_s=8.0, scale=3.0, setup=SETUP, slo=slo, progress=False)
    told = run_trace(SLO_CLASS, "azure", window_s=8.0, scale=3.0, setup=SETUP, slo=slo, progress=False)
    assert told.metrics.finished == plain.metrics.finished == len(base)
    assert [(s.label, s.start_ns) for s in told.sim.steps] != [(s.label, s.start_ns) for s in plain.sim.steps]

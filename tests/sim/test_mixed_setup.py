"""`--mixed-prefill` in the simulator: Helios gets the mixed catalog, the baselines never do."""

from __future__ import annotations

import pytest

from helios.graphs import GraphKind
from helios.sim.experiment import HELIOS_SCHEDULERS, SCHEDULERS, Setup, run_trace

MIXED_SETUP = Setup(request_slots=16, mixed_prefill=True)
WINDOW = 8.0  # seconds of the Azure trace: ~10 requests


@pytest.mark.parametrize("name", SCHEDULERS)
def test_only_helios_gets_the_mixed_catalog(name):
    helios = name in HELIOS_SCHEDULERS
    assert MIXED_SETUP.mixed_for(name) is helios
    assert not Setup().mixed_for(name)
    catalog = MIXED_SETUP.catalog(mixed=MIXED_SETUP.mixed_for(name))
    assert bool(catalog.of_kind(GraphKind.MIXED)) is helios


@pytest.mark.parametrize("name", ["helios-balanced", "sarathi"])
def test_a_mixed_run_finishes_every_request(name):
    r = run_trace(name, "azure", window_s=WINDOW, scale=1.0, setup=MIXED_SETUP, seed=0, progress=False)
    assert r.metrics.finished == r.metrics.requests > 0
    kinds = {t.shape.kind for t in r.sim.scheduler.traces}
    if name == "sarathi":
        assert GraphKind.MIXED not in kinds
    else:
        assert {s.kind for s in r.sim.scheduler.catalog} >= {GraphKind.MIXED}

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


def test_the_simulated_engine_prepares_the_fine_ladder_up_to_2048_prompt_tokens():
    from helios.errors import ConfigError
    from helios.prepare import prompt_buckets

    catalog = MIXED_SETUP.catalog(mixed=True)
    # Twelve buckets per factor of four up to 2,048; the prefill graphs keep 4,096.
    assert sorted({s.prefill_capacity for s in catalog.of_kind(GraphKind.MIXED)}) == list(prompt_buckets(2048, 12))
    assert max(s.token_capacity for s in catalog.of_kind(GraphKind.PREFILL)) == 4096
    coarse = Setup(request_slots=16, mixed_prefill=True, mixed_prompt_steps=3, mixed_prompt_capacity=None)
    mixed = coarse.catalog(mixed=True).of_kind(GraphKind.MIXED)
    assert sorted({s.prefill_capacity for s in mixed}) == list(prompt_buckets(4096))
    with pytest.raises(ConfigError, match="mixed_prompt_steps"):
        Setup(mixed_prompt_steps=0)
    with pytest.raises(ConfigError, match="mixed_prompt_capacity"):
        Setup(mixed_prompt_capacity=100)


@pytest.mark.parametrize("name", ["helios-balanced", "sarathi"])
def test_a_mixed_run_finishes_every_request(name):
    r = run_trace(name, "azure", window_s=WINDOW, scale=1.0, setup=MIXED_SETUP, seed=0, progress=False)
    assert r.metrics.finished == r.metrics.requests > 0
    kinds = {t.shape.kind for t in r.sim.scheduler.traces}
    if name == "sarathi":
        assert GraphKind.MIXED not in kinds
    else:
        assert {s.kind for s in r.sim.scheduler.catalog} >= {GraphKind.MIXED}


def test_a_bad_mixed_capacity_is_a_one_line_report_error(tmp_path, capsys):
    from helios.cli import main

    code = main(["sim", "report", "--quick", "--mixed-prefill", "--mixed-prompt-capacity", "100",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("flare sim report: mixed_prompt_capacity:") and err.count("\n") == 1
    assert not any(tmp_path.iterdir())
